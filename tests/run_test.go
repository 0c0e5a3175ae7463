//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
	"golang.org/x/sys/unix"
)

// Pool.Run and Pool.RunData: the pump a service runs until its context
// ends or the Pool closes, which waits (asleep) while the pool has no
// connection.

// bgRun is a Run (or RunData) on its own goroutine: its callbacks' events
// in evs (copied), its thread's id once a callback ran, its result in done.
type bgRun struct {
	cancel context.CancelFunc
	evs    chan recorded
	done   chan error
	tid    atomic.Int32
}

// startRun starts p.Run on a goroutine of its own with a context
// cancelled by bgRun.cancel (or parent's end), after the pump-sleep count
// was read: waitAsleep then knows it slept since.
func startRun(t *testing.T, p *talaris.Pool, parent context.Context) *bgRun {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	t.Cleanup(cancel)
	r := &bgRun{cancel: cancel, evs: make(chan recorded, 1024), done: make(chan error, 1)}
	go func() {
		r.done <- p.Run(ctx, func(c talaris.Conn, ev talaris.Event) {
			r.tid.CompareAndSwap(0, int32(unix.Gettid()))
			r.evs <- recorded{c: c, kind: ev.Kind, data: string(ev.Payload), code: ev.Code, err: ev.Err}
		})
	}()
	return r
}

// waitAsleep waits until p's pump claim is taken (by r), the pump slept
// more than s0 times (s0: the count before whatever r is to sleep after)
// and, once a callback told r's thread, that thread sleeps: r is in its
// wait.
func (r *bgRun) waitAsleep(t *testing.T, p *talaris.Pool, s0 uint64) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for testhook.PumpClaim(p) != 1 || testhook.Stats(p).PumpSleeps <= s0 || !r.sleeping() {
		select {
		case err := <-r.done:
			t.Fatalf("Run returned before it slept: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("Run never went to sleep")
		}
		time.Sleep(time.Millisecond)
	}
}

// sleeping reports whether r's thread is asleep (state S in
// /proc/self/task/<tid>/stat); true before a callback told the thread.
func (r *bgRun) sleeping() bool {
	tid := r.tid.Load()
	if tid == 0 {
		return true
	}
	b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(int(tid)) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'S'
}

// next returns Run's next event for c (events of other connections are
// unexpected).
func (r *bgRun) next(t *testing.T, c talaris.Conn) recorded {
	t.Helper()
	select {
	case ev := <-r.evs:
		if ev.c != c {
			t.Fatalf("event %v for %#x, want %#x", ev.kind, ev.c.ID(), c.ID())
		}
		return ev
	case err := <-r.done:
		t.Fatalf("Run returned %v while events were expected", err)
	case <-time.After(hangGuard):
		t.Fatal("no event from Run")
	}
	return recorded{}
}

// expect takes Run's next event for c and checks its kind (and, for data,
// its payload).
func (r *bgRun) expect(t *testing.T, c talaris.Conn, kind talaris.EventKind, data string) recorded {
	t.Helper()
	ev := r.next(t, c)
	if ev.kind != kind || (kind == talaris.EventText || kind == talaris.EventBinary) && ev.data != data {
		t.Fatalf("event %v %q (%v), want %v %q", ev.kind, ev.data, ev.err, kind, data)
	}
	return ev
}

// result waits for Run to return.
func (r *bgRun) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-r.done:
		return err
	case <-time.After(hangGuard):
		t.Fatal("Run did not return")
	}
	return nil
}

// waitNoConns waits until p's ConnCount is 0 (the final event consumed).
func waitNoConns(t *testing.T, p *talaris.Pool) {
	t.Helper()
	for deadline := time.Now().Add(hangGuard); p.ConnCount() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("ConnCount %d after the final event", p.ConnCount())
		}
	}
}

// memText is one unmasked server text frame, for Conn.Inject.
func memText(s string) []byte { return ws.AppendFrame(nil, true, ws.OpText, []byte(s)) }

