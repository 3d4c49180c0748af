package main

import (
	"math/bits"
	"time"
)

// subBuckets is the number of linear sub-buckets per power of two: values
// are kept to within 1/subBuckets (under 1%) of their true value, as an
// HDR histogram with two significant digits does.
const (
	subBucketBits = 7
	subBuckets    = 1 << subBucketBits
	histBuckets   = (64 - subBucketBits + 1) * subBuckets
)

// hist is a log-linear latency histogram of nanosecond values. It is not
// safe for concurrent use: each caller goroutine keeps its own and they are
// merged at the end.
type hist struct {
	counts [histBuckets]uint64
	n      uint64
	max    int64
}

func bucketOf(v int64) int {
	if v < subBuckets {
		return int(max(v, 0))
	}
	e := bits.Len64(uint64(v)) - subBucketBits - 1 // v>>e is in [subBuckets, 2*subBuckets)
	return (e+1)*subBuckets + int(uint64(v)>>e) - subBuckets
}

// valueOf returns the middle of bucket i.
func valueOf(i int) int64 {
	if i < subBuckets {
		return int64(i)
	}
	e := i/subBuckets - 1
	m := int64(i%subBuckets + subBuckets)
	lo := m << e
	return lo + (int64(1)<<e)/2
}

// record adds one latency.
func (h *hist) record(d time.Duration) {
	v := int64(d)
	h.counts[bucketOf(v)]++
	h.n++
	h.max = max(h.max, v)
}

// merge adds o's counts to h.
func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// quantile returns the latency below which q (0 to 1) of the values lie.
func (h *hist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return time.Duration(min(valueOf(i), h.max))
		}
	}
	return time.Duration(h.max)
}
