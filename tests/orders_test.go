//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// Orders that are never lost: Close and Pool.Close send what Send*
// accepted before the close frame, Flush, SendBatch, and the prompt end
// of a close whose server keeps talking. Every test runs over ws:// and
// wss:// (forEachTransport; the OpenSSL pass runs the wss:// half).

// orderSize is the size of one small JSON-sized order.
const orderSize = 64

// TestCloseKeepsOrders: 10,000 small orders sent with SendText (or
// SendBatch), then Conn.Close (or Pool.Close) at once: the server reads
// every one of them, in order, before the close frame, and nothing is
// counted dropped. Three runs each: the loss this guards against was
// intermittent.
func TestCloseKeepsOrders(t *testing.T) {
	const orders = 10_000
	for _, tc := range []struct {
		name  string
		batch bool
		pool  bool
	}{{"SendText/Conn.Close", false, false}, {"SendBatch/Conn.Close", true, false}, {"SendText/Pool.Close", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, useTLS bool) {
				for run := 0; run < 3; run++ {
					s := newSink(t, useTLS, true, 0)
					p := newTestPool(t, talaris.Config{}, hangGuard)
					c := dialSink(t, p, s)
					sendOrders(t, c, orders, tc.batch)
					var f finalEvent
					if tc.pool {
						done := make(chan error, 1)
						go func() { done <- p.Close() }()
						if err := <-done; err != nil {
							t.Fatalf("Pool.Close: %v", err)
						}
					} else {
						if err := c.Close(talaris.CloseNormal, "done"); err != nil {
							t.Fatalf("Close: %v", err)
						}
						f = pumpOne(t, p, c, nil)
					}
					s.waitClosed(t)
					n, _, err := s.state()
					s.mu.Lock()
					code, at := s.closeCode, s.atClose
					s.mu.Unlock()
					if err != nil || at != orders || n != orders {
						t.Fatalf("run %d: the server read %d orders (%d before the close frame, code %d), want %d; sink error %v; final %+v",
							run, n, at, code, orders, err, f)
					}
					if !tc.pool && (f.Kind != talaris.EventClose || f.Code != talaris.CloseNormal || f.SendDropped != 0) {
						t.Fatalf("run %d: final %+v, want EventClose 1000, nothing dropped", run, f)
					}
					if tc.pool && code != talaris.CloseGoingAway {
						t.Fatalf("run %d: the server saw close code %d after Pool.Close, want 1001", run, code)
					}
					if d := p.Metrics().SendDropped; d != 0 {
						t.Fatalf("run %d: Metrics.SendDropped %d, want 0", run, d)
					}
				}
			})
		})
	}
}

