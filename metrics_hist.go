package talaris

import (
	"math"
	"math/bits"
)

// histogram is a log-linear (HdrHistogram-style) histogram of non-negative
// int64 values, in nanoseconds here, with three significant decimal digits:
//
//   - values below 2048 are counted exactly (one bucket per value);
//   - above that, each power-of-two range [2^k, 2^(k+1)) is split into 1024
//     equal sub-buckets, so a value and every other value of its sub-bucket
//     differ by less than 1/1024 (0.098%) of the value;
//   - values from 0 to histMaxValue (2^36-1 ns, about 68.7 s) are tracked;
//     larger values are counted as histMaxValue, negative ones as 0.
//
// The counts are one fixed array inside the struct (27648 uint64, 216 KiB):
// a histogram is allocated once and never grows. Record is O(1) and does not
// allocate. Min, max and the sum are kept exactly, so Min, Max and Mean are
// exact; quantiles are exact to within the sub-bucket resolution.
//
// A histogram is not safe for concurrent use. The metricsRecorder
// (metrics.go) hands histograms between the one recording goroutine and
// readers; its comment describes the concurrency model.
type histogram struct {
	count  uint64
	sum    int64 // exact sum of the recorded (clamped) values
	min    int64 // exact; meaningful only when count > 0
	max    int64
	counts [histCountsLen]uint64
}

const (
	histSubBits      = 11                 // sub-bucket count 2048 = 2^11: three significant digits
	histSubCount     = 1 << histSubBits   // 2048
	histSubHalf      = histSubCount / 2   // 1024 sub-buckets per power-of-two range above 2048
	histSubMask      = histSubCount - 1   // values <= this land in bucket 0, exactly
	histMaxBits      = 36                 // tracked range: [0, 2^36)
	histMaxValue     = 1<<histMaxBits - 1 // 68.719476735 s in ns
	histBucketCount  = histMaxBits - histSubBits + 1
	histCountsLen    = (histBucketCount + 1) * histSubHalf // 27648
	histRelPrecision = 1.0 / histSubHalf                   // worst-case relative error of a quantile
)

// histIndex is the counts index of v (0 <= v <= histMaxValue).
func histIndex(v int64) int {
	// bucket b: the power-of-two range beyond the exact first 2048 values;
	// sub = v >> b lies in [1024, 2048) for b > 0 and in [0, 2048) for b == 0,
	// which makes b<<10 + sub contiguous across buckets.
	b := 64 - bits.LeadingZeros64(uint64(v)|histSubMask) - histSubBits
	return b<<(histSubBits-1) + int(v>>uint(b))
}

// histLowest is the smallest value counted at index i.
func histLowest(i int) int64 {
	b := i>>(histSubBits-1) - 1
	sub := int64(i&(histSubHalf-1) + histSubHalf)
	if b < 0 {
		return int64(i)
	}
	return sub << uint(b)
}

// histHighest is the largest value counted at index i.
func histHighest(i int) int64 {
	b := i>>(histSubBits-1) - 1
	if b < 0 {
		return int64(i)
	}
	return histLowest(i) + (1<<uint(b) - 1)
}

// Record adds one value. O(1), no allocation.
func (h *histogram) Record(v int64) {
	if v < 0 {
		v = 0
	} else if v > histMaxValue {
		v = histMaxValue
	}
	h.counts[histIndex(v)]++
	if h.count == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.count++
	h.sum += v
}

// span is the index range [lo, hi] that can hold counts: every index
// outside it is zero. Empty histograms return lo > hi.
func (h *histogram) span() (lo, hi int) {
	if h.count == 0 {
		return 1, 0
	}
	return histIndex(h.min), histIndex(h.max)
}

// Merge adds o's counts to h. It touches only o's span (from its min to its
// max), so merging a narrow histogram is cheap.
func (h *histogram) Merge(o *histogram) {
	if o.count == 0 {
		return
	}
	lo, hi := o.span()
	for i := lo; i <= hi; i++ {
		h.counts[i] += o.counts[i]
	}
	if h.count == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.count += o.count
	h.sum += o.sum
}

// Reset empties h, clearing only its span.
func (h *histogram) Reset() {
	lo, hi := h.span()
	if lo <= hi {
		clear(h.counts[lo : hi+1])
	}
	h.count, h.sum, h.min, h.max = 0, 0, 0, 0
}

// Count is the number of recorded values.
func (h *histogram) Count() uint64 { return h.count }

// Sum is the exact sum of the recorded values (after clamping).
func (h *histogram) Sum() int64 { return h.sum }

// Min is the smallest recorded value, 0 when empty.
func (h *histogram) Min() int64 { return h.min }

// Max is the largest recorded value, 0 when empty.
func (h *histogram) Max() int64 { return h.max }

// Mean is the exact arithmetic mean, 0 when empty.
func (h *histogram) Mean() float64 {
	if h.count == 0 {
		return 0
	}
	return float64(h.sum) / float64(h.count)
}

// histRank is the 1-based rank of quantile q among n values: the smallest r
// with r >= q*n, at least 1 (the nearest-rank definition).
func histRank(q float64, n uint64) uint64 {
	r := uint64(math.Ceil(q * float64(n)))
	if r < 1 {
		r = 1
	}
	if r > n {
		r = n
	}
	return r
}

// ValueAtQuantile returns the value at quantile q (0 <= q <= 1, nearest
// rank): the highest value of the sub-bucket holding the rank-th smallest
// value, clamped to [Min, Max]. Its relative error against the exact
// quantile is below histRelPrecision (1/1024). 0 when empty.
func (h *histogram) ValueAtQuantile(q float64) int64 {
	var out [1]int64
	h.quantiles([]float64{q}, out[:])
	return out[0]
}

// quantiles fills out[i] with ValueAtQuantile(qs[i]) in one pass over the
// span; qs must be ascending.
func (h *histogram) quantiles(qs []float64, out []int64) {
	if h.count == 0 {
		clear(out)
		return
	}
	lo, hi := h.span()
	var cum uint64
	j := 0
	for i := lo; i <= hi && j < len(qs); i++ {
		cum += h.counts[i]
		for j < len(qs) && cum >= histRank(qs[j], h.count) {
			out[j] = min(max(histHighest(i), h.min), h.max)
			j++
		}
	}
	for ; j < len(out); j++ { // unreachable with consistent counts; keep out defined
		out[j] = h.max
	}
}

// cumulativeBuckets fills out[j] with the number of values at or below
// bounds[j] (ascending, in the histogram's unit), the cumulative form
// Prometheus histogram buckets take. A value counts under a bound when the
// lowest value of its sub-bucket is at or below the bound, so a bound is
// exact below 2048 and otherwise placed to within the sub-bucket width
// (under 0.1% of the bound).
func (h *histogram) cumulativeBuckets(bounds []int64, out []uint64) {
	lo, hi := h.span()
	var cum uint64
	j := 0
	for i := lo; i <= hi; i++ {
		low := histLowest(i)
		for j < len(bounds) && low > bounds[j] {
			out[j] = cum
			j++
		}
		cum += h.counts[i]
	}
	for ; j < len(bounds); j++ {
		out[j] = cum
	}
}
