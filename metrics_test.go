package talaris

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestHistIndexLayout: the sub-buckets tile [0, histMaxValue] without gaps
// or overlaps, every value maps into its own sub-bucket, and a sub-bucket's
// width is within the documented relative precision of its values.
func TestHistIndexLayout(t *testing.T) {
	if got := histIndex(histMaxValue); got != histCountsLen-1 {
		t.Fatalf("histIndex(max) = %d, want %d", got, histCountsLen-1)
	}
	if histHighest(histCountsLen-1) != histMaxValue {
		t.Fatalf("last sub-bucket ends at %d, want %d", histHighest(histCountsLen-1), histMaxValue)
	}
	for i := 0; i < histCountsLen; i++ {
		lo, hi := histLowest(i), histHighest(i)
		if histIndex(lo) != i || histIndex(hi) != i {
			t.Fatalf("index %d: [%d, %d] maps to %d, %d", i, lo, hi, histIndex(lo), histIndex(hi))
		}
		if i > 0 && histHighest(i-1)+1 != lo {
			t.Fatalf("gap or overlap before index %d: %d then %d", i, histHighest(i-1), lo)
		}
		if lo < histSubCount && lo != hi {
			t.Fatalf("value %d below %d not exact: [%d, %d]", lo, histSubCount, lo, hi)
		}
		if float64(hi-lo) > float64(lo)*histRelPrecision {
			t.Fatalf("index %d: width %d too wide for %d", i, hi-lo+1, lo)
		}
	}
}

// histTestValues draws n values log-uniformly from 1 ns to about 60 s,
// with a few exact small values and both range ends.
func histTestValues(seed uint64, n int) []int64 {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	vs := make([]int64, 0, n+3)
	vs = append(vs, 0, histMaxValue, 1)
	for len(vs) < n+3 {
		exp := r.Float64() * 35.8 // 2^35.8 ns ~ 60 s
		vs = append(vs, int64(math.Exp2(exp)))
	}
	return vs
}

func TestHistQuantileAccuracy(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		vs := histTestValues(seed, 200_000)
		h := new(histogram)
		var sum int64
		for _, v := range vs {
			h.Record(v)
			sum += v
		}
		sorted := slices.Clone(vs)
		slices.Sort(sorted)
		n := uint64(len(sorted))
		if h.Count() != n || h.Min() != sorted[0] || h.Max() != sorted[n-1] || h.Sum() != sum {
			t.Fatalf("count/min/max/sum %d %d %d %d, want %d %d %d %d",
				h.Count(), h.Min(), h.Max(), h.Sum(), n, sorted[0], sorted[n-1], sum)
		}
		if want := float64(sum) / float64(n); h.Mean() != want {
			t.Fatalf("mean %v, want %v", h.Mean(), want)
		}
		qs := []float64{0, 0.0001, 0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 0.99999, 1}
		for i := 0; i < 200; i++ {
			qs = append(qs, float64(i)/200)
		}
		for _, q := range qs {
			want := sorted[histRank(q, n)-1]
			got := h.ValueAtQuantile(q)
			if d := got - want; d < 0 || float64(d) > float64(want)*histRelPrecision {
				t.Fatalf("seed %d q %v: got %d, exact %d (relative error %.3g > %.3g)",
					seed, q, got, want, float64(d)/float64(want), histRelPrecision)
			}
		}
	}
}