// sendOrders sends n sequence-numbered orders on c, one by one (SendText)
// or in batches of 64 (SendBatch), waiting for room when the queue is full.
func sendOrders(t *testing.T, c talaris.Conn, n int, batch bool) {
	t.Helper()
	ctx, cancel := dialCtx(t)
	defer cancel()
	if !batch {
		for i := 0; i < n; i++ {
			if err := c.SendContext(ctx, talaris.OpBinary, seqMsg(make([]byte, orderSize), i)); err != nil {
				t.Fatalf("SendContext %d: %v", i, err)
			}
		}
		return
	}
	for i := 0; i < n; {
		k := min(64, n-i)
		msgs := make([][]byte, k)
		for j := range msgs {
			msgs[j] = seqMsg(make([]byte, orderSize), i+j)
		}
		err := c.SendBatch(talaris.OpBinary, msgs)
		if errors.Is(err, talaris.ErrWouldBlock) {
			if err := c.Flush(ctx); err != nil {
				t.Fatalf("Flush: %v", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("SendBatch at %d: %v", i, err)
		}
		i += k
	}
}

// waitClosed waits until the sink has seen the client's close frame (or
// its read failed).
func (s *sink) waitClosed(t *testing.T) {
	t.Helper()
	guard := time.After(hangGuard)
	for {
		s.mu.Lock()
		code, err := s.closeCode, s.err
		s.mu.Unlock()
		if code != 0 || err != nil {
			return
		}
		select {
		case <-s.progress:
		case <-time.After(10 * time.Millisecond): // the close frame does not signal progress
		case <-guard:
			t.Fatalf("the sink saw no close frame within %v", hangGuard)
		}
	}
}

// TestFlush: Flush returns once what was accepted before it has left:
// SendQueued is 0 at that moment. Against a peer that does not read it
// waits until its context ends (context.DeadlineExceeded), and once the
// peer reads it returns nil. After the connection ended, and after
// Pool.Close, it returns the end's error at once.
func TestFlush(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		s := newSink(t, useTLS, false, 0)
		p := newTestPool(t, talaris.Config{MaxSendQueue: 64 << 20}, hangGuard)
		c := dialSink(t, p, s)
		buf := make([]byte, 1<<20)
		i := 0
		for ; i < 32; i++ { // more than the socket buffers hold: the peer does not read yet
			if err := c.SendBinary(seqMsg(buf, i)); err != nil {
				t.Fatalf("SendBinary %d: %v", i, err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Flush(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Flush against a peer that does not read: %v, want context.DeadlineExceeded", err)
		}
		close(s.gate)
		ctx, cancel = dialCtx(t)
		defer cancel()
		if err := c.Flush(ctx); err != nil {
			t.Fatalf("Flush once the peer reads: %v", err)
		}
		if q := c.Stats().SendQueued; q != 0 {
			t.Fatalf("SendQueued %d after Flush returned", q)
		}
		if err := c.Flush(ctx); err != nil { // nothing queued: at once
			t.Fatalf("Flush with nothing queued: %v", err)
		}
		f := closeAndWait(t, p, c)
		if f.Kind != talaris.EventClose {
			t.Fatalf("final %+v", f)
		}
		if err := c.Flush(ctx); !errors.Is(err, talaris.ErrClosed) {
			t.Fatalf("Flush after the end: %v, want ErrClosed", err)
		}
		p.Close()
		if err := c.Flush(ctx); !errors.Is(err, talaris.ErrPoolClosed) {
			t.Fatalf("Flush after Pool.Close: %v, want ErrPoolClosed", err)
		}
	})
}

// TestFlushRacingClose: Flush waiting on a peer that does not read, while
// another goroutine calls Conn.Close (which waits for the same queue and
// ends at its close timeout), Conn.Abort or Pool.Close: Flush returns the
// end's error, never nil (its messages never left), and never hangs.
func TestFlushRacingClose(t *testing.T) {
	for _, end := range []string{"Conn.Close", "Conn.Abort", "Pool.Close"} {
		t.Run(end, func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, useTLS bool) {
				s := newSink(t, useTLS, false, 0)
				p := newTestPool(t, talaris.Config{MaxSendQueue: 64 << 20, CloseTimeout: 300 * time.Millisecond}, hangGuard)
				c := dialSink(t, p, s)
				next := 0
				saturate(t, c, &next, 64<<10)
				flushed := make(chan error, 1)
				go func() { flushed <- c.Flush(context.Background()) }()
				go func() {
					switch end {
					case "Conn.Close":
						c.Close(talaris.CloseNormal, "")
					case "Conn.Abort":
						c.Abort()
					default:
						p.Close()
					}
				}()
				var f finalEvent
				if end != "Pool.Close" {
					f = pumpOne(t, p, c, nil)
				}
				select {
				case err := <-flushed:
					if err == nil || !(errors.Is(err, talaris.ErrClosed) || errors.Is(err, talaris.ErrPoolClosed) ||
						errors.Is(err, talaris.ErrCloseTimeout) || errors.Is(err, talaris.ErrAborted)) {
						t.Fatalf("Flush: %v, want the end's error (final %+v)", err, f)
					}
					t.Logf("Flush: %v; final %+v", err, f)
				case <-time.After(hangGuard):
					t.Fatal("Flush did not return after the connection ended")
				}
				if end != "Pool.Close" && f.SendDropped == 0 {
					t.Errorf("final %+v: the unsent orders were not counted", f)
				}
			})
		})
	}
}

