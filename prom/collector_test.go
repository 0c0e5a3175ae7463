package prom

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
)

// stageOf builds the StageHistogram a recorder would report for ds,
// independently of the library: exact quantiles by nearest rank and a
// plain count per bucket bound (the values avoid the 0.1% band around a
// bound, where the library's sub-buckets may round).
func stageOf(rejected uint64, ds ...time.Duration) talaris.StageHistogram {
	h := talaris.StageHistogram{Count: uint64(len(ds)), Rejected: rejected}
	if len(ds) == 0 {
		return h
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	for _, d := range s {
		h.Sum += d
	}
	q := func(p float64) time.Duration {
		r := int(math.Ceil(p * float64(len(s))))
		return s[max(r, 1)-1]
	}
	h.Min, h.Max = s[0], s[len(s)-1]
	h.P50, h.P90, h.P99, h.P999, h.P9999 = q(0.5), q(0.9), q(0.99), q(0.999), q(0.9999)
	for i, b := range talaris.LatencyBucketBounds() {
		h.Buckets[i] = uint64(sort.Search(len(s), func(j int) bool { return s[j] > b }))
	}
	return h
}

type fakeSource struct {
	m     talaris.Metrics
	calls int
}

func (f *fakeSource) Metrics() talaris.Metrics { f.calls++; return f.m }

// testMetrics: known samples per stage, counters with distinct values.
func testMetrics() talaris.Metrics {
	var m talaris.Metrics
	var a, b, c []time.Duration
	for i := 1; i <= 1000; i++ {
		a = append(a, time.Duration(i*137)*time.Nanosecond)     // 137 ns .. 137 µs
		b = append(b, time.Duration(i%50+3)*time.Microsecond/3) // 1 µs .. 17.3 µs
	}
	for i := 1; i <= 7; i++ {
		c = append(c, time.Duration(i)*1300*time.Millisecond) // up to 9.1 s
	}
	m.Stages[talaris.StageCQEToPlaintext] = stageOf(0, b...)
	m.Stages[talaris.StagePlaintextToPublish] = stageOf(3, a...)
	m.Stages[talaris.StagePublishToCallback] = stageOf(0, c...)
	m.Stages[talaris.StageCQEToCallback] = stageOf(1, append(a, c...)...)
	// StageWireToCallback stays empty: no wire stamps.
	m.Sampled = 1007
	m.Messages, m.Bytes, m.WireBytes = 64448, 9_000_001, 9_500_003
	testhook.SetLoopCounters(&m, testhook.LoopCounters{Events: 64500, Completions: 1234, Rearms: 5, NoBufs: 6, Stalls: 7,
		Batches: 800, PumpSleeps: 700, LoopWakes: 600})
	m.SendQueueFull, m.Reconnects = 2, 1
	m.ConnsOpen, m.SendQueuedBytes, m.SendQueuedMessages = 3, 70_000, 11
	m.Conns = []talaris.ConnGauge{
		{Label: `desk "B" \ 2`, ConnsOpen: 1, SendQueuedBytes: 60_000, SendQueuedMessages: 10},
		{Label: "feed", ConnsOpen: 1},
	}
	return m
}

const testPool = "feed \"A\" \\ 1\nsecond line"

func parseText(t *testing.T, pool string, m talaris.Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	var buf bytes.Buffer
	if err := testhook.WritePrometheus(&buf, pool, m); err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(&buf)
	if err != nil {
		t.Fatalf("expfmt rejects the text: %v\n%s", err, buf.String())
	}
	return fams
}

// TestTextExposition parses the library's text writer with expfmt and
// checks families, types, labels, bucket monotonicity and counts.
func TestTextExposition(t *testing.T) {
	m := testMetrics()
	fams := parseText(t, testPool, m)

	wantCounters := map[string]uint64{talaris.StageRejectedName: 0}
	m.EachCounter(func(name, _ string, v uint64) { wantCounters[name] = v })
	wantGauges := map[string]map[string]uint64{} // name -> conn -> value
	m.EachGauge(func(name, _, conn string, v uint64) {
		if wantGauges[name] == nil {
			wantGauges[name] = map[string]uint64{}
		}
		wantGauges[name][conn] = v
	})
	if len(fams) != len(wantCounters)+len(wantGauges)+1 {
		t.Fatalf("%d families, want %d", len(fams), len(wantCounters)+len(wantGauges)+1)
	}
	for name, f := range fams {
		if !strings.HasPrefix(name, "talaris_") || f.GetHelp() == "" {
			t.Fatalf("family %q: prefix or help missing", name)
		}
		for _, mt := range f.Metric {
			if pool := labelValue(mt, "pool"); pool != testPool {
				t.Fatalf("%s: pool label %q, want %q", name, pool, testPool)
			}
		}
		if name == talaris.StageLatencyName {
			continue
		}
		if want := wantGauges[name]; want != nil {
			if f.GetType() != dto.MetricType_GAUGE || len(f.Metric) != len(want) {
				t.Fatalf("%s: type %v, %d samples, want a gauge with %d", name, f.GetType(), len(f.Metric), len(want))
			}
			for _, mt := range f.Metric {
				conn := labelValue(mt, "conn")
				if v, ok := want[conn]; !ok || mt.GetGauge().GetValue() != float64(v) {
					t.Fatalf("%s{conn=%q}: %v, want %d", name, conn, mt.GetGauge().GetValue(), v)
				}
			}
			continue
		}
		if f.GetType() != dto.MetricType_COUNTER || !strings.HasSuffix(name, "_total") {
			t.Fatalf("%s: type %v", name, f.GetType())
		}
		if name == talaris.StageRejectedName {
			continue
		}
		if len(f.Metric) != 1 || f.Metric[0].GetCounter().GetValue() != float64(wantCounters[name]) {
			t.Fatalf("%s: %v, want %d", name, f.Metric, wantCounters[name])
		}
	}

	hist := fams[talaris.StageLatencyName]
	if hist == nil || hist.GetType() != dto.MetricType_HISTOGRAM || len(hist.Metric) != talaris.NumStages {
		t.Fatalf("stage histogram family: %v", hist)
	}
	bounds := talaris.LatencyBucketBounds()
	for _, mt := range hist.Metric {
		st := stageByName(t, labelValue(mt, "stage"))
		want := m.Stages[st]
		h := mt.GetHistogram()
		if h.GetSampleCount() != want.Count || h.GetSampleSum() != want.Sum.Seconds() {
			t.Fatalf("%v: count %d sum %v, want %d %v", st, h.GetSampleCount(), h.GetSampleSum(), want.Count, want.Sum.Seconds())
		}
		bs := finiteBuckets(t, h)
		if len(bs) != talaris.NumLatencyBuckets {
			t.Fatalf("%v: %d finite buckets", st, len(bs))
		}
		for i, b := range bs {
			if b.GetUpperBound() != bounds[i].Seconds() || b.GetCumulativeCount() != want.Buckets[i] {
				t.Fatalf("%v bucket %d: le %v count %d, want %v %d", st, i, b.GetUpperBound(), b.GetCumulativeCount(), bounds[i].Seconds(), want.Buckets[i])
			}
			if i > 0 && b.GetCumulativeCount() < bs[i-1].GetCumulativeCount() {
				t.Fatalf("%v: buckets decrease at %d", st, i)
			}
		}
	}
	// Spot checks against the samples themselves, not the helper.
	a := byStage(t, hist, talaris.StagePlaintextToPublish)
	if a.GetSampleCount() != 1000 || finiteBuckets(t, a)[2].GetCumulativeCount() != 3 { // 137, 274, 411 ns <= 500 ns
		t.Fatalf("plaintext_to_publish: %v", a)
	}
	c := byStage(t, hist, talaris.StagePublishToCallback)
	if c.GetSampleCount() != 7 || finiteBuckets(t, c)[talaris.NumLatencyBuckets-2].GetCumulativeCount() != 3 { // 1.3, 2.6, 3.9 s <= 5 s
		t.Fatalf("publish_to_callback: %v", c)
	}
	for _, mt := range fams[talaris.StageRejectedName].Metric {
		st := stageByName(t, labelValue(mt, "stage"))
		if mt.GetCounter().GetValue() != float64(m.Stages[st].Rejected) {
			t.Fatalf("%v rejected %v", st, mt.GetCounter().GetValue())
		}
	}
}

// TestCollectorMatchesText: the client_golang Collector, gathered by a
// pedantic registry, yields exactly the families the text writer does.
func TestCollectorMatchesText(t *testing.T) {
	src := &fakeSource{m: testMetrics()}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(src, testPool))
	gathered, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if src.calls != 1 {
		t.Fatalf("Metrics called %d times in one scrape", src.calls)
	}
	text := parseText(t, testPool, src.m)
	if len(gathered) != len(text) {
		t.Fatalf("collector %d families, text %d", len(gathered), len(text))
	}
	for _, g := range gathered {
		f := text[g.GetName()]
		if f == nil || f.GetType() != g.GetType() || f.GetHelp() != g.GetHelp() {
			t.Fatalf("%s: text family %v differs", g.GetName(), f)
		}
		if got, want := metricsKey(t, g), metricsKey(t, f); got != want {
			t.Fatalf("%s:\ncollector %s\ntext      %s", g.GetName(), got, want)
		}
	}
	// Another scrape sees the source's new values.
	src.m.Messages++
	gathered, err = reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gathered {
		if g.GetName() == "talaris_messages_total" && g.Metric[0].GetCounter().GetValue() != float64(src.m.Messages) {
			t.Fatalf("second scrape: %v", g.Metric[0])
		}
	}
}