func TestHistMergeReset(t *testing.T) {
	vs := histTestValues(7, 50_000)
	all, a, b := new(histogram), new(histogram), new(histogram)
	for i, v := range vs {
		all.Record(v)
		if i%3 == 0 {
			a.Record(v)
		} else {
			b.Record(v)
		}
	}
	m := new(histogram)
	m.Merge(a)
	m.Merge(new(histogram)) // empty: no effect
	m.Merge(b)
	if *m != *all {
		t.Fatalf("merge of the parts differs from recording all: count %d/%d min %d/%d max %d/%d",
			m.count, all.count, m.min, all.min, m.max, all.max)
	}
	m.Reset()
	if *m != (histogram{}) {
		t.Fatal("Reset left state behind")
	}
	if m.ValueAtQuantile(0.5) != 0 || m.Mean() != 0 {
		t.Fatal("empty histogram reports values")
	}
	// Reset clears by span: a narrow histogram reuses cleanly.
	m.Record(5000)
	m.Record(7000)
	m.Reset()
	m.Record(100)
	if m.Min() != 100 || m.Max() != 100 || m.ValueAtQuantile(1) != 100 || m.Count() != 1 {
		t.Fatalf("after reuse: min %d max %d p100 %d count %d", m.Min(), m.Max(), m.ValueAtQuantile(1), m.Count())
	}
	// Clamping.
	m.Reset()
	m.Record(-5)
	m.Record(histMaxValue + 1000)
	if m.Min() != 0 || m.Max() != histMaxValue {
		t.Fatalf("clamp: min %d max %d", m.Min(), m.Max())
	}
}

func TestHistCumulativeBuckets(t *testing.T) {
	vs := histTestValues(11, 100_000)
	h := new(histogram)
	for _, v := range vs {
		h.Record(v)
	}
	var got [NumLatencyBuckets]uint64
	h.cumulativeBuckets(latencyBoundsNs[:], got[:])
	for j, bound := range latencyBoundsNs {
		var exact, byBucket, near uint64
		for _, v := range vs {
			if v <= bound {
				exact++
			}
			if histLowest(histIndex(v)) <= bound {
				byBucket++
			}
			if v > bound && histLowest(histIndex(v)) <= bound {
				near++ // shares the bound's sub-bucket: within 0.1% of it
			}
		}
		if got[j] != byBucket || got[j]-exact != near {
			t.Fatalf("bound %v: got %d, documented %d, exact %d (+%d within the sub-bucket)",
				time.Duration(bound), got[j], byBucket, exact, near)
		}
		if j > 0 && got[j] < got[j-1] {
			t.Fatalf("buckets not cumulative at %d", j)
		}
	}
	// Bounds below histSubCount are exact.
	small := new(histogram)
	for v := int64(0); v < 600; v++ {
		small.Record(v)
	}
	small.cumulativeBuckets(latencyBoundsNs[:], got[:])
	if got[0] != 101 || got[1] != 201 || got[2] != 501 || got[NumLatencyBuckets-1] != 600 {
		t.Fatalf("small buckets %v", got[:4])
	}
}

func TestHistRecordZeroAllocs(t *testing.T) {
	h := new(histogram)
	v := int64(1)
	if n := testing.AllocsPerRun(1000, func() { h.Record(v); v = v*7 + 13 }); n != 0 {
		t.Fatalf("histogram.Record allocates %v times", n)
	}
	r := newMetricsRecorder()
	if n := testing.AllocsPerRun(2000, func() { r.record(1000, 1100, 1500, 9000, 500) }); n != 0 {
		t.Fatalf("metricsRecorder.record allocates %v times", n)
	}
}