// TestSendBatch: batches reach the server whole and in order (the sink
// checks every message), one send per batch on an idle ws:// connection
// (the direct path: one handoff at most per batch); all or nothing when
// the queue is full; a batch larger than MaxSendQueue goes when the queue
// is empty; bad input queues nothing.
func TestSendBatch(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		s := newSink(t, useTLS, false, 0)
		const maxQ = 1 << 20
		p := newTestPool(t, talaris.Config{MaxSendQueue: maxQ}, hangGuard)
		c := dialSink(t, p, s)
		// Bad input: nothing queued.
		if err := c.SendBatch(talaris.OpText, [][]byte{[]byte("ok"), {0xff}}); !errors.Is(err, talaris.ErrInvalidUTF8) {
			t.Fatalf("SendBatch with invalid UTF-8: %v", err)
		}
		if err := c.SendBatch(talaris.Opcode(ws.OpPing), [][]byte{[]byte("x")}); !errors.Is(err, talaris.ErrInvalidOpcode) {
			t.Fatalf("SendBatch with a ping opcode: %v", err)
		}
		if err := c.SendBatch(talaris.OpBinary, nil); err != nil {
			t.Fatalf("empty SendBatch: %v", err)
		}
		// A batch larger than the whole queue goes when it is empty.
		i := 0
		batch := func(k, size int) [][]byte {
			msgs := make([][]byte, k)
			for j := range msgs {
				msgs[j] = seqMsg(make([]byte, size), i+j)
			}
			return msgs
		}
		if err := c.SendBatch(talaris.OpBinary, batch(40, 64<<10)); err != nil { // 2.5 MiB > MaxSendQueue
			t.Fatalf("large SendBatch on an empty queue: %v", err)
		}
		i += 40
		// All or nothing: fill until refused; a refused batch leaves the
		// queue as it was.
		for rounds := 0; ; rounds++ {
			before := c.Stats()
			err := c.SendBatch(talaris.OpBinary, batch(64, 4096))
			if errors.Is(err, talaris.ErrWouldBlock) {
				// Nothing of it was queued: the server's count and its
				// sequence check below would see any part of it.
				t.Logf("batch refused after %d messages accepted (stats before %+v)", i, before)
				break
			}
			if err != nil {
				t.Fatalf("SendBatch: %v", err)
			}
			i += 64
			if rounds > 100000 {
				t.Fatal("the queue never filled against a peer that does not read")
			}
		}
		close(s.gate)
		ctx, cancel := dialCtx(t)
		defer cancel()
		if err := c.Flush(ctx); err != nil {
			t.Fatalf("Flush: %v", err)
		}
		// Idle again: small batches; on ws:// each goes out from this
		// goroutine in one write.
		for k := 0; k < 50; k++ {
			if err := c.SendBatch(talaris.OpBinary, batch(8, orderSize)); err != nil {
				t.Fatalf("SendBatch %d: %v", k, err)
			}
			i += 8
			if err := c.Flush(ctx); err != nil {
				t.Fatalf("Flush: %v", err)
			}
		}
		s.waitCount(t, i)
		f := closeAndWait(t, p, c)
		if n, _, err := s.state(); err != nil || n != i || f.Kind != talaris.EventClose || f.SendDropped != 0 {
			t.Fatalf("server read %d of %d (%v); final %+v", n, i, err, f)
		}
	})
}