// memClose is a server close frame with code 1000, for Conn.Inject.
func memClose() []byte {
	return ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(talaris.CloseNormal, ""))
}

// TestRunDialLater: Run started on a pool with no connection sleeps
// instead of returning ErrNoConns, and serves connections dialed later:
// Dial over ws and wss (the open, an echo, the close), then, once the
// pool is empty again, DialAsync and DialMemory. With Loops 2 the idle
// sleep is futex_waitv over both loops. Cancelling the context ends it
// with context.Canceled.
func TestRunDialLater(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		for _, loops := range []int{1, 2} {
			t.Run(fmt.Sprintf("loops%d", loops), func(t *testing.T) {
				srv, opts := fairServer(t, useTLS)
				p := newTestPool(t, talaris.Config{Loops: loops}, hangGuard)
				r := startRun(t, p, context.Background())
				r.waitAsleep(t, p, 0)
				if p.ConnCount() != 0 {
					t.Fatalf("ConnCount %d before any dial", p.ConnCount())
				}

				ctx, cancel := dialCtx(t)
				defer cancel()
				c, err := p.Dial(ctx, srv.URL+"/echo", opts)
				if err != nil {
					t.Fatalf("Dial: %v", err)
				}
				r.expect(t, c, talaris.EventOpen, "")
				if err := c.SendText([]byte("hello")); err != nil {
					t.Fatal(err)
				}
				r.expect(t, c, talaris.EventText, "hello")
				s0 := testhook.Stats(p).PumpSleeps
				if err := c.Close(talaris.CloseNormal, "bye"); err != nil {
					t.Fatal(err)
				}
				if ev := r.expect(t, c, talaris.EventClose, ""); ev.code != talaris.CloseNormal {
					t.Errorf("close code %d, want 1000", ev.code)
				}

				// Empty again: Run sleeps on, and wakes for the next one.
				waitNoConns(t, p)
				r.waitAsleep(t, p, s0)
				c2, err := p.DialAsync(srv.URL+"/echo", opts)
				if err != nil {
					t.Fatalf("DialAsync: %v", err)
				}
				r.expect(t, c2, talaris.EventOpen, "")
				if err := c2.SendBinary([]byte{1, 2, 3}); err != nil {
					t.Fatal(err)
				}
				r.expect(t, c2, talaris.EventBinary, "\x01\x02\x03")
				s0 = testhook.Stats(p).PumpSleeps
				if err := c2.Abort(); err != nil {
					t.Fatal(err)
				}
				r.expect(t, c2, talaris.EventError, "")
				waitNoConns(t, p)
				r.waitAsleep(t, p, s0)
				m, err := p.DialMemory()
				if err != nil {
					t.Fatalf("DialMemory: %v", err)
				}
				if err := m.Inject(memText("tick")); err != nil {
					t.Fatal(err)
				}
				r.expect(t, m, talaris.EventOpen, "")
				r.expect(t, m, talaris.EventText, "tick")

				r.cancel()
				if err := r.result(t); !errors.Is(err, context.Canceled) {
					t.Fatalf("Run after cancel: %v, want context.Canceled", err)
				}
				// Run leaves the connections alone and gives the claim back.
				if st := m.State(); st != talaris.StateOpen {
					t.Errorf("memory connection %v after Run returned, want open", st)
				}
				if _, err := p.PumpNowait(func(talaris.Conn, talaris.Event) {}); err != nil {
					t.Errorf("PumpNowait after Run returned: %v", err)
				}
			})
		}
	})
}

