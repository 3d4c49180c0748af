package auditsink

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/policyd/policyd/policy"
)

// Genesis is the prev of the first line of a chain: 64 zeros.
const Genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// line is the JSON form of one audit record; the field order is the
// format's.
type line struct {
	Prev           string `json:"prev"`
	Time           string `json:"time"`
	Seq            uint64 `json:"seq,omitempty"`
	Event          string `json:"event"`
	Tenant         string `json:"tenant"`
	Target         string `json:"target"`
	CallID         string `json:"call_id,omitempty"`
	RunID          string `json:"run_id,omitempty"`
	Attempt        uint32 `json:"attempt,omitempty"`
	Classification string `json:"classification,omitempty"`
	Decision       string `json:"decision,omitempty"`
	DelayNs        int64  `json:"delay_ns,omitempty"`
	Stop           string `json:"stop,omitempty"`
	Disposition    string `json:"disposition,omitempty"`
	Detail         string `json:"detail,omitempty"`
}

// names maps an enum's names back to its values; the first value of a name
// wins, so the names String gives unknown values map to the zero value.
type names[T ~uint8] map[string]T

func namesOf[T interface {
	~uint8
	String() string
}]() names[T] {
	m := names[T]{}
	for v := range 256 {
		if n := T(v).String(); m[n] == 0 && (v == 0 || n != T(0).String()) {
			m[n] = T(v)
		}
	}
	return m
}

var (
	eventNames       = namesOf[policy.AuditEvent]()
	verdictNames     = namesOf[policy.Verdict]()
	stopNames        = namesOf[policy.StopReason]()
	dispositionNames = namesOf[policy.Disposition]()
)

// name returns v's name, or "" for the zero value.
func name[T interface {
	~uint8
	String() string
}](v T) string {
	if v == 0 {
		return ""
	}
	return v.String()
}

// parse returns the value of name s, the zero value for "".
func (m names[T]) parse(field, s string) (T, error) {
	if s == "" {
		return 0, nil
	}
	v, ok := m[s]
	if !ok || v == 0 {
		return 0, fmt.Errorf("%s: unknown value %q", field, s)
	}
	return v, nil
}

// Encode returns rec as one line (without its "\n") chained from prev, the
// hash of the line before (Genesis for the first).
func Encode(rec policy.AuditRecord, prev string) []byte {
	b, err := json.Marshal(line{
		Prev: prev, Time: rec.Time.UTC().Format(time.RFC3339Nano), Seq: rec.Seq, Event: rec.Event.String(),
		Tenant: rec.Tenant, Target: rec.Target, CallID: rec.CallID, RunID: rec.RunID, Attempt: rec.Attempt,
		Classification: rec.Classification, Decision: name(rec.Verdict), DelayNs: int64(rec.Delay),
		Stop: name(rec.Stop), Disposition: name(rec.Disposition), Detail: rec.Detail,
	})
	if err != nil {
		panic("auditsink: encoding a record: " + err.Error()) // strings and numbers always encode
	}
	return b
}

// Hash returns the SHA-256 of l, a line without its "\n", in lower-case
// hex: the next line's prev.
func Hash(l []byte) string {
	sum := sha256.Sum256(l)
	return hex.EncodeToString(sum[:])
}

// ParseLine parses one line (without its "\n") into its record and the
// prev it chains from. It is strict: one JSON object of the format's
// fields only, a prev of 64 lower-case hex digits, an RFC 3339 time and
// known enum names.
func ParseLine(b []byte) (rec policy.AuditRecord, prev string, err error) {
	var l line
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return rec, "", fmt.Errorf("not a JSON audit line: %w", err)
	}
	if b[0] != '{' || dec.InputOffset() != int64(len(b)) {
		return rec, "", errors.New("not a JSON audit line: data after the object")
	}
	if !isHash(l.Prev) {
		return rec, "", fmt.Errorf("prev: must be 64 lower-case hex digits, got %q", l.Prev)
	}
	t, err := time.Parse(time.RFC3339Nano, l.Time)
	if err != nil {
		return rec, "", fmt.Errorf("time: must be an RFC 3339 time, got %q", l.Time)
	}
	if l.DelayNs < 0 {
		return rec, "", fmt.Errorf("delay_ns: must be >= 0, got %d", l.DelayNs)
	}
	rec = policy.AuditRecord{
		Time: t, Seq: l.Seq, Tenant: l.Tenant, Target: l.Target, CallID: l.CallID, RunID: l.RunID,
		Attempt: l.Attempt, Classification: l.Classification, Delay: time.Duration(l.DelayNs), Detail: l.Detail,
	}
	if rec.Event, err = eventNames.parse("event", l.Event); err == nil && rec.Event == 0 {
		err = fmt.Errorf("event: unknown value %q", l.Event)
	}
	if err == nil {
		rec.Verdict, err = verdictNames.parse("decision", l.Decision)
	}
	if err == nil {
		rec.Stop, err = stopNames.parse("stop", l.Stop)
	}
	if err == nil {
		rec.Disposition, err = dispositionNames.parse("disposition", l.Disposition)
	}
	if err != nil {
		return policy.AuditRecord{}, "", err
	}
	return rec, l.Prev, nil
}

// isHash reports whether s is 64 lower-case hex digits.
func isHash(s string) bool {
	if len(s) != 2*sha256.Size {
		return false
	}
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Chain encodes records as a chain of lines, from Genesis. The zero Chain
// starts one. It is not safe for concurrent use.
type Chain struct {
	prev string
}

// Line returns rec's line, with its "\n", chained from the line before.
func (c *Chain) Line(rec policy.AuditRecord) []byte {
	if c.prev == "" {
		c.prev = Genesis
	}
	l := Encode(rec, c.prev)
	c.prev = Hash(l)
	return append(l, '\n')
}

// Head returns the hash of the last line, Genesis before the first.
func (c *Chain) Head() string {
	if c.prev == "" {
		return Genesis
	}
	return c.prev
}