// TestSendBatchRacingClose: SendBatch from several goroutines racing
// Conn.Close and Pool.Close: every error is one of the end's, every batch
// that returned nil reached the server whole (the sink checks order per
// sender is not mixed: one sender here), nothing hangs.
func TestSendBatchRacingClose(t *testing.T) {
	for _, poolClose := range []bool{false, true} {
		name := "Conn.Close"
		if poolClose {
			name = "Pool.Close"
		}
		t.Run(name, func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, useTLS bool) {
				s := newSink(t, useTLS, true, 0)
				p := newTestPool(t, talaris.Config{}, hangGuard)
				c := dialSink(t, p, s)
				var wg sync.WaitGroup
				accepted := 0
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; {
						msgs := make([][]byte, 16)
						for j := range msgs {
							msgs[j] = seqMsg(make([]byte, orderSize), i+j)
						}
						err := c.SendBatch(talaris.OpBinary, msgs)
						if errors.Is(err, talaris.ErrWouldBlock) {
							continue
						}
						if err != nil {
							if !errors.Is(err, talaris.ErrClosed) && !errors.Is(err, talaris.ErrPoolClosed) {
								t.Errorf("SendBatch: %v", err)
							}
							return
						}
						i += 16
						accepted = i
					}
				}()
				time.Sleep(20 * time.Millisecond) // let batches flow: the race is the point, not a verdict
				if poolClose {
					p.Close()
				} else {
					c.Close(talaris.CloseNormal, "")
					pumpOne(t, p, c, nil)
				}
				wg.Wait()
				s.waitClosed(t)
				n, _, err := s.state()
				if err != nil {
					t.Fatalf("sink: %v", err)
				}
				if n != accepted {
					t.Fatalf("the server read %d orders, %d were accepted before the close", n, accepted)
				}
				if accepted == 0 {
					t.Fatal("no batch was accepted before the close: the race did not run")
				}
			})
		})
	}
}

// chattyServer answers the client's close frame and keeps writing data
// frames after its own close frame without ever closing TCP (a writer
// goroutine that does not stop), or, with silent, stays silent and
// connected.
func chattyServer(t *testing.T, useTLS, silent bool) (string, *talaris.DialOptions) {
	t.Helper()
	srv := wstest.NewRaw(func(c *wstest.RawConn) {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		if !silent {
			wg.Add(1)
			go func() {
				defer wg.Done()
				msg := make([]byte, 256)
				for {
					select {
					case <-stop:
						return
					default:
					}
					mu.Lock()
					err := c.WriteFrame(true, ws.OpBinary, msg)
					mu.Unlock()
					if err != nil {
						return
					}
					time.Sleep(100 * time.Microsecond)
				}
			}()
		}
		for {
			op, p, err := c.ReadMessage()
			if err != nil {
				break
			}
			if op == ws.OpClose {
				code, _, _ := ws.ParseClosePayload(p)
				mu.Lock()
				c.WriteClose(code, "")
				mu.Unlock()
				// No FIN: keep the connection (and, unless silent, the
				// writer) going until the client goes.
				c.SetDeadline(hangGuard)
				for {
					if _, _, err := c.ReadFrame(); err != nil {
						break
					}
				}
				break
			}
		}
		close(stop)
		wg.Wait()
	})
	opts := startWS(t, useTLS, srv.Start, srv.StartTLS)
	return srv.URL, opts
}

// TestClosePrompt: a server that echoes the close frame but keeps
// writing (or stays silent) without ever closing TCP does not hold a
// close for the whole close timeout (30 s here): Conn.Close, Pool.Close
// while another goroutine pumps, and Pool.Close from inside a callback
// each end cleanly (EventClose for Conn.Close) once both close frames
// have crossed. The verdict is the kind of end, not a time: a close held
// for its timeout would end with ErrCloseTimeout.
func TestClosePrompt(t *testing.T) {
	for _, silent := range []bool{false, true} {
		peer := "chatty"
		if silent {
			peer = "silent"
		}
		for _, how := range []string{"Conn.Close", "Pool.Close-while-pumping", "Pool.Close-in-callback"} {
			t.Run(peer+"/"+how, func(t *testing.T) {
				forEachTransport(t, func(t *testing.T, useTLS bool) {
					url, opts := chattyServer(t, useTLS, silent)
					p := newTestPool(t, talaris.Config{CloseTimeout: 30 * time.Second}, hangGuard)
					ctx, cancel := dialCtx(t)
					defer cancel()
					c, err := p.Dial(ctx, url, opts)
					if err != nil {
						t.Fatalf("Dial: %v", err)
					}
					t0 := time.Now()
					switch how {
					case "Conn.Close":
						if err := c.Close(talaris.CloseNormal, "bye"); err != nil {
							t.Fatal(err)
						}
						f := pumpOne(t, p, c, nil)
						t.Logf("Close to final event: %v (%+v)", time.Since(t0).Round(time.Millisecond), f)
						if f.Kind != talaris.EventClose || f.Code != talaris.CloseNormal {
							t.Fatalf("final %+v, want EventClose 1000 (not a close timeout)", f)
						}
					case "Pool.Close-while-pumping":
						pumped := make(chan error, 1)
						go func() {
							for {
								if _, err := p.Pump(func(talaris.Conn, talaris.Event) {}); err != nil {
									pumped <- err
									return
								}
							}
						}()
						time.Sleep(20 * time.Millisecond) // data flows (chatty) before the close
						if err := p.Close(); err != nil {
							t.Fatal(err)
						}
						el := time.Since(t0)
						if err := <-pumped; !errors.Is(err, talaris.ErrPoolClosed) {
							t.Fatalf("pump: %v", err)
						}
						t.Logf("Pool.Close took %v", el.Round(time.Millisecond))
						if el >= 30*time.Second {
							t.Fatal("Pool.Close waited for the whole close timeout")
						}
					case "Pool.Close-in-callback":
						var closeErr error
						closed := false
						_, err := p.Pump(func(talaris.Conn, talaris.Event) {
							if !closed {
								closed = true
								closeErr = p.Close()
							}
						})
						el := time.Since(t0)
						if closeErr != nil || !errors.Is(err, talaris.ErrPoolClosed) {
							t.Fatalf("Pool.Close in a callback: %v; Pump: %v", closeErr, err)
						}
						t.Logf("Pump with Pool.Close in its callback returned after %v", el.Round(time.Millisecond))
						if el >= 30*time.Second {
							t.Fatal("Pool.Close waited for the whole close timeout")
						}
					}
				})
			})
		}
	}
}

