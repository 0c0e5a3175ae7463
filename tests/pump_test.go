//go:build linux && cgo

package talaris_test

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
)

// Proofs of the handoff invariants: no per-message cgo call, no
// per-message allocation, one pumper at a time, dials that do not disturb
// the pumper.

// TestHandoffCgoCalls receives 1M messages from a real server and counts
// the cgo calls the process made meanwhile: fewer than one per 1000
// messages (the pump reads the ring with atomics; no cgo per message).
// With Loops 2 and 3, one stream per loop (1M messages in all): draining
// several event rings and sleeping on all of them adds no cgo call. The
// nobundle row receives without recv bundles (testhook.Knobs.NoRecvBundle; bundles are the default).
// The inline row (Config.Tuning.InlineLoop) runs the loop from the pump: one cgo
// call per batch the loop publishes (PoolStats.Batches), none per message
// inside it. With this in-process feed of 16-byte messages a batch is
// about 13 messages (measured: the log line), so that row is bounded by
// the batches, not per 1000 messages; the default rows stay at 0 calls.
func TestHandoffCgoCalls(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	for _, loops := range []int{1, 2, 3, -1, -2} {
		name, cfg := fmt.Sprintf("loops%d", loops), talaris.Config{Loops: loops}
		switch loops {
		case -1:
			loops, name, cfg = 1, "nobundle", testhook.WithKnobs(talaris.Config{Loops: 1}, testhook.Knobs{NoRecvBundle: true})
		case -2:
			loops, name, cfg = 1, "inline", talaris.Config{Loops: 1, Tuning: talaris.Tuning{InlineLoop: true}}
		}
		t.Run(name, func(t *testing.T) {
			p := newTestPool(t, cfg, 3*hangGuard)
			spec := streamSpec{n: scaled(1_000_000) / loops, size: 16}
			sts := map[talaris.Conn]*streamState{}
			for range loops {
				sts[dial(t, p, srv.URL+spec.path())] = newStreamState(spec)
			}
			finals := 0
			before := runtime.NumCgoCall()
			pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
				if st := sts[cc]; st != nil {
					st.on(ev)
					if st.final != nil && (ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError) {
						finals++
					}
				}
			}, func() bool { return finals == loops }, nil)
			calls := runtime.NumCgoCall() - before

			var msgs int64
			for c, st := range sts {
				st.verify(t, fmt.Sprintf("stream on slot %d", c.Slot()))
				msgs += int64(st.chk.Count())
			}
			st := testhook.Stats(p)
			t.Logf("%d messages, %d cgo calls (%.1f messages per call), stats %+v", msgs, calls,
				float64(msgs)/float64(max(calls, 1)), st)
			if cfg.Tuning.InlineLoop {
				// One per published batch, and a few for waits that end
				// empty (the wait's cap) or find the batch's events gone.
				if calls > int64(st.Batches)+64 {
					t.Errorf("%d cgo calls for %d batches (%d messages): want at most one per batch", calls, st.Batches, msgs)
				}
			} else if calls*1000 >= msgs {
				t.Errorf("%d cgo calls for %d messages: want fewer than 1 per 1000", calls, msgs)
			}
		})
	}
}

// TestPumpAllocs: pumping (Inject, then the pump variants dispatching data
// messages to a callback) allocates nothing per call; with Loops 2 and 3
// also while draining one memory connection per loop.
func TestPumpAllocs(t *testing.T) {
	for _, loops := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("loops%d", loops), func(t *testing.T) { testPumpAllocs(t, talaris.Config{Loops: loops}) })
	}
	// The inline loop: the pump's cgo call per batch allocates nothing.
	t.Run("inline", func(t *testing.T) {
		testPumpAllocs(t, talaris.Config{Loops: 1, Tuning: talaris.Tuning{InlineLoop: true}})
	})
}

func testPumpAllocs(t *testing.T, cfg talaris.Config) {
	const n = 256
	loops := cfg.Loops
	p := newTestPool(t, cfg, hangGuard)
	conns := make([]talaris.Conn, loops)
	for i := range conns {
		var err error
		if conns[i], err = p.DialMemory(); err != nil {
			t.Fatal(err)
		}
	}
	frames, _ := memFrames(n / loops)
	want1 := (n / loops) * loops // messages per run
	var got int
	var bytesIn int
	dataFn := func(_ talaris.Conn, _ talaris.Opcode, b []byte) { got++; bytesIn += len(b) }
	evFn := func(_ talaris.Conn, ev talaris.Event) {
		if ev.Kind == talaris.EventText || ev.Kind == talaris.EventBinary {
			got++
			bytesIn += len(ev.Payload)
		}
	}
	inject := func() {
		for _, c := range conns {
			if err := c.Inject(frames); err != nil {
				t.Fatal(err)
			}
		}
	}
	runs := map[string]func(){
		"PumpData": func() {
			inject()
			for want := got + want1; got < want; {
				if _, err := p.PumpData(dataFn); err != nil {
					t.Fatal(err)
				}
			}
		},
		"Pump": func() {
			inject()
			for want := got + want1; got < want; {
				if _, err := p.Pump(evFn); err != nil {
					t.Fatal(err)
				}
			}
		},
		"PumpDataNowait": func() {
			inject()
			for want := got + want1; got < want; {
				if _, err := p.PumpDataNowait(dataFn); err != nil {
					t.Fatal(err)
				}
			}
		},
	}
	for _, name := range []string{"PumpData", "Pump", "PumpDataNowait"} {
		run := runs[name]
		run() // warm up (the EventOpen, first-touch of ring memory)
		if a := testing.AllocsPerRun(200, run); a != 0 {
			t.Errorf("%s: %v allocations per run of %d messages, want 0", name, a, n)
		}
	}
	if got == 0 || bytesIn == 0 {
		t.Fatal("nothing delivered")
	}
}