func TestMetricsRecorderStages(t *testing.T) {
	r := newMetricsRecorder()
	// 100 plain samples with fixed stage lengths.
	for i := int64(1); i <= 100; i++ {
		base := i * 1_000_000
		r.record(base, base+100, base+100+i*10, base+100+i*10+2000, base-500)
	}
	r.record(5000, 6000, 5500, 7000, 0) // publish before plaintext: rejected there; no wire stamp
	r.record(5000, 0, 5500, 0, 0)       // plaintext and callback absent: nothing recorded
	r.flush()
	m := r.snapshot(false)
	if m.Sampled != 102 {
		t.Fatalf("sampled %d", m.Sampled)
	}
	check := func(s Stage, count, rejected uint64, minD, maxD time.Duration) {
		t.Helper()
		h := m.Stages[s]
		if h.Count != count || h.Rejected != rejected || h.Min != minD || h.Max != maxD {
			t.Fatalf("%v: count %d rejected %d min %v max %v, want %d %d %v %v",
				s, h.Count, h.Rejected, h.Min, h.Max, count, rejected, minD, maxD)
		}
		if h.Buckets[NumLatencyBuckets-1] > h.Count {
			t.Fatalf("%v: last bucket %d > count %d", s, h.Buckets[NumLatencyBuckets-1], h.Count)
		}
	}
	check(StageCQEToPlaintext, 101, 0, 100, 1000)
	check(StagePlaintextToPublish, 100, 1, 10, 1000)
	check(StagePublishToCallback, 101, 0, 1500, 2000)
	check(StageCQEToCallback, 101, 0, 2000, 3100)
	check(StageWireToCallback, 100, 0, 2610, 3600)
	ptp := m.Stages[StagePlaintextToPublish]
	if ptp.P50 != 500 || ptp.P90 != 900 || ptp.P99 != 990 || ptp.P999 != 1000 || ptp.Sum/time.Duration(ptp.Count) != 505 || ptp.Sum != 50500 {
		t.Fatalf("plaintext_to_publish quantiles %+v", ptp)
	}
	if ptp.Buckets[0] != 10 || ptp.Buckets[1] != 20 || ptp.Buckets[2] != 50 || ptp.Buckets[3] != 100 {
		t.Fatalf("plaintext_to_publish buckets %v", ptp.Buckets[:4])
	}

	// Interval snapshots reset only themselves.
	iv := r.snapshot(true)
	if iv.Sampled != 102 || iv.Stages[StageCQEToCallback].Count != 101 {
		t.Fatalf("first interval %d/%d", iv.Sampled, iv.Stages[StageCQEToCallback].Count)
	}
	r.record(1, 2, 3, 4, 0)
	r.flush()
	iv = r.snapshot(true)
	if iv.Sampled != 1 || iv.Stages[StageCQEToCallback].Count != 1 || iv.Stages[StageCQEToCallback].Max != 3 {
		t.Fatalf("second interval %+v", iv.Stages[StageCQEToCallback])
	}
	if tot := r.snapshot(false); tot.Sampled != 103 || tot.Stages[StageCQEToCallback].Count != 102 {
		t.Fatalf("cumulative after intervals %d/%d", tot.Sampled, tot.Stages[StageCQEToCallback].Count)
	}
	if iv = r.snapshot(true); iv.Sampled != 0 || iv.Stages[StageCQEToCallback] != (StageHistogram{}) {
		t.Fatalf("empty interval %+v", iv.Stages[StageCQEToCallback])
	}
}

