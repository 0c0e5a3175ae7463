//go:build linux && cgo

package talaris_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
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

// The inline loop (Config.Tuning.InlineLoop; docs/notes/2026-12-inline-loop.md,
// "Inline loop"): no loop thread; the goroutine that made the Pool runs the loop
// inside its Pump calls (and its Dial, its sends waiting for room, its
// Close). Real gorilla and coder servers on loopback, ws and wss (both TLS
// backends: run with and without -tags talaris_openssl): round trips
// answered from the callback and from another goroutine, feeds with every
// message checked, Pool.Close and Conn.Close racing the pump from another
// goroutine and from inside a callback, a peer that stops reading, the
// other goroutines' limits. Timeouts are hang guards only.

var inlineCfg = talaris.Config{Tuning: talaris.Tuning{InlineLoop: true}}

// inlineTarget is one server of the inline tests: a library over ws or
// wss (URL without path, dial options).
type inlineTarget struct {
	name string
	url  string
	opts *talaris.DialOptions
}

// inlineTargets starts a gorilla and a coder server, each over ws and wss.
func inlineTargets(t *testing.T) []inlineTarget {
	var out []inlineTarget
	for _, k := range serverKinds {
		out = append(out, inlineTarget{k.name + "/ws", k.new().Start(t).URL, nil},
			inlineTarget{k.name + "/wss", k.new().StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0)).URL, tlsOpts})
	}
	return out
}