// metricsKey renders a family's metrics canonically: labels, counter or
// gauge value, histogram count, sum and finite buckets; sorted. A label
// with an empty value is left out: Prometheus stores it as no label, and
// the Collector gives a gauge's pool-wide sample conn="" where the text
// writer omits conn.
func metricsKey(t *testing.T, f *dto.MetricFamily) string {
	var out []string
	for _, mt := range f.Metric {
		var b strings.Builder
		var labels []string // in name order: the order has no meaning
		for _, l := range mt.Label {
			if l.GetValue() != "" {
				labels = append(labels, fmt.Sprintf("%s=%q,", l.GetName(), l.GetValue()))
			}
		}
		slices.Sort(labels)
		b.WriteString(strings.Join(labels, ""))
		if c := mt.GetCounter(); c != nil {
			fmt.Fprintf(&b, " %v", c.GetValue())
		}
		if g := mt.GetGauge(); g != nil {
			fmt.Fprintf(&b, " gauge %v", g.GetValue())
		}
		if h := mt.GetHistogram(); h != nil {
			fmt.Fprintf(&b, " n=%d sum=%v", h.GetSampleCount(), h.GetSampleSum())
			for _, bk := range finiteBuckets(t, h) {
				fmt.Fprintf(&b, " %v:%d", bk.GetUpperBound(), bk.GetCumulativeCount())
			}
		}
		out = append(out, b.String())
	}
	slices.Sort(out)
	return strings.Join(out, " | ")
}