// TestMetricsRecorderRace: one recording goroutine, several readers
// (cumulative and interval). Run with -race. Readers see cumulative counts
// that never go back, consistent histograms, and in the end every sample:
// the intervals add up to the total.
func TestMetricsRecorderRace(t *testing.T) {
	const samples = 200_000
	r := newMetricsRecorder()
	var wg sync.WaitGroup
	done := make(chan struct{})
	errs := make(chan error, 8)
	var started sync.WaitGroup // the pump starts when every reader has snapshotted once
	started.Add(4)
	var midway atomic.Int64 // snapshots that saw some but not all samples

	wg.Add(1)
	go func() { // the pump
		defer wg.Done()
		started.Wait()
		for i := int64(1); i <= samples; i++ {
			b := i * 10
			r.record(b, b+1, b+2+i%1000, b+3+i%1000, 0)
			if i%97 == 0 {
				r.poll() // end of a pump batch
			}
		}
		r.flush() // the pump goes to sleep
		close(done)
	}()

	consistent := func(m *Metrics) error {
		for s := range m.Stages {
			h := &m.Stages[s]
			for i := 1; i < NumLatencyBuckets; i++ {
				if h.Buckets[i] < h.Buckets[i-1] {
					return fmt.Errorf("%v: buckets decrease", Stage(s))
				}
			}
			if h.Buckets[NumLatencyBuckets-1] > h.Count || (h.Count > 0 && (h.Min > h.P50 || h.P50 > h.P9999 || h.P9999 > h.Max)) {
				return fmt.Errorf("%v: inconsistent %+v", Stage(s), *h)
			}
		}
		if s := Stage(StageWireToCallback); m.Stages[s].Count != 0 {
			return fmt.Errorf("wire stage recorded without stamps")
		}
		if m.Stages[StageCQEToCallback].Count != m.Sampled {
			return fmt.Errorf("cqe_to_callback %d != sampled %d", m.Stages[StageCQEToCallback].Count, m.Sampled)
		}
		return nil
	}
	// reader snapshots until the pump is done (at least once, which lets
	// the pump start) and hands each consistent snapshot to check.
	reader := func(reset bool, check func(m *Metrics) error) {
		defer wg.Done()
		for first := true; ; first = false {
			if !first {
				select {
				case <-done:
					return
				default:
				}
			}
			m := r.snapshot(reset)
			err := consistent(&m)
			if err == nil {
				err = check(&m)
			}
			if err != nil {
				errs <- err
				return
			}
			if first {
				started.Done()
			}
		}
	}
	wg.Add(4)
	for range 3 { // scrapers
		var last uint64
		go reader(false, func(m *Metrics) error {
			if m.Sampled < last {
				return fmt.Errorf("cumulative count went back: %d after %d", m.Sampled, last)
			}
			last = m.Sampled
			if m.Sampled > 0 && m.Sampled < samples {
				midway.Add(1)
			}
			return nil
		})
	}
	var intervalSum uint64
	go reader(true, func(m *Metrics) error { // a dashboard taking interval snapshots
		intervalSum += m.Sampled
		return nil
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	intervalSum += r.snapshot(true).Sampled
	if m := r.snapshot(false); m.Sampled != samples || m.Stages[StagePublishToCallback].Count != samples {
		t.Fatalf("final cumulative %d/%d, want %d", m.Sampled, m.Stages[StagePublishToCallback].Count, samples)
	}
	if intervalSum != samples {
		t.Fatalf("intervals add up to %d, want %d", intervalSum, samples)
	}
	t.Logf("%d cumulative snapshots saw the recording in progress", midway.Load())
}

// promSample is one parsed sample line.
type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

// parsePromText is a strict stdlib reader of the subset of the text format
// writePrometheus emits: HELP and TYPE before a family's samples, label
// values with their escapes, float values.
func parsePromText(t *testing.T, text string) (types map[string]string, samples []promSample) {
	t.Helper()
	types = map[string]string{}
	helps := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for ln := 1; sc.Scan(); ln++ {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, _, _ := strings.Cut(rest, " ")
			if helps[name] {
				t.Fatalf("line %d: second HELP for %s", ln, name)
			}
			helps[name] = true
			continue
		}
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(rest, " ")
			if !helps[name] || types[name] != "" {
				t.Fatalf("line %d: TYPE without HELP or repeated: %q", ln, line)
			}
			types[name] = typ
			continue
		}
		s := promSample{labels: map[string]string{}}
		i := strings.IndexByte(line, '{')
		if i < 0 {
			t.Fatalf("line %d: no labels: %q", ln, line)
		}
		s.name = line[:i]
		j := i + 1
		for line[j] != '}' {
			eq := strings.IndexByte(line[j:], '=')
			key := line[j : j+eq]
			j += eq + 1
			if line[j] != '"' {
				t.Fatalf("line %d: unquoted label value", ln)
			}
			j++
			var v strings.Builder
			for line[j] != '"' {
				if line[j] == '\\' {
					j++
					switch line[j] {
					case 'n':
						v.WriteByte('\n')
					case '\\', '"':
						v.WriteByte(line[j])
					default:
						t.Fatalf("line %d: bad escape", ln)
					}
				} else {
					v.WriteByte(line[j])
				}
				j++
			}
			j++
			s.labels[key] = v.String()
			if line[j] == ',' {
				j++
			}
		}
		val, err := strconv.ParseFloat(strings.TrimPrefix(line[j+1:], " "), 64)
		if err != nil || line[j+1] != ' ' {
			t.Fatalf("line %d: bad value: %q", ln, line)
		}
		s.value = val
		base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(s.name, "_bucket"), "_sum"), "_count")
		if types[s.name] == "" && types[base] != "histogram" {
			t.Fatalf("line %d: sample of undeclared family %q", ln, s.name)
		}
		samples = append(samples, s)
	}
	return types, samples
}

