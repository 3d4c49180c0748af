package redisstore

import (
	"encoding/json"
	"strings"

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