// TestFlushAfterReconnectDrop: orders queued to a server that does not
// read, then a reset: the reconnect drops them (EventReconnecting's
// SendDropped counts them) and a Flush called after the drop (in the gap,
// or once the next connection is open) reports it instead of nil; the
// next Flush, with nothing new dropped, returns nil.
func TestFlushAfterReconnectDrop(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		var conns sync.Mutex
		n := 0
		reset := make(chan struct{})
		srv := wstest.NewRaw(func(c *wstest.RawConn) {
			conns.Lock()
			n++
			first := n == 1
			conns.Unlock()
			if first {
				<-reset // read nothing, then reset
				c.Reset()
				return
			}
			for {
				if _, _, err := c.ReadMessage(); err != nil {
					return
				}
			}
		})
		opts := startWS(t, useTLS, srv.Start, srv.StartTLS)
		if opts == nil {
			opts = &talaris.DialOptions{}
		} else {
			o := *opts
			opts = &o
		}
		opts.Reconnect = &talaris.ReconnectPolicy{MinDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond}
		p := newTestPool(t, talaris.Config{MaxSendQueue: 64 << 20}, hangGuard)
		ctx, cancel := dialCtx(t)
		defer cancel()
		c, err := p.Dial(ctx, srv.URL, opts)
		if err != nil {
			t.Fatalf("Dial: %v", err)
		}
		next := 0
		saturate(t, c, &next, 64<<10)
		close(reset)
		var dropped uint64
		reopened := false
		pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventReconnecting:
				dropped += ev.SendDropped
			case talaris.EventOpen:
				reopened = ev.Reconnects > 0 // (the first open's event comes first)
			case talaris.EventClose, talaris.EventError:
				t.Fatalf("final event %+v: the handle should reconnect", ev)
			}
		}, func() bool { return reopened }, nil)
		if dropped == 0 {
			t.Fatalf("EventReconnecting reported no dropped orders (stats %+v)", c.Stats())
		}
		err = c.Flush(ctx)
		if err == nil || !strings.Contains(err.Error(), "dropped") {
			t.Fatalf("Flush after %d orders were dropped by the reconnect: %v, want an error that says so", dropped, err)
		}
		t.Logf("Flush after the drop: %v", err)
		if err := c.SendText([]byte(`{"resend":1}`)); err != nil {
			t.Fatalf("SendText on the new connection: %v", err)
		}
		if err := c.Flush(ctx); err != nil {
			t.Fatalf("Flush with nothing dropped since: %v", err)
		}
		closeAndWait(t, p, c)
	})
}