func TestPromTextSelfCheck(t *testing.T) {
	r := newMetricsRecorder()
	for i := int64(1); i <= 1000; i++ {
		r.record(i*1000, i*1000+50, i*1000+50+i, i*1000+60+i*i, i*1000-7)
	}
	r.record(10, 20, 15, 30, 0) // one rejection
	r.flush()
	m := r.snapshot(false)
	m.Messages, m.Bytes, m.Reconnects = 4000, 123456, 2
	m.ConnsOpen, m.SendQueuedBytes, m.SendQueuedMessages = 3, 5000, 7
	m.Conns = []ConnGauge{{Label: `desk "B"\2`, ConnsOpen: 1, SendQueuedBytes: 4000, SendQueuedMessages: 5}}
	pool := "feed \"A\"\\1\nb"

	var buf bytes.Buffer
	if err := writePrometheus(&buf, pool, &m); err != nil {
		t.Fatal(err)
	}
	types, samples := parsePromText(t, buf.String())

	nCounters := 0
	m.EachCounter(func(name, _ string, v uint64) {
		nCounters++
		if types[name] != "counter" || !strings.HasSuffix(name, "_total") {
			t.Fatalf("%s: type %q", name, types[name])
		}
		found := false
		for _, s := range samples {
			if s.name == name {
				found = s.value == float64(v) && s.labels["pool"] == pool && len(s.labels) == 1
			}
		}
		if !found {
			t.Fatalf("%s: no sample with value %d and pool label", name, v)
		}
	})
	gauges := map[string]bool{}
	m.EachGauge(func(name, _, conn string, v uint64) {
		gauges[name] = true
		if types[name] != "gauge" || strings.HasSuffix(name, "_total") {
			t.Fatalf("%s: type %q", name, types[name])
		}
		n := 0
		for _, s := range samples {
			if s.name == name && s.labels["conn"] == conn {
				n++
				if s.value != float64(v) || s.labels["pool"] != pool || len(s.labels) != 1+min(len(conn), 1) {
					t.Fatalf("%s{conn=%q}: sample %+v, want value %d", name, conn, s, v)
				}
			}
		}
		if n != 1 {
			t.Fatalf("%s{conn=%q}: %d samples", name, conn, n)
		}
	})
	if types[StageLatencyName] != "histogram" || types[StageRejectedName] != "counter" || len(gauges) != 3 || len(types) != nCounters+len(gauges)+2 {
		t.Fatalf("families %v", types)
	}
	for name := range types {
		if !strings.HasPrefix(name, "talaris_") {
			t.Fatalf("family %s without the talaris_ prefix", name)
		}
	}

	perStage := map[string][]promSample{}
	for _, s := range samples {
		if strings.HasPrefix(s.name, StageLatencyName) || s.name == StageRejectedName {
			if s.labels["pool"] != pool {
				t.Fatalf("%s: pool label %q", s.name, s.labels["pool"])
			}
			perStage[s.labels["stage"]] = append(perStage[s.labels["stage"]], s)
		}
	}
	if len(perStage) != NumStages {
		t.Fatalf("stages %v", perStage)
	}
	for st := Stage(0); st < NumStages; st++ {
		h := m.Stages[st]
		var buckets []float64
		var sum, count, rejected float64 = -1, -1, -1
		prevLe := 0.0
		for _, s := range perStage[st.String()] {
			switch s.name {
			case StageLatencyName + "_bucket":
				le, err := strconv.ParseFloat(s.labels["le"], 64)
				if err != nil || le <= prevLe {
					t.Fatalf("%v: le %q not ascending", st, s.labels["le"])
				}
				prevLe = le
				if len(buckets) > 0 && s.value < buckets[len(buckets)-1] {
					t.Fatalf("%v: bucket counts decrease", st)
				}
				buckets = append(buckets, s.value)
			case StageLatencyName + "_sum":
				sum = s.value
			case StageLatencyName + "_count":
				count = s.value
			case StageRejectedName:
				rejected = s.value
			}
		}
		if len(buckets) != NumLatencyBuckets+1 || buckets[NumLatencyBuckets] != count || count != float64(h.Count) {
			t.Fatalf("%v: %d buckets, +Inf %v, count %v, recorded %d", st, len(buckets), buckets[len(buckets)-1], count, h.Count)
		}
		if sum != h.Sum.Seconds() || rejected != float64(h.Rejected) {
			t.Fatalf("%v: sum %v rejected %v, want %v %d", st, sum, rejected, h.Sum.Seconds(), h.Rejected)
		}
		for i, b := range h.Buckets {
			if buckets[i] != float64(b) {
				t.Fatalf("%v: bucket %d = %v, want %d", st, i, buckets[i], b)
			}
		}
	}
	if m.Stages[StageCQEToCallback].Count != 1001 || m.Stages[StagePlaintextToPublish].Rejected != 1 {
		t.Fatalf("recorded counts %d/%d", m.Stages[StageCQEToCallback].Count, m.Stages[StagePlaintextToPublish].Rejected)
	}
}

