//go:build linux && cgo

package talaris_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"golang.org/x/sys/unix"
)

// Observability tests: stage stamps taken by the C loop for
// sampled messages, Pool.Metrics, Pool.WritePrometheus parsed with the
// Prometheus text parser, PumpStamped, Config.Logger. Real servers on
// loopback, ws and wss; both TLS backends (go test and
// go test -tags talaris_openssl).

// monoNow is CLOCK_MONOTONIC through a real syscall: the clock the stamps
// claim to use, read independently of the library.
func monoNow(t testing.TB) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		t.Fatal(err)
	}
	return ts.Nano()
}

// stampRun is what a PumpStamped pass over one stream saw.
type stampRun struct {
	msgs, sampled int
	bad           []string // order violations, at most a few
}

// pumpStampedStream dials url, pumps it with PumpStamped until want data
// messages arrived (each checked with chk), then drains the connection's
// final event, checking every sampled message's stamps.
func pumpStampedStream(t *testing.T, p *talaris.Pool, url string, opts *talaris.DialOptions, want int, chk *wstest.Checker) stampRun {
	t.Helper()
	ctx, cancel := dialCtx(t)
	defer cancel()
	before := monoNow(t)
	c, err := p.Dial(ctx, url, opts)
	if err != nil {
		t.Fatalf("Dial %s: %v", url, err)
	}
	var run stampRun
	fn := func(cc talaris.Conn, _ talaris.Opcode, payload []byte, st talaris.Stamps) {
		if cc != c {
			t.Errorf("message for %#x, dialed %#x", cc.ID(), c.ID())
		}
		if err := chk.Check(payload); err != nil && len(run.bad) < 5 {
			run.bad = append(run.bad, err.Error())
		}
		run.msgs++
		if !st.Sampled() {
			if st != (talaris.Stamps{}) && len(run.bad) < 5 {
				run.bad = append(run.bad, fmt.Sprintf("unsampled message with stamps %+v", st))
			}
			return
		}
		run.sampled++
		now := monoNow(t)
		ok := st.CQE >= before && st.CQE <= st.Plaintext && st.Plaintext <= st.Publish &&
			st.Publish <= st.Callback && st.Callback <= now
		if !ok && len(run.bad) < 5 {
			run.bad = append(run.bad, fmt.Sprintf("stamps out of order: %+v (dial %d, now %d)", st, before, now))
		}
	}
	for run.msgs < want {
		if _, err := p.PumpStamped(fn); err != nil {
			t.Fatalf("PumpStamped after %d of %d: %v", run.msgs, want, err)
		}
	}
	drainConns(t, p)
	if len(run.bad) > 0 {
		t.Errorf("%d of %d messages sampled; problems: %s", run.sampled, run.msgs, strings.Join(run.bad, "; "))
	}
	return run
}