// finiteBuckets drops a +Inf bucket (the text parser keeps it, const
// histograms imply it) after checking it equals the sample count.
func finiteBuckets(t *testing.T, h *dto.Histogram) []*dto.Bucket {
	t.Helper()
	bs := h.GetBucket()
	if n := len(bs); n > 0 && math.IsInf(bs[n-1].GetUpperBound(), 1) {
		if bs[n-1].GetCumulativeCount() != h.GetSampleCount() {
			t.Fatalf("+Inf bucket %d, count %d", bs[n-1].GetCumulativeCount(), h.GetSampleCount())
		}
		bs = bs[:n-1]
	}
	return bs
}

func labelValue(mt *dto.Metric, name string) string {
	for _, l := range mt.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func stageByName(t *testing.T, name string) talaris.Stage {
	t.Helper()
	for s := talaris.Stage(0); s < talaris.NumStages; s++ {
		if s.String() == name {
			return s
		}
	}
	t.Fatalf("unknown stage label %q", name)
	return 0
}

func byStage(t *testing.T, f *dto.MetricFamily, s talaris.Stage) *dto.Histogram {
	t.Helper()
	for _, mt := range f.Metric {
		if labelValue(mt, "stage") == s.String() {
			return mt.GetHistogram()
		}
	}
	t.Fatalf("no %v series", s)
	return nil
}