// TestRunContext: Run returns ctx.Err() when its context ends while it
// sleeps with no connection (cancelled; a deadline), and while it sleeps
// on an open, quiet connection (over ws and wss); a context ended before
// the call returns at once. Each wake-up is the context's, not a timer's:
// without it the idle sleep has no timeout.
func TestRunContext(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		r := startRun(t, p, context.Background())
		r.waitAsleep(t, p, 0)
		r.cancel()
		if err := r.result(t); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v, want context.Canceled", err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		r := startRun(t, p, ctx)
		if err := r.result(t); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Run: %v, want context.DeadlineExceeded", err)
		}
	})
	t.Run("done-before", func(t *testing.T) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := p.Run(ctx, func(talaris.Conn, talaris.Event) {}); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v, want context.Canceled", err)
		}
		if testhook.PumpClaim(p) != 0 {
			t.Fatal("Run kept the pump claim")
		}
	})
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		srv, opts := fairServer(t, useTLS)
		p := newTestPool(t, talaris.Config{}, hangGuard)
		ctx, cancel := dialCtx(t)
		defer cancel()
		c, err := p.Dial(ctx, srv.URL+"/echo", opts) // quiet: it only echoes
		if err != nil {
			t.Fatal(err)
		}
		r := startRun(t, p, context.Background())
		r.expect(t, c, talaris.EventOpen, "")
		r.waitAsleep(t, p, testhook.Stats(p).PumpSleeps)
		r.cancel()
		if err := r.result(t); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v, want context.Canceled", err)
		}
		if st := c.State(); st != talaris.StateOpen {
			t.Errorf("connection %v after Run returned, want open", st)
		}
		// The next pump gets the connection's events.
		if err := c.SendText([]byte("after")); err != nil {
			t.Fatal(err)
		}
		var got string
		pumpUntil(t, p, func(_ talaris.Conn, ev talaris.Event) { got = string(ev.Payload) }, func() bool { return got != "" }, nil)
		if got != "after" {
			t.Errorf("echo %q, want after", got)
		}
	})
}

// TestRunClose: Run returns nil when the Pool is closed: from another
// goroutine while it sleeps with no connection and with an open one
// (ws and wss), from inside its callback, and before it was called.
func TestRunClose(t *testing.T) {
	t.Run("idle", func(t *testing.T) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		r := startRun(t, p, context.Background())
		r.waitAsleep(t, p, 0)
		p.Close()
		if err := r.result(t); err != nil {
			t.Fatalf("Run after Close: %v, want nil", err)
		}
	})
	t.Run("before", func(t *testing.T) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		p.Close()
		if err := p.Run(context.Background(), func(talaris.Conn, talaris.Event) {}); err != nil {
			t.Fatalf("Run on a closed pool: %v, want nil", err)
		}
	})
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		srv, opts := fairServer(t, useTLS)
		t.Run("open", func(t *testing.T) {
			p := newTestPool(t, talaris.Config{}, hangGuard)
			r := startRun(t, p, context.Background())
			ctx, cancel := dialCtx(t)
			defer cancel()
			c, err := p.Dial(ctx, srv.URL+"/echo", opts)
			if err != nil {
				t.Fatal(err)
			}
			r.expect(t, c, talaris.EventOpen, "")
			r.waitAsleep(t, p, testhook.Stats(p).PumpSleeps)
			p.Close()
			if err := r.result(t); err != nil {
				t.Fatalf("Run after Close: %v, want nil", err)
			}
		})
		t.Run("from-callback", func(t *testing.T) {
			p := newTestPool(t, talaris.Config{}, hangGuard)
			ctx, cancel := dialCtx(t)
			defer cancel()
			c, err := p.Dial(ctx, srv.URL+"/echo", opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.SendText([]byte("close")); err != nil {
				t.Fatal(err)
			}
			var closeErr error
			err = p.Run(context.Background(), func(cc talaris.Conn, ev talaris.Event) {
				if ev.Kind == talaris.EventText && string(ev.Payload) == "close" {
					closeErr = p.Close()
				}
			})
			if err != nil || closeErr != nil {
				t.Fatalf("Run with Close in its callback: %v (Close: %v), want nil", err, closeErr)
			}
			if p.ConnCount() != 0 || c.State() != talaris.StateClosed {
				t.Errorf("after Close: ConnCount %d, state %v", p.ConnCount(), c.State())
			}
		})
	})
}