// drainConns pumps (without data callbacks expected) until every
// connection of p delivered its final event.
func drainConns(t *testing.T, p *talaris.Pool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for p.ConnCount() > 0 {
		n, err := p.PumpNowait(func(talaris.Conn, talaris.Event) {})
		if err != nil {
			t.Fatalf("draining: %v", err)
		}
		if n == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("hang guard: %d connections still open", p.ConnCount())
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
}

// scrape parses p.WritePrometheus with the Prometheus text parser.
func scrape(t *testing.T, p *talaris.Pool) map[string]*dto.MetricFamily {
	t.Helper()
	var buf bytes.Buffer
	if err := p.WritePrometheus(&buf); err != nil {
		t.Fatalf("WritePrometheus: %v", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("parsing WritePrometheus output: %v\n%s", err, buf.String())
	}
	return fams
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// counterValue returns the value of counter family name, checking its pool
// label.
func counterValue(t *testing.T, fams map[string]*dto.MetricFamily, name, pool string) uint64 {
	t.Helper()
	f := fams[name]
	if f == nil || f.GetType() != dto.MetricType_COUNTER || len(f.GetMetric()) != 1 {
		t.Fatalf("family %s missing or not one counter: %v", name, f)
	}
	m := f.GetMetric()[0]
	if got := labelOf(m, "pool"); got != pool {
		t.Errorf("%s pool label %q, want %q", name, got, pool)
	}
	return uint64(m.GetCounter().GetValue())
}

// stageCounts returns the sample count per stage label of the histogram
// family, checking its shape on the way.
func stageCounts(t *testing.T, fams map[string]*dto.MetricFamily, pool string) map[string]uint64 {
	t.Helper()
	f := fams["talaris_stage_latency_seconds"]
	if f == nil || f.GetType() != dto.MetricType_HISTOGRAM {
		t.Fatalf("talaris_stage_latency_seconds missing or not a histogram: %v", f)
	}
	out := map[string]uint64{}
	for _, m := range f.GetMetric() {
		if got := labelOf(m, "pool"); got != pool {
			t.Errorf("histogram pool label %q, want %q", got, pool)
		}
		h := m.GetHistogram()
		stage := labelOf(m, "stage")
		out[stage] = h.GetSampleCount()
		prev := uint64(0)
		for _, b := range h.GetBucket() {
			if b.GetCumulativeCount() < prev || b.GetCumulativeCount() > h.GetSampleCount() {
				t.Errorf("stage %s: bucket le=%g count %d not cumulative (prev %d, total %d)",
					stage, b.GetUpperBound(), b.GetCumulativeCount(), prev, h.GetSampleCount())
			}
			prev = b.GetCumulativeCount()
		}
		// (cqe_to_plaintext may be all zeros on ws: the parser takes the
		// completion's bytes at once and reuses its stamp.)
		if h.GetSampleCount() > 0 && (h.GetSampleSum() < 0 || h.GetSampleSum() == 0 && stage != "cqe_to_plaintext") {
			t.Errorf("stage %s: %d samples with sum %g", stage, h.GetSampleCount(), h.GetSampleSum())
		}
	}
	for _, s := range []string{"cqe_to_plaintext", "plaintext_to_publish", "publish_to_callback", "cqe_to_callback", "wire_to_callback"} {
		if _, ok := out[s]; !ok {
			t.Errorf("stage %s missing from the histogram family", s)
		}
	}
	return out
}

// TestMetricsPrometheusScrape: a real pool fed by a real server (gorilla
// and coder, ws and wss), pumped with PumpStamped; every sampled message's
// stamps are ordered (cqe <= plaintext <= publish <= callback, all on
// CLOCK_MONOTONIC), and the WritePrometheus scrape, parsed with expfmt,
// counts exactly the sampled messages in every stage histogram, and the
// counters match what was delivered.
func TestMetricsPrometheusScrape(t *testing.T) {
	const n, size = 3000, 48
	for _, tr := range []string{"ws", "wss"} {
		for _, every := range []uint32{1, 7} {
			t.Run(fmt.Sprintf("%s/every%d", tr, every), func(t *testing.T) {
				run := func(t *testing.T, srv *wstest.Server) {
					name := fmt.Sprintf(`feed "%s"/%d`, tr, every) // quotes: the label must be escaped
					cfg := talaris.Config{SampleEvery: every, Name: name}
					if every > 1 {
						// One 4 KiB slot per completion, so the stream's
						// 150 KB take at least 36 of them and one in 7 is
						// stamped (a bundle can carry it all in one or two).
						cfg.BufSize = 4096
						testhook.SetKnobs(&cfg, &testhook.Knobs{NoRecvBundle: true})
					}
					p := newTestPool(t, cfg, hangGuard)
					var opts *talaris.DialOptions
					if tr == "wss" {
						opts = tlsOpts
					}
					spec := streamSpec{n: n, size: size}
					got := pumpStampedStream(t, p, srv.URL+spec.path(), opts, n, wstest.NewChecker(size))
					if got.sampled == 0 {
						t.Fatalf("no message of %d was sampled with SampleEvery %d", got.msgs, every)
					}
					m := p.Metrics()
					if m.Sampled != uint64(got.sampled) {
						t.Errorf("Metrics.Sampled %d, PumpStamped saw %d sampled messages", m.Sampled, got.sampled)
					}
					if every == 1 && testhook.Stats(p).CQEs == 0 {
						t.Errorf("no completions counted: %+v", testhook.Stats(p))
					}
					fams := scrape(t, p)
					counts := stageCounts(t, fams, name)
					for _, s := range []string{"cqe_to_plaintext", "plaintext_to_publish", "publish_to_callback", "cqe_to_callback"} {
						if counts[s] != uint64(got.sampled) {
							t.Errorf("stage %s: histogram count %d, sampled messages %d", s, counts[s], got.sampled)
						}
					}
					if counts["wire_to_callback"] != 0 {
						t.Errorf("wire_to_callback has %d samples; no wire stamps are taken", counts["wire_to_callback"])
					}
					if v := counterValue(t, fams, "talaris_sampled_messages_total", name); v != uint64(got.sampled) {
						t.Errorf("talaris_sampled_messages_total %d, want %d", v, got.sampled)
					}
					if v := counterValue(t, fams, "talaris_messages_total", name); v != n {
						t.Errorf("talaris_messages_total %d, want %d", v, n)
					}
					if v := counterValue(t, fams, "talaris_bytes_total", name); v != n*size {
						t.Errorf("talaris_bytes_total %d, want %d", v, n*size)
					}
					if v := counterValue(t, fams, "talaris_wire_bytes_total", name); v < n*(size+2) {
						t.Errorf("talaris_wire_bytes_total %d, less than the %d frame bytes", v, n*(size+2))
					}
					if v := counterValue(t, fams, "talaris_completions_total", name); v == 0 {
						t.Error("talaris_completions_total is 0")
					}
					if v := counterValue(t, fams, "talaris_reconnects_total", name); v != 0 {
						t.Errorf("talaris_reconnects_total %d without reconnects", v)
					}
					// The sampling rate: never more than one sample per completion.
					if comps := counterValue(t, fams, "talaris_completions_total", name); uint64(got.sampled) > comps {
						t.Errorf("%d samples from %d completions", got.sampled, comps)
					}
					if tr == "wss" && m.Stages[talaris.StageCQEToPlaintext].Max == 0 {
						t.Errorf("wss: cqe_to_plaintext is always 0, but TLS decryption lies between: %+v", m.Stages[talaris.StageCQEToPlaintext])
					}
					for i := range talaris.NumStages - 1 {
						h := m.Stages[i]
						mean := h.Sum / time.Duration(max(h.Count, 1))
						if !(h.Min <= h.P50 && h.P50 <= h.P99 && h.P99 <= h.Max && h.Min <= mean && mean <= h.Max) {
							t.Errorf("stage %v: inconsistent summary %+v", talaris.Stage(i), h)
						}
					}
					t.Logf("%d/%d sampled; cqe_to_callback p50 %v p99 %v max %v", got.sampled, got.msgs,
						m.Stages[talaris.StageCQEToCallback].P50, m.Stages[talaris.StageCQEToCallback].P99, m.Stages[talaris.StageCQEToCallback].Max)
				}
				if tr == "wss" {
					forEachTLSServer(t, serverTLS(t, testCertFile, testKeyFile, 0, 0), run)
				} else {
					forEachServer(t, run)
				}
			})
		}
	}
}

// TestMetricsSamplingOff: with the default SampleEvery (0) no message is
// stamped, the histograms stay empty and the counters still count.
func TestMetricsSamplingOff(t *testing.T) {
	const n, size = 500, 16
	srv := wstest.NewGorilla().Start(t)
	p := newTestPool(t, talaris.Config{}, hangGuard)
	spec := streamSpec{n: n, size: size}
	got := pumpStampedStream(t, p, srv.URL+spec.path(), nil, n, wstest.NewChecker(size))
	if got.sampled != 0 {
		t.Errorf("%d messages stamped with sampling off", got.sampled)
	}
	m := p.Metrics()
	for i, h := range m.Stages {
		if h.Count != 0 {
			t.Errorf("stage %v has %d samples with sampling off", talaris.Stage(i), h.Count)
		}
	}
	if m.Messages != n || m.Bytes != n*size || m.Sampled != 0 {
		t.Errorf("Metrics: %d messages, %d bytes, %d sampled; want %d, %d, 0", m.Messages, m.Bytes, m.Sampled, n, n*size)
	}
	fams := scrape(t, p)
	for s, c := range stageCounts(t, fams, "") {
		if c != 0 {
			t.Errorf("stage %s: %d samples scraped with sampling off", s, c)
		}
	}
}

// TestConfigName: a Name that is not UTF-8 cannot be a label value.
func TestConfigName(t *testing.T) {
	if _, err := talaris.NewPool(talaris.Config{Name: "bad\xff"}); !errors.Is(err, talaris.ErrInvalidConfig) {
		t.Errorf("NewPool with a non-UTF-8 Name: %v, want ErrInvalidConfig", err)
	}
}

// TestMetricsInterval: MetricsInterval returns what was sampled since the
// previous call and starts a new interval; Metrics stays cumulative.
func TestMetricsInterval(t *testing.T) {
	p := newTestPool(t, talaris.Config{SampleEvery: 1}, hangGuard)
	c, err := p.DialMemory()
	if err != nil {
		t.Fatal(err)
	}
	frames, _ := memFrames(64)
	sampled := 0
	fn := func(_ talaris.Conn, _ talaris.Opcode, _ []byte, st talaris.Stamps) {
		if st.Sampled() {
			sampled++
		}
	}
	round := func(injects int) int {
		before := sampled
		got := 0
		for range injects {
			if err := c.Inject(frames); err != nil {
				t.Fatal(err)
			}
			for want := got + 64; got < want; {
				k, err := p.PumpStamped(fn)
				if err != nil {
					t.Fatal(err)
				}
				got += k
			}
		}
		return sampled - before
	}
	first := round(5)
	if first == 0 {
		t.Fatal("nothing sampled with SampleEvery 1")
	}
	iv := p.MetricsInterval()
	if iv.Sampled != uint64(first) || iv.Stages[talaris.StageCQEToCallback].Count != uint64(first) {
		t.Errorf("first interval: %d sampled, %d cqe_to_callback; want %d", iv.Sampled, iv.Stages[talaris.StageCQEToCallback].Count, first)
	}
	second := round(3)
	iv = p.MetricsInterval()
	if iv.Sampled != uint64(second) {
		t.Errorf("second interval: %d sampled, want %d", iv.Sampled, second)
	}
	if iv = p.MetricsInterval(); iv.Sampled != 0 {
		t.Errorf("empty interval: %d sampled", iv.Sampled)
	}
	// (tl_evq_publish stores the pool's counts before the tail, so the
	// batches pumped above are all in.)
	if m := p.Metrics(); m.Sampled != uint64(first+second) || m.Messages != 8*64 {
		t.Errorf("cumulative: %d sampled, %d messages; want %d, %d", m.Sampled, m.Messages, first+second, 8*64)
	}
}

// TestPumpStampedAllocs: PumpStamped allocates nothing per message, with
// sampling off and with every completion sampled (the stamps are folded
// into preallocated histograms).
func TestPumpStampedAllocs(t *testing.T) {
	const n = 256
	for _, every := range []uint32{0, 1} {
		t.Run(fmt.Sprintf("every%d", every), func(t *testing.T) {
			p := newTestPool(t, talaris.Config{SampleEvery: every}, hangGuard)
			c, err := p.DialMemory()
			if err != nil {
				t.Fatal(err)
			}
			frames, _ := memFrames(n)
			var got, sampled int
			fn := func(_ talaris.Conn, _ talaris.Opcode, _ []byte, st talaris.Stamps) {
				got++
				if st.Sampled() {
					sampled++
				}
			}
			run := func() {
				if err := c.Inject(frames); err != nil {
					t.Fatal(err)
				}
				for want := got + n; got < want; {
					if _, err := p.PumpStamped(fn); err != nil {
						t.Fatal(err)
					}
				}
			}
			run()
			if a := testing.AllocsPerRun(200, run); a != 0 {
				t.Errorf("PumpStamped: %v allocations per run of %d messages, want 0", a, n)
			}
			if (every != 0) != (sampled > 0) {
				t.Errorf("SampleEvery %d: %d of %d messages sampled", every, sampled, got)
			}
		})
	}
}

// TestMetricsRaceClose: Metrics, MetricsInterval, WritePrometheus and
// PumpStamped while Conn.Close and Pool.Close run from other goroutines,
// and after the connection and the pool ended (ws and wss; run with -race).
func TestMetricsRaceClose(t *testing.T) {
	for _, tr := range []string{"ws", "wss"} {
		t.Run(tr, func(t *testing.T) {
			var srv *wstest.Server
			var opts *talaris.DialOptions
			if tr == "wss" {
				srv = wstest.NewGorilla().StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
				opts = tlsOpts
			} else {
				srv = wstest.NewGorilla().Start(t)
			}
			for round := range 4 {
				// Rounds 0 and 2 without sampling: Metrics then reads only
				// the loop's counters, which Close frees.
				// A short CloseTimeout: Pool.Close waits for the flooding
				// server's close echo, which nobody pumps once it closed.
				p := newTestPool(t, talaris.Config{SampleEvery: uint32(round % 2 * 3), Name: "race",
					CloseTimeout: 250 * time.Millisecond}, hangGuard)
				ctx, cancel := dialCtx(t)
				c, err := p.Dial(ctx, srv.URL+"/stream?n=1000000&size=32&op=binary", opts)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				var delivered int
				pumpErr := make(chan error, 1)
				go func() {
					for {
						_, err := p.PumpStamped(func(talaris.Conn, talaris.Opcode, []byte, talaris.Stamps) { delivered++ })
						if poolEmptied(err) {
							// the connection ended before Pool.Close ran
							continue
						}
						if err != nil {
							pumpErr <- err
							return
						}
					}
				}()
				stop := make(chan struct{})
				var wg sync.WaitGroup
				for range 2 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var buf bytes.Buffer
						for {
							select {
							case <-stop:
								return
							default:
							}
							_ = p.Metrics()
							_ = p.MetricsInterval()
							buf.Reset()
							if err := p.WritePrometheus(&buf); err != nil {
								t.Errorf("WritePrometheus: %v", err)
								return
							}
						}
					}()
				}
				time.Sleep(time.Duration(5+10*round) * time.Millisecond)
				wg.Add(2)
				go func() { defer wg.Done(); c.Close(1000, "bye") }()
				go func() { defer wg.Done(); time.Sleep(time.Duration(round) * time.Millisecond); p.Close() }()
				if err := <-pumpErr; !errors.Is(err, talaris.ErrPoolClosed) {
					t.Errorf("PumpStamped returned %v, want ErrPoolClosed", err)
				}
				close(stop)
				wg.Wait()
				// After the pool ended: the counters keep their final values.
				m := p.Metrics()
				if m.Messages < uint64(delivered) {
					t.Errorf("after Close: Metrics.Messages %d < %d delivered", m.Messages, delivered)
				}
				var buf bytes.Buffer
				if err := p.WritePrometheus(&buf); err != nil || !strings.Contains(buf.String(), `talaris_messages_total{pool="race"}`) {
					t.Errorf("WritePrometheus after Close: %v\n%.300s", err, buf.String())
				}
				if _, err := p.PumpStamped(func(talaris.Conn, talaris.Opcode, []byte, talaris.Stamps) {}); !errors.Is(err, talaris.ErrPoolClosed) {
					t.Errorf("PumpStamped after Close: %v, want ErrPoolClosed", err)
				}
				if err := p.WritePrometheus(nil); err == nil {
					t.Error("WritePrometheus(nil) returned nil")
				}
			}
		})
	}
}

// TestPumpStampedAfterConnEnded: PumpStamped on a pool whose connection
// already ended delivers the remaining messages (stamped when sampled)
// and the final event is consumed; a second pumper gets
// ErrConcurrentPump.
func TestPumpStampedAfterConnEnded(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	p := newTestPool(t, talaris.Config{SampleEvery: 1}, hangGuard)
	ctx, cancel := dialCtx(t)
	defer cancel()
	const n = 200
	c, err := p.Dial(ctx, srv.URL+fmt.Sprintf("/stream?n=%d&size=8&op=text", n), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Wait for the stream to end while nobody pumps: everything, the
	// final event included, waits in the ring.
	deadline := time.Now().Add(hangGuard)
	for c.State() != talaris.StateClosed {
		if time.Now().After(deadline) {
			t.Fatal("hang guard: stream did not end")
		}
		time.Sleep(time.Millisecond)
	}
	chk := wstest.NewTextChecker(8)
	got, sampled := 0, 0
	for got < n {
		k, err := p.PumpStamped(func(_ talaris.Conn, op talaris.Opcode, b []byte, st talaris.Stamps) {
			if op != talaris.OpText {
				t.Errorf("op %v", op)
			}
			if err := chk.Check(b); err != nil {
				t.Error(err)
			}
			if st.Sampled() {
				sampled++
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		got += k
	}
	drainConns(t, p)
	if sampled == 0 || p.Metrics().Sampled != uint64(sampled) {
		t.Errorf("%d sampled, Metrics.Sampled %d", sampled, p.Metrics().Sampled)
	}
	if err := c.SendText([]byte("x")); err == nil {
		t.Error("SendText on an ended connection succeeded")
	}
}

// TestLoggerLifecycle: Config.Logger gets dialing, TLS done, open and
// closed (with the code) at Info for a wss stream, a failed TLS dial at
// Warn with its class, and no record per message.
func TestLoggerLifecycle(t *testing.T) {
	var out syncBuffer
	logger := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv := wstest.NewGorilla().StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
	p := newTestPool(t, talaris.Config{Logger: logger, Name: "logs"}, hangGuard)
	const n = 500
	spec := streamSpec{n: n, size: 16}
	got := pumpStampedStream(t, p, srv.URL+spec.path(), tlsOpts, n, wstest.NewChecker(16))
	if got.msgs != n {
		t.Fatalf("%d messages", got.msgs)
	}
	// A dial that fails TLS verification (no CA given: the test CA is unknown).
	ctx, cancel := dialCtx(t)
	defer cancel()
	if _, err := p.Dial(ctx, srv.URL+"/echo", nil); !errors.Is(err, talaris.ErrTLSUnknownCA) {
		t.Fatalf("Dial without the CA: %v, want ErrTLSUnknownCA", err)
	}
	drainConns(t, p)
	recs := out.records(t)
	if len(recs) > 12 {
		t.Errorf("%d log records for %d messages: the per-message path logs", len(recs), n)
	}
	for _, want := range []struct{ msg, level string }{
		{"talaris: dialing", "INFO"}, {"talaris: tls handshake done", "INFO"}, {"talaris: open", "INFO"},
		{"talaris: closed", "INFO"}, {"talaris: connection failed", "WARN"},
	} {
		r := findRecord(recs, want.msg)
		if r == nil {
			t.Errorf("no %q record in %v", want.msg, recs)
			continue
		}
		if r["level"] != want.level || r["pool"] != "logs" {
			t.Errorf("%q: level %v pool %v, want %s logs", want.msg, r["level"], r["pool"], want.level)
		}
	}
	if r := findRecord(recs, "talaris: closed"); r != nil && r["code"] != float64(1000) {
		t.Errorf("closed record code %v, want 1000", r["code"])
	}
	if r := findRecord(recs, "talaris: connection failed"); r != nil &&
		(r["class"] != "tls_unknown_ca" || r["category"] != "tls") {
		t.Errorf("failure record class %v category %v, want tls_unknown_ca tls", r["class"], r["category"])
	}
	// A dial refused before the loop sees it (bad URL) is logged at Dial.
	if _, err := p.Dial(ctx, "http://example.com/", nil); !errors.Is(err, talaris.ErrBadURL) {
		t.Fatalf("bad URL: %v", err)
	}
	if r := findRecord(out.records(t), "talaris: dial failed"); r == nil || r["level"] != "WARN" || r["class"] != "bad_url" {
		t.Errorf("dial failed record %v", r)
	} else if _, ok := r["category"]; ok {
		t.Errorf("dial failed record %v: a failure outside TLS and the handshake carries no category", r)
	}
	// A connection's records name it by slot and generation, as numbers.
	if r := findRecord(recs, "talaris: open"); r != nil {
		if _, ok := r["slot"].(float64); !ok {
			t.Errorf("open record %v: no numeric slot", r)
		}
		if g, ok := r["gen"].(float64); !ok || g < 1 {
			t.Errorf("open record %v: no generation", r)
		}
	}
}

// gaugeSamples returns gauge family name's samples by conn label ("" for
// the pool's), checking the family's type and pool label.
func gaugeSamples(t *testing.T, fams map[string]*dto.MetricFamily, name, pool string) map[string]uint64 {
	t.Helper()
	f := fams[name]
	if f == nil || f.GetType() != dto.MetricType_GAUGE {
		t.Fatalf("family %s missing or not a gauge: %v", name, f)
	}
	out := map[string]uint64{}
	for _, m := range f.GetMetric() {
		if got := labelOf(m, "pool"); got != pool {
			t.Errorf("%s pool label %q, want %q", name, got, pool)
		}
		conn := labelOf(m, "conn")
		if _, dup := out[conn]; dup {
			t.Errorf("%s: two samples with conn=%q", name, conn)
		}
		out[conn] = uint64(m.GetGauge().GetValue())
	}
	return out
}

// TestMetricsGauges: two connections labelled "orders" to a server that
// does not read, saturated so their send queues stand still, and one
// unlabelled connection to a server that reads. Metrics and the
// WritePrometheus scrape agree: 3 connections open (2 under "orders"),
// the queued bytes are the handles' ConnStats.SendQueued summed and they
// all sit under "orders", whose queued messages fit those bytes; no
// series for the unlabelled connection. After Close every gauge is 0 and
// the per-label series are gone.
func TestMetricsGauges(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		const pool, label, size = "desk-a", "orders", 16 << 10
		p := newTestPool(t, talaris.Config{Name: pool, MaxSendQueue: 4 << 20, CloseTimeout: 200 * time.Millisecond}, hangGuard)
		stalled := newSink(t, useTLS, false, 0) // never reads
		reading := newSink(t, useTLS, true, 0)
		var opts talaris.DialOptions
		if stalled.opts != nil {
			opts = *stalled.opts // a copy: the TLS options are shared
		}
		opts.Label = label
		ctx, cancel := dialCtx(t)
		defer cancel()
		var orders []talaris.Conn
		for range 2 {
			c, err := p.Dial(ctx, stalled.url, &opts)
			if err != nil {
				t.Fatalf("Dial %s with Label %q: %v", stalled.url, label, err)
			}
			orders = append(orders, c)
		}
		plain := dialSink(t, p, reading)
		for i, c := range orders {
			next := 0
			saturate(t, c, &next, size)
			t.Logf("orders[%d]: %d messages accepted, stats %+v", i, next, c.Stats())
		}

		m := p.Metrics()
		open := 0
		for _, c := range append(orders, plain) {
			if c.State() == talaris.StateOpen {
				open++
			}
		}
		queued := orders[0].Stats().SendQueued + orders[1].Stats().SendQueued
		if open != 3 || m.ConnsOpen != uint64(open) {
			t.Errorf("ConnsOpen %d; %d of 3 handles report StateOpen", m.ConnsOpen, open)
		}
		if len(m.Conns) != 1 || m.Conns[0].Label != label {
			t.Fatalf("Conns %+v, want one entry for %q", m.Conns, label)
		}
		g := m.Conns[0]
		if g.ConnsOpen != 2 {
			t.Errorf("Conns[%q].ConnsOpen %d, want 2", label, g.ConnsOpen)
		}
		if queued == 0 || g.SendQueuedBytes != queued || m.SendQueuedBytes != queued {
			t.Errorf("SendQueuedBytes: pool %d, %q %d; the handles' SendQueued sum to %d (want equal, > 0)",
				m.SendQueuedBytes, label, g.SendQueuedBytes, queued)
		}
		// Every queued message is size bytes; at most one of them per
		// connection is partly written (its units are the unwritten rest).
		if msgs := g.SendQueuedMessages; msgs == 0 || m.SendQueuedMessages != msgs ||
			g.SendQueuedBytes > msgs*size || g.SendQueuedBytes+2*size <= msgs*size {
			t.Errorf("SendQueuedMessages: pool %d, %q %d, for %d queued bytes of %d-byte messages",
				m.SendQueuedMessages, label, msgs, g.SendQueuedBytes, size)
		}

		fams := scrape(t, p)
		for name, want := range map[string][2]uint64{
			"talaris_conns_open":           {m.ConnsOpen, g.ConnsOpen},
			"talaris_send_queued_bytes":    {m.SendQueuedBytes, g.SendQueuedBytes},
			"talaris_send_queued_messages": {m.SendQueuedMessages, g.SendQueuedMessages},
		} {
			got := gaugeSamples(t, fams, name, pool)
			if len(got) != 2 || got[""] != want[0] || got[label] != want[1] {
				t.Errorf("%s scraped %v, want {\"\": %d, %q: %d}", name, got, want[0], label, want[1])
			}
		}
		if c := counterValue(t, fams, "talaris_messages_total", pool); c != m.Messages {
			t.Errorf("talaris_messages_total %d, Metrics.Messages %d", c, m.Messages) // counters stay counters
		}

		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		m = p.Metrics()
		if m.ConnsOpen != 0 || m.SendQueuedBytes != 0 || m.SendQueuedMessages != 0 || m.Conns != nil {
			t.Errorf("after Close: ConnsOpen %d, SendQueuedBytes %d, SendQueuedMessages %d, Conns %+v; want zero",
				m.ConnsOpen, m.SendQueuedBytes, m.SendQueuedMessages, m.Conns)
		}
		fams = scrape(t, p)
		for _, name := range []string{"talaris_conns_open", "talaris_send_queued_bytes", "talaris_send_queued_messages"} {
			if got := gaugeSamples(t, fams, name, pool); len(got) != 1 || got[""] != 0 {
				t.Errorf("%s after Close: %v, want only the pool's sample, 0", name, got)
			}
		}
	})
}

// TestDialLabelInvalid: a Label that is too long or not printable fails
// the dial with ErrInvalidConfig naming the field, before any connection.
func TestDialLabelInvalid(t *testing.T) {
	p := newTestPool(t, talaris.Config{}, hangGuard)
	for _, bad := range []string{strings.Repeat("x", 65), "line\nbreak", "bad\xff"} {
		_, err := p.DialAsync("ws://127.0.0.1:1/", &talaris.DialOptions{Label: bad})
		if !errors.Is(err, talaris.ErrInvalidConfig) || !strings.Contains(err.Error(), "DialOptions.Label") {
			t.Errorf("Label %q: %v, want ErrInvalidConfig naming DialOptions.Label", bad, err)
		}
	}
	if n := p.ConnCount(); n != 0 {
		t.Errorf("ConnCount %d after refused dials", n)
	}
}
