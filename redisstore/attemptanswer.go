package redisstore

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/policyd/policyd/fleet"
	"github.com/policyd/policyd/policy"
)

// An attempt record's answer field ({T}:attempt:CALL) is the answer packed
// by appendAnswer:
//
//	off  size  field
//	0    1     version: answerPackedV1, or answerPackedV2 for an answer
//	           with a target (a fallback); never '{'
//	1    ...   fleet's packed answer (fleet.AppendAnswer: the numbers at
//	           fixed offsets, its retry flag at 1, then the strings)
//	last 1     degraded (0/1): decided in degraded mode
//
// It is the layout breakerstore's attempts record has from its offset 13
// (one codec, fleet's, for both engines), so the answer reads the same
// from either. The library reads the retry flag of a record without a
// verdict at its fixed offset (policyd.lua attempt_check: string.byte at
// 2) and otherwise passes the field on unread. Written by hand, as the
// bbolt record is: a replica encodes it with one append per field and no
// allocation beyond the buffer, and decodes it without reflection, where
// encoding/json spent most of a replay's decoding.
//
// A record written before (schema 1, and schema 2 before its release)
// holds policy.Answer's JSON; its first byte is '{', and decodeAnswer
// reads it as it did.
const (
	answerPackedV1 = 1
	answerPackedV2 = 2
)

// appendAnswer appends a, packed, to b.
func appendAnswer(b []byte, a *policy.Answer) []byte {
	version := byte(answerPackedV1)
	if a.Target != "" {
		version = answerPackedV2
	}
	b = append(b, version)
	b = fleet.AppendAnswer(b, a)
	degraded := byte(0)
	if a.Degraded {
		degraded = 1
	}
	return append(b, degraded)
}

// packAnswer is a packed, in a buffer of its own, as the library is
// given it.
func packAnswer(a *policy.Answer) []byte {
	return appendAnswer(make([]byte, 0, 2+fleet.AnswerLen(a)), a)
}

// decodeAnswer reads an attempt record's answer field v, packed or the
// JSON written before, into a; anything else is errDamagedAttempt.
func decodeAnswer(v string, a *policy.Answer) error {
	if strings.HasPrefix(v, "{") {
		*a = policy.Answer{}
		if json.Unmarshal([]byte(v), a) != nil {
			return errDamagedAttempt
		}
		return nil
	}
	if v == "" || (v[0] != answerPackedV1 && v[0] != answerPackedV2) {
		return errDamagedAttempt
	}
	rest, err := fleet.ReadAnswer(v[1:], a, v[0] == answerPackedV2)
	if err != nil || len(rest) != 1 || rest[0] > 1 {
		return errDamagedAttempt
	}
	a.Degraded, a.FlowControlled = rest[0] == 1, false
	return nil
}

// attemptFields are an attempt record's fields as the engine returns them
// (HGETALL, HMGET, policyd_nextdelay's replay), before decoding: present
// is false for no record.
type attemptFields struct {
	present                 bool
	attempt, expiry, answer string
	verdict                 string // "" for none
}

// attemptFieldsOf collects the fields of an attempt record from flat, a
// hash's field names and values in turn (HGETALL's reply); other fields
// are left out.
func attemptFieldsOf(flat []any) attemptFields {
	f := attemptFields{present: len(flat) > 0}
	for j := 0; j+1 < len(flat); j += 2 {
		v := toString(flat[j+1])
		switch toString(flat[j]) {
		case "attempt":
			f.attempt = v
		case "expiry":
			f.expiry = v
		case "answer":
			f.answer = v
		case "verdict":
			f.verdict = v
		}
	}
	return f
}

// decode is the one decoder of the record's layout (doc.go): f into
// fleet.Attempts, the zero value when there is no record, a field that
// does not parse errDamagedAttempt.
func (f *attemptFields) decode() (fleet.Attempts, error) {
	if !f.present {
		return fleet.Attempts{}, nil
	}
	n, err1 := strconv.ParseUint(f.attempt, 10, 32)
	exp, err2 := strconv.ParseInt(f.expiry, 10, 64)
	if err1 != nil || err2 != nil {
		return fleet.Attempts{}, errDamagedAttempt
	}
	a := fleet.Attempts{Attempt: uint32(n), Expiry: exp * int64(time.Millisecond)}
	if err := decodeAnswer(f.answer, &a.Answer); err != nil {
		return fleet.Attempts{}, err
	}
	if f.verdict != "" {
		if err := applyVerdict(&a.Answer, f.verdict); err != nil {
			return fleet.Attempts{}, err
		}
	}
	return a, nil
}