// TestRunConcurrent: Run holds the pump claim for its whole life, idle
// or not: a second Run, RunData or Pump* meanwhile gets
// ErrConcurrentPump, and so does Run while a Pump is blocked.
func TestRunConcurrent(t *testing.T) {
	t.Run("run-first", func(t *testing.T) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		r := startRun(t, p, context.Background())
		r.waitAsleep(t, p, 0)
		bg := context.Background()
		checks := map[string]func() error{
			"Run":     func() error { return p.Run(bg, func(talaris.Conn, talaris.Event) {}) },
			"RunData": func() error { return p.RunData(bg, func(talaris.Conn, talaris.Opcode, []byte) {}) },
			"Pump": func() error {
				_, err := p.Pump(func(talaris.Conn, talaris.Event) {})
				return err
			},
			"PumpNowait": func() error {
				_, err := p.PumpNowait(func(talaris.Conn, talaris.Event) {})
				return err
			},
			"PumpDataNowait": func() error {
				_, err := p.PumpDataNowait(func(talaris.Conn, talaris.Opcode, []byte) {})
				return err
			},
		}
		for name, fn := range checks {
			if err := fn(); !errors.Is(err, talaris.ErrConcurrentPump) {
				t.Errorf("%s while Run runs: %v, want ErrConcurrentPump", name, err)
			}
		}
		r.cancel()
		if err := r.result(t); !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v", err)
		}
	})
	t.Run("pump-first", func(t *testing.T) {
		p := newTestPool(t, talaris.Config{CloseTimeout: 100 * time.Millisecond}, hangGuard)
		release := make(chan struct{})
		defer close(release)
		srv := wstest.NewRaw(func(c *wstest.RawConn) { <-release }).Start(t)
		dial(t, p, srv.URL)
		// The open first: the next Pump call then blocks (holding the
		// claim) until Close.
		if n, err := p.Pump(func(talaris.Conn, talaris.Event) {}); n != 1 || err != nil {
			t.Fatalf("the open: %d, %v", n, err)
		}
		s0 := testhook.Stats(p).PumpSleeps
		errc := make(chan error, 1)
		go func() {
			_, err := p.Pump(func(talaris.Conn, talaris.Event) {})
			errc <- err
		}()
		deadline := time.Now().Add(hangGuard)
		for (testhook.PumpClaim(p) != 1 || testhook.Stats(p).PumpSleeps <= s0) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		if err := p.Run(ctx, func(talaris.Conn, talaris.Event) {}); !errors.Is(err, talaris.ErrConcurrentPump) {
			t.Errorf("Run while Pump blocks: %v, want ErrConcurrentPump", err)
		}
		p.Close()
		if err := <-errc; !errors.Is(err, talaris.ErrPoolClosed) {
			t.Errorf("Pump after Close: %v", err)
		}
	})
}