func BenchmarkHistRecord(b *testing.B) {
	h := new(histogram)
	vs := histTestValues(3, 4096)
	for i := range vs {
		vs[i] %= 100_000_000 // latencies below 100 ms
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h.Record(vs[i&4095])
	}
}

// BenchmarkMetricsRecord: the pump's cost per sampled message, the batched
// publish (one lock and five histogram records per sample) included.
func BenchmarkMetricsRecord(b *testing.B) {
	r := newMetricsRecorder()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t := int64(i&4095)*1000 + 1_000_000
		r.record(t, t+200, t+700+int64(i&63), t+3000+int64(i&511), t-4000)
	}
}

// TestEachGauge: the three families in order, the pool's sample first
// with conn "", then one per Conns entry; Conns merged by label.
func TestEachGauge(t *testing.T) {
	m := Metrics{ConnsOpen: 4, SendQueuedBytes: 900, SendQueuedMessages: 9}
	m.Conns = mergeConnGauges([]ConnGauge{
		{Label: "orders", ConnsOpen: 1, SendQueuedBytes: 300, SendQueuedMessages: 3},
		{Label: "feed", ConnsOpen: 1},
		{Label: "orders", ConnsOpen: 0, SendQueuedBytes: 500, SendQueuedMessages: 5},
	})
	var got []string
	m.EachGauge(func(name, help, conn string, v uint64) {
		if help == "" {
			t.Errorf("%s: no help", name)
		}
		got = append(got, fmt.Sprintf("%s{%s}=%d", name, conn, v))
	})
	want := []string{
		"talaris_conns_open{}=4", "talaris_conns_open{feed}=1", "talaris_conns_open{orders}=1",
		"talaris_send_queued_bytes{}=900", "talaris_send_queued_bytes{feed}=0", "talaris_send_queued_bytes{orders}=800",
		"talaris_send_queued_messages{}=9", "talaris_send_queued_messages{feed}=0", "talaris_send_queued_messages{orders}=8",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("EachGauge:\n got %q\nwant %q", got, want)
	}
	if mergeConnGauges(nil) != nil {
		t.Fatal("no labels: Conns must be nil")
	}
}

// TestDialOptionsLabel: DialOptions.Label is checked with the other dial
// options: printable UTF-8 of at most 64 bytes.
func TestDialOptionsLabel(t *testing.T) {
	for _, ok := range []string{"", "orders", `desk "B" \ 2`, "ordres-é", strings.Repeat("x", 64)} {
		if err := (&DialOptions{Label: ok}).checkHeartbeat(); err != nil {
			t.Errorf("Label %q: %v", ok, err)
		}
	}
	for _, bad := range []string{strings.Repeat("x", 65), "a\nb", "tab\t", "\x00", "bad\xffutf8", "\u200b"} {
		err := (&DialOptions{Label: bad}).checkHeartbeat()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "DialOptions.Label") {
			t.Errorf("Label %q: %v, want ErrInvalidConfig naming DialOptions.Label", bad, err)
		}
	}
}