func TestInlineEchoFromCallback(t *testing.T) {
	for _, tg := range inlineTargets(t) {
		t.Run(tg.name, func(t *testing.T) {
			p, c := dialOpts(t, inlineCfg, tg.url+"/echo", tg.opts)
			const n = 2000
			if seen, err := pingPong(p, c, n); err != nil || seen != n {
				t.Fatalf("%d/%d echoes: %v", seen, n, err)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestInlineEchoFromGoroutine: another goroutine sends numbered messages
// (through the command ring or its own direct writes, waking the loop in
// the kernel); the pool's goroutine pumps and checks every echo in order.
func TestInlineEchoFromGoroutine(t *testing.T) {
	for _, tg := range inlineTargets(t) {
		t.Run(tg.name, func(t *testing.T) {
			p, c := dialOpts(t, inlineCfg, tg.url+"/echo", tg.opts)
			const n = 5000
			sent := make(chan error, 1)
			go func() {
				ctx, cancel := dialCtx(t)
				defer cancel()
				msg := make([]byte, 100)
				for i := 0; i < n; i++ {
					binary.LittleEndian.PutUint64(msg, uint64(i))
					if err := c.SendContext(ctx, talaris.OpBinary, msg); err != nil {
						sent <- err
						return
					}
					if i%64 == 0 {
						time.Sleep(50 * time.Microsecond) // sometimes find the loop asleep
					}
				}
				sent <- nil
			}()
			seen := 0
			var bad error
			for seen < n && bad == nil {
				if _, err := p.PumpData(func(cc talaris.Conn, op talaris.Opcode, pl []byte) {
					if cc != c || op != talaris.OpBinary || len(pl) != 100 || binary.LittleEndian.Uint64(pl) != uint64(seen) {
						bad = fmt.Errorf("echo %d: op %v len %d", seen, op, len(pl))
					}
					seen++
				}); err != nil {
					t.Fatal(err)
				}
			}
			if bad != nil {
				t.Fatal(bad)
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// checkedStream is a Pump callback for one /stream: each binary message
// is checked by chk, and the connection's last event is stored in *end.
func checkedStream(t *testing.T, chk *wstest.Checker, end **talaris.Event) talaris.EventFunc {
	return func(_ talaris.Conn, ev talaris.Event) {
		switch ev.Kind {
		case talaris.EventBinary:
			if err := chk.Check(ev.Payload); err != nil {
				t.Error(err)
			}
		case talaris.EventClose, talaris.EventError:
			e := ev
			*end = &e
		}
	}
}

// TestInlineFeed reads streams (small and large messages, fragments with
// pings between them) and checks every message, then the server's close.
func TestInlineFeed(t *testing.T) {
	for _, tg := range inlineTargets(t) {
		for _, q := range []struct {
			n, size int
			extra   string
		}{{200000, 32, ""}, {2000, 70000, ""}, {20000, 300, "&frag=3&ping=1"}} {
			t.Run(fmt.Sprintf("%s/%dx%d%s", tg.name, q.n, q.size, q.extra), func(t *testing.T) {
				p := newTestPool(t, inlineCfg, hangGuard)
				ctx, cancel := dialCtx(t)
				defer cancel()
				c, err := p.Dial(ctx, fmt.Sprintf("%s/stream?n=%d&size=%d%s", tg.url, q.n, q.size, q.extra), tg.opts)
				if err != nil {
					t.Fatal(err)
				}
				chk := wstest.NewChecker(q.size)
				var end *talaris.Event
				for end == nil {
					if _, err := p.Pump(checkedStream(t, chk, &end)); err != nil {
						t.Fatal(err)
					}
				}
				if chk.Count() != q.n || end.Kind != talaris.EventClose || end.Code != 1000 {
					t.Fatalf("%d/%d messages, end %v %d (%v)", chk.Count(), q.n, end.Kind, end.Code, end.Err)
				}
				_ = c
			})
		}
	}
}

// TestInlineCloseRace closes the Pool (on odd rounds the connection
// first) from another goroutine mid ping-pong: the pump returns
// ErrPoolClosed or ErrClosed, Close returns (the loop's goroutine is
// out of the loop within its wait's cap), and sends and pumps after it
// fail cleanly.
func TestInlineCloseRace(t *testing.T) {
	for _, tg := range inlineTargets(t) {
		t.Run(tg.name, func(t *testing.T) {
			for i := 0; i < 12; i++ {
				p, c := dialOpts(t, inlineCfg, tg.url+"/echo", tg.opts)
				pingPongCloseRace(t, p, c, i, time.Duration(i%6)*time.Millisecond)
			}
		})
	}
}

// TestInlineCloseFromCallback closes the Pool, or the connection, from
// inside the callback while a stream floods in: Pool.Close runs the close
// handshake on the loop's own goroutine and returns; the pump returns
// ErrPoolClosed after that callback. A Conn.Close from the callback ends
// the connection with the close handshake and the final event.
func TestInlineCloseFromCallback(t *testing.T) {
	for _, tg := range inlineTargets(t) {
		for _, what := range []string{"pool", "conn"} {
			t.Run(tg.name+"/"+what, func(t *testing.T) {
				p := newTestPool(t, talaris.Config{CloseTimeout: time.Second, Tuning: talaris.Tuning{InlineLoop: true}}, hangGuard)
				ctx, cancel := dialCtx(t)
				defer cancel()
				c, err := p.Dial(ctx, tg.url+"/stream?n=1000000&size=64", tg.opts)
				if err != nil {
					t.Fatal(err)
				}
				got, closed := 0, false
				var end *talaris.Event
				var perr error
				for perr == nil && end == nil {
					_, perr = p.Pump(func(cc talaris.Conn, ev talaris.Event) {
						switch ev.Kind {
						case talaris.EventBinary:
							got++
							if got == 5000 && !closed {
								closed = true
								start := time.Now()
								if what == "pool" {
									if err := p.Close(); err != nil {
										t.Error(err)
									}
								} else if err := c.Close(talaris.CloseNormal, "enough"); err != nil {
									t.Error(err)
								}
								if d := time.Since(start); d > 3*time.Second {
									t.Errorf("Close from the callback took %v", d)
								}
							}
						case talaris.EventClose, talaris.EventError:
							e := ev
							end = &e
						}
					})
				}
				if what == "pool" {
					if !errors.Is(perr, talaris.ErrPoolClosed) {
						t.Fatalf("pump after Close in the callback: %v (end %v)", perr, end)
					}
					if err := c.SendText([]byte("late")); err == nil {
						t.Fatal("send after Close succeeded")
					}
					return
				}
				if perr != nil || end == nil || got < 5000 {
					t.Fatalf("pump %v, end %v, %d messages", perr, end, got)
				}
			})
		}
	}
}

// TestInlineStoppedReader: the peer stops reading. Sends from the pool's
// goroutine fill the connection's queue (ErrWouldBlock, never a hang); a
// SendContext from it runs the loop while it waits and returns the
// context's error; Close from it ends within CloseTimeout; and with the
// pump waiting for an answer that never comes, a Close from another
// goroutine ends the pump.
func TestInlineStoppedReader(t *testing.T) {
	url := delayedEcho(t, 0, bellStopRead, 3)
	t.Run("owner", func(t *testing.T) {
		p, c := dialOpts(t, talaris.Config{MaxSendQueue: 1 << 20, CloseTimeout: 200 * time.Millisecond, Tuning: talaris.Tuning{InlineLoop: true}}, url, nil)
		msg := make([]byte, 64<<10)
		// Full means the queue stays full with the loop run between the
		// attempts: the first ErrWouldBlock can come while the loop has
		// not yet flushed the queue into the kernel's socket buffers
		// (several MiB on loopback), and SendContext, which runs the loop
		// while it waits, would then find room (seen in CI).
		stuck := 0
		for i := 0; i < 8192 && stuck < 32; i++ {
			p.PumpDataNowait(func(talaris.Conn, talaris.Opcode, []byte) {})
			switch err := c.SendBinary(msg); {
			case errors.Is(err, talaris.ErrWouldBlock):
				stuck++
				time.Sleep(time.Millisecond)
			case err != nil:
				t.Fatal(err)
			default:
				stuck = 0
			}
		}
		if stuck < 32 {
			t.Fatal("512 MiB accepted by a peer that does not read, MaxSendQueue 1 MiB")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := c.SendContext(ctx, talaris.OpBinary, msg); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("SendContext to a full queue: %v", err)
		}
		start := time.Now()
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("Close took %v with CloseTimeout 200ms", d)
		}
	})
	t.Run("other", func(t *testing.T) {
		for i := 0; i < 6; i++ {
			p, c := dialOpts(t, talaris.Config{CloseTimeout: 100 * time.Millisecond, Tuning: talaris.Tuning{InlineLoop: true}}, url, nil)
			pingPongCloseRace(t, p, c, i, time.Duration(i)*3*time.Millisecond)
		}
	})
}

// TestInlineOtherGoroutines: only the pool's goroutine pumps (another gets
// ErrNotLoopThread); a Dial from another goroutine completes while the
// pool's goroutine pumps, and one nobody pumps for ends with its context.
// Heartbeats run while the pool's goroutine waits in Pump.
func TestInlineOtherGoroutines(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	p := newTestPool(t, inlineCfg, hangGuard)
	errc := make(chan error, 1)
	go func() {
		_, err := p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {})
		errc <- err
	}()
	if err := <-errc; !errors.Is(err, talaris.ErrNotLoopThread) {
		t.Fatalf("pump from another goroutine: %v", err)
	}
	// Nobody pumps: another goroutine's Dial ends with its context.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, err := p.Dial(ctx, srv.URL+"/echo", nil)
		errc <- err
	}()
	if err := <-errc; !errors.Is(err, talaris.ErrTimeout) {
		t.Fatalf("dial nobody pumps: %v", err)
	}
	// The pool's goroutine pumps: another's Dial opens (the abandoned
	// dial above may open or end meanwhile: its events are skipped).
	dialed := make(chan talaris.Conn, 1)
	go func() {
		ctx, cancel := dialCtx(t)
		defer cancel()
		c, err := p.Dial(ctx, srv.URL+"/echo", &talaris.DialOptions{PingInterval: 10 * time.Millisecond})
		if err != nil {
			t.Error(err)
		}
		dialed <- c
	}()
	var c talaris.Conn
	pongs := 0
	deadline := time.Now().Add(hangGuard)
	for pongs < 5 && time.Now().Before(deadline) {
		if c == (talaris.Conn{}) {
			select {
			case c = <-dialed:
				if c == (talaris.Conn{}) {
					t.FailNow()
				}
			default:
			}
		}
		_, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
			if c != (talaris.Conn{}) && cc == c && ev.Kind == talaris.EventPong {
				pongs++
			}
		})
		if poolEmptied(err) {
			// the other goroutine's Dial has not taken its slot yet
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if pongs < 5 {
		t.Fatalf("%d heartbeat pongs", pongs)
	}
}

// TestInlineIdleCPU: after a burst of round trips (which turns the reply
// spin on), an idle inline Pool with one open connection, its goroutine
// waiting in PumpData (in the kernel, inside the loop), uses well under
// 10 % of one CPU over 2 s; a Close from another goroutine then ends the
// pump. The CPU time is that goroutine's thread's (the inline loop's: it
// is locked to it), not the process's (the in-process gorilla server, the
// GC): a thread that sleeps uses none however loaded the machine is.
func TestInlineIdleCPU(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	p, c := dialOpts(t, inlineCfg, srv.URL+"/echo", nil)
	loopTid := unix.Gettid() // NewPool locked this goroutine to its thread
	if seen, err := pingPong(p, c, 500); err != nil || seen != 500 {
		t.Fatalf("%d/500 echoes: %v", seen, err)
	}
	const idle = 2 * time.Second
	var used time.Duration
	var cpuErr error
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		defer p.Close()
		time.Sleep(100 * time.Millisecond) // let the last spin run out
		c0, err := taskCPU(loopTid)
		time.Sleep(idle)
		c1, err1 := taskCPU(loopTid)
		used, cpuErr = c1-c0, errors.Join(err, err1)
	}()
	got := 0
	var err error
	for err == nil {
		_, err = p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) { got++ })
	}
	<-closed
	if !errors.Is(err, talaris.ErrPoolClosed) || got != 0 {
		t.Fatalf("pump: %v after %d messages on a quiet connection", err, got)
	}
	if cpuErr != nil {
		t.Fatal(cpuErr)
	}
	t.Logf("idle: the inline loop's thread used %v CPU in %v (%.2f %%)", used, idle, 100*used.Seconds()/idle.Seconds())
	if used > idle/10 {
		t.Fatalf("idle inline pool: its thread used %v of CPU in %v: something spins", used, idle)
	}
}

// TestInlineFloodCloseRace closes the Pool, or the connection, from
// another goroutine while a stream floods in and the pool's goroutine
// pumps: a Pool.Close ends the pump with ErrPoolClosed (the pump, inside
// the loop or about to enter it, finishes or abandons the shutdown; Close
// returns either way); a Conn.Close ends the connection with its final
// event while the flood is still arriving.
func TestInlineFloodCloseRace(t *testing.T) {
	for _, tg := range inlineTargets(t) {
		for _, what := range []string{"pool", "conn"} {
			t.Run(tg.name+"/"+what, func(t *testing.T) {
				for i := 0; i < 6; i++ {
					p := newTestPool(t, talaris.Config{CloseTimeout: 500 * time.Millisecond, Tuning: talaris.Tuning{InlineLoop: true}}, hangGuard)
					ctx, cancel := dialCtx(t)
					c, err := p.Dial(ctx, tg.url+"/stream?n=2000000&size=64", tg.opts)
					cancel()
					if err != nil {
						t.Fatal(err)
					}
					closed := make(chan error, 1)
					go func() {
						time.Sleep(time.Duration(i) * 2 * time.Millisecond)
						if what == "pool" {
							closed <- p.Close()
						} else {
							closed <- c.Close(talaris.CloseNormal, "enough")
						}
					}()
					chk := wstest.NewChecker(64)
					var end *talaris.Event
					var perr error
					for perr == nil && end == nil {
						_, perr = p.Pump(checkedStream(t, chk, &end))
					}
					if err := <-closed; err != nil {
						t.Fatalf("round %d: close: %v", i, err)
					}
					if what == "pool" {
						if perr == nil {
							_, perr = p.Pump(func(talaris.Conn, talaris.Event) {})
						}
						if !errors.Is(perr, talaris.ErrPoolClosed) {
							t.Fatalf("round %d: pump after Pool.Close: %v", i, perr)
						}
					} else if perr != nil || end == nil {
						t.Fatalf("round %d: pump %v, end %v after %d messages", i, perr, end, chk.Count())
					}
				}
			})
		}
	}
}

// TestInlineLoopCPU: LoopCPU pins the inline loop's thread (the Pool's
// goroutine's) while the Pool lives, round trips run pinned, and the
// Pool's Close on that goroutine gives the thread its mask back; a CPU
// that does not exist fails NewPool, leaving the mask as it was.
func TestInlineLoopCPU(t *testing.T) {
	runtime.LockOSThread() // observe one thread across Close's unlock
	defer runtime.UnlockOSThread()
	var before unix.CPUSet
	if err := unix.SchedGetaffinity(0, &before); err != nil {
		t.Fatal(err)
	}
	cpu := -1
	for i := 0; i < 1024; i++ {
		if before.IsSet(i) {
			cpu = i // the last CPU allowed
		}
	}
	if before.Count() < 2 {
		t.Skip("one CPU allowed: pinning would not show")
	}
	srv := wstest.NewGorilla().Start(t)
	p, c := dialOpts(t, talaris.Config{LoopCPUs: []int{cpu}, Tuning: talaris.Tuning{InlineLoop: true}}, srv.URL+"/echo", nil)
	var now unix.CPUSet
	if err := unix.SchedGetaffinity(0, &now); err != nil {
		t.Fatal(err)
	}
	if now.Count() != 1 || !now.IsSet(cpu) {
		t.Fatalf("inline loop's thread allowed on %d CPUs (CPU %d set: %v), want only CPU %d", now.Count(), cpu, now.IsSet(cpu), cpu)
	}
	if seen, err := pingPong(p, c, 200); err != nil || seen != 200 {
		t.Fatalf("%d/200 echoes: %v", seen, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := unix.SchedGetaffinity(0, &now); err != nil {
		t.Fatal(err)
	}
	if now != before {
		t.Fatalf("after Close the thread's mask has %d CPUs, before NewPool %d", now.Count(), before.Count())
	}
	if _, err := talaris.NewPool(talaris.Config{LoopCPUs: []int{4095}, Tuning: talaris.Tuning{InlineLoop: true}}); !errors.Is(err, talaris.ErrInvalidConfig) {
		t.Fatalf("NewPool pinned to CPU 4095: %v", err)
	}
	if err := unix.SchedGetaffinity(0, &now); err != nil || now != before {
		t.Fatalf("after a failed NewPool the mask has %d CPUs (%v), before %d", now.Count(), err, before.Count())
	}
}

// TestInlineSendersShareRing: another goroutine floods one connection
// (through the command ring: no direct sends, wss) while the pool's
// goroutine answers echoes on another from its callback. The ring (64
// KiB) fills: the other goroutine waits for room holding the ring's
// producer lock, and the callback's send needs that lock - it must run
// the loop meanwhile (only its thread can drain the ring), not block on
// the lock (a deadlock until Close, before). Every message of both
// arrives.
func TestInlineSendersShareRing(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(map[bool]string{false: "ws", true: "wss"}[secure], func(t *testing.T) {
			var sunk atomic.Int64
			sink := wstest.NewGorilla()
			sink.OnMessage = func(ws.Opcode, []byte) { sunk.Add(1) }
			echo := wstest.NewGorilla()
			var opts *talaris.DialOptions
			if secure {
				cfg := serverTLS(t, testCertFile, testKeyFile, 0, 0)
				sink, echo, opts = sink.StartTLS(t, cfg), echo.StartTLS(t, cfg), tlsOpts
			} else {
				sink, echo = sink.Start(t), echo.Start(t)
			}
			p, a := dialOpts(t, testhook.WithKnobs(talaris.Config{Tuning: talaris.Tuning{InlineLoop: true}}, testhook.Knobs{CmdRingSize: 64 << 10, NoDirectSend: true}), echo.URL+"/echo", opts)
			ctx, cancel := dialCtx(t)
			defer cancel()
			// B is dialed from another goroutine while this one pumps
			// (a Dial from the loop's goroutine runs the loop itself).
			const n = 2000
			flood := make(chan error, 1)
			go func() {
				b, err := p.Dial(ctx, sink.URL+"/collect", opts)
				if err != nil {
					flood <- err
					return
				}
				msg := make([]byte, 8<<10)
				for i := 0; i < n; i++ {
					for {
						err := b.SendBinary(msg)
						if !errors.Is(err, talaris.ErrWouldBlock) {
							if err != nil {
								flood <- err
								return
							}
							break
						}
						time.Sleep(100 * time.Microsecond)
					}
				}
				flood <- nil
			}()
			if seen, err := pingPong(p, a, 3000); err != nil || seen != 3000 {
				t.Fatalf("%d/3000 echoes beside the flood: %v", seen, err)
			}
			deadline := time.Now().Add(30 * time.Second)
			done := false
			for !done || sunk.Load() < n {
				if time.Now().After(deadline) {
					t.Fatalf("flood done %v, %d/%d messages at the sink", done, sunk.Load(), n)
				}
				select {
				case err := <-flood:
					if err != nil {
						t.Fatal(err)
					}
					done = true
				default:
				}
				if _, err := p.PumpDataNowait(func(talaris.Conn, talaris.Opcode, []byte) {}); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Microsecond)
			}
		})
	}
}

// TestInlinePeerDrops: the peer goes away without a close frame after a
// stream (FIN; a reset; over wss also without close_notify, in the middle
// of a record) while the pool's goroutine pumps: every message before
// the drop arrives checked (a reset may destroy some in flight), the
// final event is EventError ErrConnectionLost 1006 as with a loop
// thread, and afterwards sends and Close say ErrClosed, PumpData
// ErrNoConns (no wait for a connection that is gone), and the pool
// still dials.
func TestInlinePeerDrops(t *testing.T) {
	for _, tg := range inlineTargets(t) {
		queries := []string{"", "&rst=1"}
		if tg.opts != nil {
			queries = append(queries, "&trunc=1", "&trunc=1&partial=1")
		}
		for _, q := range queries {
			t.Run(tg.name+"/"+q, func(t *testing.T) {
				p := newTestPool(t, inlineCfg, hangGuard)
				ctx, cancel := dialCtx(t)
				defer cancel()
				const n = 5000
				c, err := p.Dial(ctx, fmt.Sprintf("%s/drop?n=%d&size=100%s", tg.url, n, q), tg.opts)
				if err != nil {
					t.Fatal(err)
				}
				chk := wstest.NewChecker(100)
				var end *talaris.Event
				for end == nil {
					if _, err := p.Pump(checkedStream(t, chk, &end)); err != nil {
						t.Fatal(err)
					}
				}
				if chk.Count() != n && !strings.Contains(q, "rst") {
					t.Errorf("got %d messages, want %d", chk.Count(), n)
				}
				if end.Kind != talaris.EventError || !errors.Is(end.Err, talaris.ErrConnectionLost) || end.Code != talaris.CloseAbnormal {
					t.Errorf("final event %v %d %v, want EventError ErrConnectionLost 1006", end.Kind, end.Code, end.Err)
				}
				if err := c.SendText([]byte("late")); !errors.Is(err, talaris.ErrClosed) {
					t.Errorf("send after the drop: %v", err)
				}
				if err := c.Close(talaris.CloseNormal, ""); !errors.Is(err, talaris.ErrClosed) {
					t.Errorf("close after the drop: %v", err)
				}
				if _, err := p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {}); !errors.Is(err, talaris.ErrNoConns) {
					t.Errorf("pump with no connection: %v", err)
				}
				c2, err := p.Dial(ctx, tg.url+"/echo", tg.opts)
				if err != nil {
					t.Fatal(err)
				}
				if seen, err := pingPong(p, c2, 10); err != nil || seen != 10 {
					t.Fatalf("%d/10 echoes after the drop: %v", seen, err)
				}
			})
		}
	}
}

// TestInlineMethodsRaceClose: from another goroutine, every Conn and Pool
// method in turn (Send*, SendContext, Ping, Pong, Stats, State, Metrics,
// Dial, DialAsync, then Close or Abort) on a connection to a peer that
// echoes or that stops reading, while the pool's goroutine pumps and a
// third goroutine closes the pool at a different moment each round. No
// call may hang (each round is bounded by the hang guard), panic, or
// return an error outside the documented ones; the pump ends with
// ErrPoolClosed.
func TestInlineMethodsRaceClose(t *testing.T) {
	echo := wstest.NewGorilla().Start(t).URL + "/echo"
	stopped := delayedEcho(t, 0, bellStopRead, 2)
	allowed := []error{talaris.ErrClosed, talaris.ErrPoolClosed, talaris.ErrWouldBlock, talaris.ErrTimeout, context.DeadlineExceeded, talaris.ErrNotLoopThread}
	check := func(what string, err error) {
		if err == nil {
			return
		}
		for _, a := range allowed {
			if errors.Is(err, a) {
				return
			}
		}
		t.Errorf("%s: %v", what, err)
	}
	for i := 0; i < 12; i++ {
		url := echo
		if i%2 == 1 {
			url = stopped
		}
		p, c := dialOpts(t, talaris.Config{MaxSendQueue: 256 << 10, CloseTimeout: 100 * time.Millisecond, Tuning: talaris.Tuning{InlineLoop: true}}, url, nil)
		done := make(chan struct{})
		go func() {
			defer close(done)
			msg := make([]byte, 32<<10)
			for j := 0; ; j++ {
				check("SendBinary", c.SendBinary(msg))
				check("SendText", c.SendText([]byte("x")))
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
				check("SendContext", c.SendContext(ctx, talaris.OpBinary, msg))
				cancel()
				check("Ping", c.Ping(nil))
				check("Pong", c.Pong(nil))
				_ = c.Stats()
				_ = c.State()
				_ = testhook.Stats(p)
				_ = p.Metrics()
				if j%8 == 7 {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
					_, err := p.Dial(ctx, url, nil)
					cancel()
					check("Dial", err)
					_, err = p.DialAsync(url, nil)
					check("DialAsync", err)
				}
				if j == 40 {
					if i%4 < 2 {
						check("Close", c.Close(talaris.CloseNormal, "bye"))
					} else {
						check("Abort", c.Abort())
					}
				}
				if _, err := p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {}); !errors.Is(err, talaris.ErrNotLoopThread) && !errors.Is(err, talaris.ErrConcurrentPump) && !errors.Is(err, talaris.ErrPoolClosed) {
					t.Errorf("pump from another goroutine: %v", err)
				}
				if p.ConnCount() == 0 && c.State() == talaris.StateClosed {
					return
				}
				time.Sleep(100 * time.Microsecond)
				if errors.Is(c.SendText(nil), talaris.ErrPoolClosed) {
					return
				}
			}
		}()
		closed := make(chan error, 1)
		go func() {
			time.Sleep(time.Duration(i) * 7 * time.Millisecond)
			closed <- p.Close()
		}()
		var err error
		for err == nil || errors.Is(err, talaris.ErrConcurrentPump) { // (the other goroutine's Pump holds the claim a moment)
			_, err = p.Pump(func(talaris.Conn, talaris.Event) {})
		}
		if !errors.Is(err, talaris.ErrPoolClosed) && !errors.Is(err, talaris.ErrNoConns) {
			t.Fatalf("round %d: pump: %v", i, err)
		}
		if err := <-closed; err != nil {
			t.Fatalf("round %d: close: %v", i, err)
		}
		<-done
	}
}