// TestRunData: RunData passes data messages to its DataFunc and every
// other event to Config.OnEvent, on its goroutine and in order (open,
// text, binary, close), over ws and wss; it sleeps when the connection
// ended and returns ctx.Err() when cancelled.
func TestRunData(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		srv, opts := fairServer(t, useTLS)
		evs := make(chan recorded, 64)
		var tid, onEventTid atomic.Int32
		p := newTestPool(t, talaris.Config{OnEvent: func(c talaris.Conn, ev talaris.Event) {
			onEventTid.Store(int32(unix.Gettid()))
			evs <- recorded{c: c, kind: ev.Kind, data: string(ev.Payload), code: ev.Code, err: ev.Err}
		}}, hangGuard)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			done <- p.RunData(ctx, func(c talaris.Conn, op talaris.Opcode, b []byte) {
				tid.Store(int32(unix.Gettid()))
				evs <- recorded{c: c, kind: talaris.EventKind(op + 1), data: string(b)}
			})
		}()
		dctx, dcancel := dialCtx(t)
		defer dcancel()
		c, err := p.Dial(dctx, srv.URL+"/echo", opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.SendText([]byte("text")); err != nil {
			t.Fatal(err)
		}
		if err := c.SendBinary([]byte("bin")); err != nil {
			t.Fatal(err)
		}
		next := func() recorded {
			select {
			case ev := <-evs:
				return ev
			case err := <-done:
				t.Fatalf("RunData returned %v", err)
			case <-time.After(hangGuard):
				t.Fatal("no event")
			}
			return recorded{}
		}
		want := []struct {
			kind talaris.EventKind
			data string
		}{{talaris.EventOpen, ""}, {talaris.EventText, "text"}, {talaris.EventBinary, "bin"}}
		for i, w := range want {
			ev := next()
			if ev.c != c || ev.kind != w.kind || (w.data != "" && ev.data != w.data) {
				t.Fatalf("event %d: %v %q, want %v %q", i, ev.kind, ev.data, w.kind, w.data)
			}
		}
		if err := c.Close(talaris.CloseNormal, "done"); err != nil {
			t.Fatal(err)
		}
		if ev := next(); ev.c != c || ev.kind != talaris.EventClose || ev.code != talaris.CloseNormal {
			t.Fatalf("final event %v %d (%v), want close 1000", ev.kind, ev.code, ev.err)
		}
		if tid.Load() == 0 || tid.Load() != onEventTid.Load() {
			t.Errorf("DataFunc on thread %d, OnEvent on %d: want the same (Run's locked thread)", tid.Load(), onEventTid.Load())
		}
		time.Sleep(50 * time.Millisecond) // no connection left: RunData sleeps on
		select {
		case err := <-done:
			t.Fatalf("RunData returned %v with no connection left", err)
		default:
		}
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("RunData: %v, want context.Canceled", err)
			}
		case <-time.After(hangGuard):
			t.Fatal("RunData did not return")
		}
	})
}

// threadCPU returns the user+system CPU time thread tid of this process
// has used (/proc/self/task/<tid>/stat, in clock ticks of 10 ms).
func threadCPU(t *testing.T, tid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // from field 3 (state) on
	utime, err1 := strconv.ParseInt(f[14-3], 10, 64)
	stime, err2 := strconv.ParseInt(f[15-3], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("stat of thread %d: %q", tid, s)
	}
	const tick = 10 * time.Millisecond // USER_HZ 100
	return time.Duration(utime+stime) * tick
}

// TestRunIdleNoSpin: Run with no connection left sleeps: its locked
// thread uses under 50 ms of CPU over 300 ms of idle (a spinning or
// polling pump would use all of it), also on a pool configured to spin
// (WaitSpin: it spins only while connections live). It then still
// serves the next connection.
func TestRunIdleNoSpin(t *testing.T) {
	for _, w := range []struct {
		name string
		wait talaris.WaitStrategy
	}{{"adaptive", talaris.WaitAdaptive}, {"spin", talaris.WaitSpin}} {
		t.Run(w.name, func(t *testing.T) {
			p := newTestPool(t, talaris.Config{Wait: w.wait}, hangGuard)
			r := startRun(t, p, context.Background())
			m, err := p.DialMemory()
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Inject(memText("first")); err != nil {
				t.Fatal(err)
			}
			r.expect(t, m, talaris.EventOpen, "")
			r.expect(t, m, talaris.EventText, "first")
			tid := int(r.tid.Load())
			if err := m.Inject(memClose()); err != nil {
				t.Fatal(err)
			}
			r.expect(t, m, talaris.EventClose, "")
			waitNoConns(t, p)
			r.waitAsleep(t, p, 0) // into the idle sleep
			cpu0, s0 := threadCPU(t, tid), testhook.Stats(p).PumpSleeps
			const idle = 300 * time.Millisecond
			time.Sleep(idle)
			used, sleeps := threadCPU(t, tid)-cpu0, testhook.Stats(p).PumpSleeps-s0
			t.Logf("Run's thread %d: %v CPU over %v idle, %d pump sleeps", tid, used, idle, sleeps)
			if used >= 50*time.Millisecond {
				t.Fatalf("Run's thread used %v of CPU over %v with no connection: it spins", used, idle)
			}
			m2, err := p.DialMemory()
			if err != nil {
				t.Fatal(err)
			}
			if err := m2.Inject(memText("second")); err != nil {
				t.Fatal(err)
			}
			r.expect(t, m2, talaris.EventOpen, "")
			if ev := r.expect(t, m2, talaris.EventText, "second"); int(r.tid.Load()) != tid {
				t.Errorf("callback on thread %d, then %d: Run's goroutine left its thread (%v)", tid, r.tid.Load(), ev.kind)
			}
			r.cancel()
			if err := r.result(t); !errors.Is(err, context.Canceled) {
				t.Fatalf("Run: %v", err)
			}
		})
	}
}

