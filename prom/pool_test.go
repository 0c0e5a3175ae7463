//go:build linux && cgo

package prom

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/ws"
)

// TestCollectorRealPool: the Collector on a real Pool. A memory connection
// runs the C loop's parser, event ring, stamp table and pump exactly as a
// socket does (an Inject is its completion); the gathered histograms count
// exactly the messages PumpStamped saw stamped, the counters match what
// was delivered, and the Collector and Pool.WritePrometheus agree series
// for series.
func TestCollectorRealPool(t *testing.T) {
	const name = "mem-feed"
	p, err := talaris.NewPool(talaris.Config{SampleEvery: 2, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := p.DialMemory()
	if err != nil {
		t.Fatal(err)
	}
	const injects, perInject = 40, 50
	var frames []byte
	for i := range perInject {
		frames = ws.AppendFrame(frames, true, ws.OpText, []byte(fmt.Sprintf(`{"id":%d}`, i)))
	}
	var msgs, sampled int
	var payloadBytes uint64
	for range injects {
		if err := c.Inject(frames); err != nil {
			t.Fatal(err)
		}
		for want := msgs + perInject; msgs < want; {
			if _, err := p.PumpStamped(func(_ talaris.Conn, _ talaris.Opcode, b []byte, st talaris.Stamps) {
				msgs++
				payloadBytes += uint64(len(b))
				if st.Sampled() {
					sampled++
					if !(st.CQE <= st.Plaintext && st.Plaintext <= st.Publish && st.Publish <= st.Callback) {
						t.Errorf("stamps out of order: %+v", st)
					}
				}
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// One Inject in two is sampled, and its first message carries the stamps.
	if sampled != injects/2 {
		t.Errorf("%d messages sampled from %d injects with SampleEvery 2, want %d", sampled, injects, injects/2)
	}

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(NewCollector(p, name))
	gathered, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := p.WritePrometheus(&buf); err != nil {
		t.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	text, err := parser.TextToMetricFamilies(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(gathered) != len(text) {
		t.Fatalf("collector %d families, WritePrometheus %d", len(gathered), len(text))
	}
	for _, g := range gathered {
		f := text[g.GetName()]
		if f == nil {
			t.Fatalf("%s missing from WritePrometheus", g.GetName())
		}
		if got, want := metricsKey(t, g), metricsKey(t, f); got != want {
			t.Errorf("%s:\ncollector       %s\nWritePrometheus %s", g.GetName(), got, want)
		}
		for _, mt := range g.Metric {
			if labelValue(mt, "pool") != name {
				t.Errorf("%s: pool label %q", g.GetName(), labelValue(mt, "pool"))
			}
		}
		switch g.GetName() {
		case talaris.StageLatencyName:
			for _, mt := range g.Metric {
				want := uint64(sampled)
				if labelValue(mt, "stage") == talaris.StageWireToCallback.String() {
					want = 0
				}
				if n := mt.GetHistogram().GetSampleCount(); n != want {
					t.Errorf("stage %s: %d samples, want %d", labelValue(mt, "stage"), n, want)
				}
			}
		case "talaris_messages_total":
			if v := g.Metric[0].GetCounter().GetValue(); v != float64(msgs) {
				t.Errorf("talaris_messages_total %v, delivered %d", v, msgs)
			}
		case "talaris_bytes_total":
			if v := g.Metric[0].GetCounter().GetValue(); v != float64(payloadBytes) {
				t.Errorf("talaris_bytes_total %v, delivered %d", v, payloadBytes)
			}
		case "talaris_sampled_messages_total":
			if v := g.Metric[0].GetCounter().GetValue(); v != float64(sampled) {
				t.Errorf("talaris_sampled_messages_total %v, want %d", v, sampled)
			}
		}
	}
}
