package fleet

import (
	"encoding/binary"
	"errors"
	"math"
	"time"

	"github.com/policyd/policyd/policy"
)

// The packed answer is a policy.Answer as the engines store it with a
// call's attempts (breakerstore's attempts record, from its offset 13;
// redisstore's attempt record, after its version byte): the numbers
// big-endian at fixed offsets, then the strings.
//
//	off  size  field
//	0    1     retry (0/1)
//	1    8     delay, ns
//	9    8     attempt timeout, ns
//	17   1     policy.StopReason
//	18   1     policy.Disposition
//	19   1     policy.Category
//	20   2     policy.Check bits
//	22   1     policy.BreakerState
//	23   8     tenant tokens, float64 bits
//	31   8     run retries remaining
//	39   8     the call's deadline, Unix ns (0: none)
//	47   2+n   classification reason (uint16 length, bytes)
//	...  2+n   pushback note (uint16 length, bytes)
//	...  2+n   only in an answer with a target: the target of the next
//	           attempt, a fallback (policy.Answer.Target)
//
// Whether the target is there is the record's to say (its version byte,
// before the answer), so a record of an answer without one reads as it
// did before targets existed. FlowControlled and Degraded are not part of
// it. Written by hand: it is the bbolt file's layout, which no encoding
// library reproduces, and a fixed offset lets the Redis library read the
// retry flag without decoding the rest.
const (
	// AnswerFixedLen is the length of a packed answer's numbers, before
	// its strings.
	AnswerFixedLen = 47
	// AnswerRetryOffset is the offset of a packed answer's retry flag.
	AnswerRetryOffset = 0
)

var (
	errAnswerShort  = errors.New("packed answer: shorter than its numbers")
	errAnswerRetry  = errors.New("packed answer: retry flag is not 0 or 1")
	errAnswerClass  = errors.New("packed answer: classification overruns the record")
	errAnswerNote   = errors.New("packed answer: pushback note overruns the record")
	errAnswerTarget = errors.New("packed answer: target overruns the record")
)

// AnswerLen is the length of a's packed answer.
func AnswerLen(a *policy.Answer) int {
	n := AnswerFixedLen + 4 + len(a.Class) + len(a.Note)
	if a.Target != "" {
		n += 2 + len(a.Target)
	}
	return n
}

// AppendAnswer appends a, packed, to v, with its target when it has one.
// It allocates only when v is too short.
func AppendAnswer(v []byte, a *policy.Answer) []byte {
	be := binary.BigEndian
	retry := byte(0)
	if a.Retry {
		retry = 1
	}
	v = append(v, retry)
	v = be.AppendUint64(v, uint64(a.Delay))
	v = be.AppendUint64(v, uint64(a.AttemptTimeout))
	v = append(v, byte(a.Stop), byte(a.Disposition), byte(a.Category))
	v = be.AppendUint16(v, uint16(a.Checks))
	v = append(v, byte(a.Breaker))
	v = be.AppendUint64(v, math.Float64bits(a.TenantTokens))
	v = be.AppendUint64(v, a.RunRemaining)
	v = be.AppendUint64(v, uint64(UnixNano(a.Deadline)))
	v = be.AppendUint16(v, uint16(len(a.Class)))
	v = append(v, a.Class...)
	v = be.AppendUint16(v, uint16(len(a.Note)))
	v = append(v, a.Note...)
	if a.Target != "" {
		v = be.AppendUint16(v, uint16(len(a.Target)))
		v = append(v, a.Target...)
	}
	return v
}

// ReadAnswer reads a packed answer off the front of v into a (its target
// too when target is set, as the record's version says) and returns the
// bytes after it; an answer cut short or with a retry flag other than 0
// or 1 is an error. It reads a string (a Redis reply) as it reads bytes,
// and its strings share v's memory when v is a string.
func ReadAnswer[B ~string | ~[]byte](v B, a *policy.Answer, target bool) (B, error) {
	if len(v) < AnswerFixedLen {
		return v, errAnswerShort
	}
	if v[0] > 1 {
		return v, errAnswerRetry
	}
	a.Retry = v[0] == 1
	a.Delay = time.Duration(be64(v[1:]))
	a.AttemptTimeout = time.Duration(be64(v[9:]))
	a.Stop, a.Disposition, a.Category = policy.StopReason(v[17]), policy.Disposition(v[18]), policy.Category(v[19])
	a.Checks = policy.Check(uint16(v[20])<<8 | uint16(v[21]))
	a.Breaker = policy.BreakerState(v[22])
	a.TenantTokens = math.Float64frombits(be64(v[23:]))
	a.RunRemaining = be64(v[31:])
	a.Deadline = time.Time{}
	if ns := int64(be64(v[39:])); ns != 0 {
		a.Deadline = time.Unix(0, ns)
	}
	rest := v[AnswerFixedLen:]
	var ok bool
	if a.Class, rest, ok = lenString(rest); !ok {
		return v, errAnswerClass
	}
	if a.Note, rest, ok = lenString(rest); !ok {
		return v, errAnswerNote
	}
	a.Target = ""
	if target {
		if a.Target, rest, ok = lenString(rest); !ok {
			return v, errAnswerTarget
		}
	}
	return rest, nil
}

// be64 is the big-endian uint64 at the front of b (at least 8 bytes).
func be64[B ~string | ~[]byte](b B) uint64 {
	_ = b[7]
	return uint64(b[0])<<56 | uint64(b[1])<<48 | uint64(b[2])<<40 | uint64(b[3])<<32 |
		uint64(b[4])<<24 | uint64(b[5])<<16 | uint64(b[6])<<8 | uint64(b[7])
}

// lenString reads a uint16-length-prefixed string off b.
func lenString[B ~string | ~[]byte](b B) (string, B, bool) {
	if len(b) < 2 {
		return "", b, false
	}
	n := int(b[0])<<8 | int(b[1])
	if len(b) < 2+n {
		return "", b, false
	}
	return string(b[2 : 2+n]), b[2+n:], true
}