// TestConcurrentPump: a second goroutine pumping while one pumps gets
// ErrConcurrentPump, with every pump variant, and no data race. The racing
// pumpers must have overlapped (one refused at least once): the stream is
// run again until they did (at most 20 attempts), else the test fails.
func TestConcurrentPump(t *testing.T) {
	t.Run("blocked", func(t *testing.T) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		// An idle connection keeps the first Pump asleep until Close.
		release := make(chan struct{})
		defer close(release)
		srv := wstest.NewRaw(func(c *wstest.RawConn) { <-release }).Start(t)
		dial(t, p, srv.URL)
		// Dial returns once the state word says open; the EventOpen may
		// reach the ring a moment later, so take it with a blocking pump.
		var kind talaris.EventKind
		if n, err := p.Pump(func(_ talaris.Conn, ev talaris.Event) { kind = ev.Kind }); err != nil || n != 1 || kind != talaris.EventOpen {
			t.Fatalf("the open: %d events (last %v), %v", n, kind, err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := p.Pump(func(talaris.Conn, talaris.Event) {}) // an idle connection: blocks until Close
			errc <- err
		}()
		deadline := time.Now().Add(hangGuard)
		for testhook.PumpClaim(p) != 1 {
			select {
			case err := <-errc:
				t.Fatalf("the first Pump returned before Close: %v", err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("the first pumper never started")
			}
			time.Sleep(time.Millisecond)
		}
		nop := func(talaris.Conn, talaris.Opcode, []byte) {}
		checks := map[string]func() (int, error){
			"Pump":           func() (int, error) { return p.Pump(func(talaris.Conn, talaris.Event) {}) },
			"PumpData":       func() (int, error) { return p.PumpData(nop) },
			"PumpDataNowait": func() (int, error) { return p.PumpDataNowait(nop) },
			"PumpNowait":     func() (int, error) { return p.PumpNowait(func(talaris.Conn, talaris.Event) {}) },
		}
		for name, fn := range checks {
			if n, err := fn(); !errors.Is(err, talaris.ErrConcurrentPump) || n != 0 {
				t.Errorf("%s while another goroutine pumps: %d, %v; want ErrConcurrentPump", name, n, err)
			}
		}
		p.Close()
		if err := <-errc; !errors.Is(err, talaris.ErrPoolClosed) {
			t.Errorf("the blocked Pump returned %v after Close, want ErrPoolClosed", err)
		}
		if _, err := p.PumpDataNowait(nop); !errors.Is(err, talaris.ErrPoolClosed) {
			t.Errorf("PumpDataNowait after Close: %v, want ErrPoolClosed", err)
		}
	})
	t.Run("racing", func(t *testing.T) {
		// Two goroutines pump the same live stream as fast as they can.
		// Every batch is delivered by exactly one of them, in order.
		srv := wstest.NewGorilla().Start(t)
		const attempts = 20
		var refused [2]int
		for a := 1; a <= attempts; a++ {
			refused = racingPumpers(t, srv)
			t.Logf("attempt %d: refused %v", a, refused)
			if t.Failed() || refused[0]+refused[1] > 0 {
				return
			}
		}
		t.Fatalf("in %d attempts of %d messages the two pumpers never overlapped (no ErrConcurrentPump): the race never happened", attempts, scaled(100000))
	})
}

// racingPumpers pumps one stream from srv with two goroutines at once and
// returns how often each was refused with ErrConcurrentPump.
func racingPumpers(t *testing.T, srv *wstest.Server) [2]int {
	t.Helper()
	p := newTestPool(t, testhook.WithKnobs(talaris.Config{}, testhook.Knobs{EventRingSize: 256}), hangGuard)
	defer p.Close()
	spec := streamSpec{n: scaled(100000), size: 24}
	c := dial(t, p, srv.URL+spec.path())
	var mu sync.Mutex // the callbacks never overlap; the mutex makes -race agree
	st := newStreamState(spec)
	st.opened = true
	var done atomic.Bool
	var refused [2]int
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done.Load() {
				_, err := p.PumpNowait(func(cc talaris.Conn, ev talaris.Event) {
					if !mu.TryLock() {
						t.Error("two callbacks ran at once")
						return
					}
					defer mu.Unlock()
					if cc == c && ev.Kind != talaris.EventOpen {
						st.on(ev)
						if st.final != nil {
							done.Store(true)
						}
					}
				})
				switch {
				case errors.Is(err, talaris.ErrConcurrentPump):
					refused[g]++
				case err != nil:
					t.Errorf("pumper %d: %v", g, err)
					return
				}
				runtime.Gosched()
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	st.verify(t, "racing pumpers")
	return refused
}
