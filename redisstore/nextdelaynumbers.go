package redisstore

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/policyd/policyd/policy"
)

// The formats of policyd_nextdelay's packed numbers, as the library's
// struct.unpack reads them (policyd.lua ND_HEAD and ND_FRESH, which its
// test checks are these): little-endian, no padding, i8 a signed 64-bit
// integer, d a double, B a byte (0 or 1). The layout, in order:
//
//	head    attempt i8, n (results carried) i8
//	fresh   cfg: mode i8, consecutive failures i8, failure rate d,
//	        window µs i8, min calls i8, cool-down µs i8, half-open
//	        probes i8, probe timeout µs i8;
//	        result i8, the tenant's cap of breakers i8, the hint to
//	        share ns i8 (0: none);
//	        the stateless decision: retry B, delay ns i8, stop i8,
//	        disposition i8;
//	        the deadline µs i8 and ns past them i8 (0 0: none);
//	        the attempt timeout ns i8;
//	        pushback: spread ratio d, min spread ns i8, max hint ns i8;
//	        the spread draw d;
//	        budget: capacity d, deposit ratio d, floor per second d,
//	        retry cost d, timeout cost d, dry run B;
//	        timeout B, has run B;
//	        the run's cut-off µs i8 and ns past them i8 (0 0: none);
//	        cut binds B, the checks so far i8, keep (Unix ms) i8;
//	        the spend's shares: bucket version seen i8, run version
//	        seen i8, grace µs i8
//	tail    n results, a byte each
//
// Lua's numbers are doubles: every i8 is exact below 2^53. Times go as
// Unix µs and the ns past them; a duration in ns is exact up to 2^53 ns
// (104 days: a longer one rounds to a neighbouring ns in the library, as
// its decimal did before); versions and counts are far below. With no
// results carried the library reads the head first: a replay or a
// refusal reads nothing else.
const (
	nextDelayHead  = "<i8i8"
	nextDelayFresh = "<i8i8di8i8i8i8i8i8i8i8Bi8i8i8i8i8i8di8i8ddddddBBBi8i8Bi8i8i8i8i8"
)

// nextDelayNumbersLen is the length in bytes of the head and the fresh
// numbers, without the results.
const nextDelayNumbersLen = 2*8 + 8*8 + 3*8 + 1 + 3*8 + 2*8 + 8 + 4*8 + 5*8 + 1 + 2 + 2*8 + 1 + 2*8 + 3*8

// numbers is policyd_nextdelay's packed numbers being written, in the
// order of the layout above. The encoding is written by hand: it is on
// NextDelay's hot path (one append per value into a buffer sized once,
// instead of a boxed argument per number written and parsed back in
// decimal), and no Go library writes what Lua's struct reads.
type numbers []byte

// int appends v as i8.
func (p *numbers) int(v int64) { *p = binary.LittleEndian.AppendUint64(*p, uint64(v)) }

// float appends v as d, exact.
func (p *numbers) float(v float64) { *p = binary.LittleEndian.AppendUint64(*p, math.Float64bits(v)) }

// bit appends v as B: 1 for true, 0 for false.
func (p *numbers) bit(v bool) {
	var b byte
	if v {
		b = 1
	}
	*p = append(*p, b)
}

// small appends v as one byte (a carried result).
func (p *numbers) small(v uint8) { *p = append(*p, v) }

// int4 appends v as i4.
func (p *numbers) int4(v int32) { *p = binary.LittleEndian.AppendUint32(*p, uint32(v)) }

// short appends s as Bc0: its length, one byte, then its bytes; s is at
// most 255 bytes (maxPackedString).
func (p *numbers) short(s string) {
	*p = append(*p, byte(len(s)))
	*p = append(*p, s...)
}

// maxPackedString is the longest string short packs.
const maxPackedString = 255

// cfg appends c (normalized) as the library's 8 breaker numbers, in
// cfg_at's order: mode i8, consecutive failures i8, failure rate d,
// window µs i8, min calls i8, cool-down µs i8, half-open probes i8,
// probe timeout µs i8.
func (p *numbers) cfg(c *policy.BreakerConfig) {
	p.int(int64(c.Mode))
	p.int(int64(c.ConsecutiveFailures))
	p.float(c.FailureRate)
	p.int(us(c.Window))
	p.int(int64(c.MinCalls))
	p.int(us(c.Cooldown))
	p.int(int64(c.HalfOpenProbes))
	p.int(us(c.ProbeTimeout))
}

// time appends t as the library reads a time to the nanosecond: Unix µs
// and the nanoseconds past them, each i8, 0 0 for the zero time.
func (p *numbers) time(t time.Time) {
	if t.IsZero() {
		p.int(0)
		p.int(0)
		return
	}
	ns := t.UnixNano()
	p.int(ns / 1000)
	p.int(ns % 1000)
}