// TestRunInline: with Config.Tuning.InlineLoop only the goroutine that
// created the Pool may Run it (ErrNotLoopThread elsewhere); there it
// serves a connection dialed later from another goroutine, and returns
// ctx.Err() when cancelled while idle, nil when its callback closes the
// pool.
func TestRunInline(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	type owner struct {
		p   *talaris.Pool
		err error
	}
	made := make(chan owner, 1)
	runNow := make(chan context.Context)
	runErr := make(chan error, 2)
	evs := make(chan recorded, 64)
	go func() {
		p, err := talaris.NewPool(talaris.Config{Tuning: talaris.Tuning{InlineLoop: true}})
		made <- owner{p, err}
		if err != nil {
			return
		}
		for ctx := range runNow {
			runErr <- p.Run(ctx, func(c talaris.Conn, ev talaris.Event) {
				evs <- recorded{c: c, kind: ev.Kind, data: string(ev.Payload)}
				if ev.Kind == talaris.EventText && string(ev.Payload) == "close" {
					p.Close()
				}
			})
		}
	}()
	o := <-made
	if o.err != nil {
		t.Fatal(o.err)
	}
	p := o.p
	defer close(runNow)
	defer p.Close()
	if err := p.Run(context.Background(), func(talaris.Conn, talaris.Event) {}); !errors.Is(err, talaris.ErrNotLoopThread) {
		t.Fatalf("Run from another goroutine: %v, want ErrNotLoopThread", err)
	}
	next := func(want talaris.EventKind) recorded {
		t.Helper()
		select {
		case ev := <-evs:
			if ev.kind != want {
				t.Fatalf("event %v %q, want %v", ev.kind, ev.data, want)
			}
			return ev
		case err := <-runErr:
			t.Fatalf("Run returned %v", err)
		case <-time.After(hangGuard):
			t.Fatal("no event")
		}
		return recorded{}
	}

	// Idle, then cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	runNow <- ctx
	deadline := time.Now().Add(hangGuard)
	for testhook.PumpClaim(p) != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // into the loop's wait
	cancel()
	if err := <-runErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("inline Run after cancel: %v, want context.Canceled", err)
	}

	// Idle, then a Dial from this goroutine (the owner's Run drives it),
	// then the callback closes the pool.
	runNow <- context.Background()
	for testhook.PumpClaim(p) != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	dctx, dcancel := dialCtx(t)
	defer dcancel()
	c, err := p.Dial(dctx, srv.URL+"/echo", nil)
	if err != nil {
		t.Fatalf("Dial while the owner Runs: %v", err)
	}
	next(talaris.EventOpen)
	if err := c.SendText([]byte("close")); err != nil {
		t.Fatal(err)
	}
	next(talaris.EventText)
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("inline Run with Close in its callback: %v, want nil", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("inline Run did not return after Close")
	}
}
