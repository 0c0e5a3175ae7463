//go:build linux && cgo

package talaris_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// Closing: by either side, from a callback, racing Pool.Close, Conn.Abort,
// Pool.Close's 1001 and the close handshake's timing and timeout.

// ---- Abort ----

// checkDead checks that every method of an ended connection says so.
func checkDead(t *testing.T, c talaris.Conn) {
	t.Helper()
	if err := c.Abort(); !errors.Is(err, talaris.ErrClosed) {
		t.Errorf("Abort after the end: %v, want ErrClosed", err)
	}
	if err := c.Close(talaris.CloseNormal, ""); !errors.Is(err, talaris.ErrClosed) {
		t.Errorf("Close after the end: %v, want ErrClosed", err)
	}
	if err := c.SendText([]byte("x")); !errors.Is(err, talaris.ErrClosed) {
		t.Errorf("SendText after the end: %v, want ErrClosed", err)
	}
	if st := c.State(); st != talaris.StateClosed {
		t.Errorf("State after the end: %v", st)
	}
}

// TestAbort: Abort ends an open connection (gorilla echo, ws and wss), a
// connection with megabytes of output queued for a server that does not
// read, a connection still dialing, and a memory connection: each at
// once, with EventError wrapping ErrAborted and code 1006; afterwards
// every method reports ErrClosed. "At once" is the event's doing, not a
// timer's: the pool's timers that could end these connections (the
// handshake's, the close's) are longer than the hang guard, so an Abort
// that only took effect at one would trip the hang guard, and one that
// degraded into a close or a timeout would end with another error; the
// connection with 16 MiB queued ends with them dropped (SendDropped), not
// drained. The time each took is logged, not asserted.
func TestAbort(t *testing.T) {
	p := newTestPool(t, talaris.Config{HandshakeTimeout: 2 * hangGuard, CloseTimeout: 2 * hangGuard}, hangGuard)
	ctx, cancel := dialCtx(t)
	defer cancel()
	expectAborted := func(t *testing.T, c talaris.Conn, what string) finalEvent {
		t.Helper()
		t0 := time.Now()
		if err := c.Abort(); err != nil {
			t.Fatalf("Abort: %v", err)
		}
		f, at := pumpFinal(t, p, c, nil) // hang guard: newTestPool's
		t.Logf("%s: aborted in %v", what, at.Sub(t0))
		if f.Kind != talaris.EventError || !errors.Is(f.Err, talaris.ErrAborted) || !errors.Is(f.Err, talaris.ErrClosed) || f.Code != talaris.CloseAbnormal {
			t.Fatalf("%s: final %+v, want EventError ErrAborted (matching ErrClosed too) 1006", what, f)
		}
		checkDead(t, c)
		return f
	}

	for _, sc := range schemes() {
		t.Run("open_"+sc.name, func(t *testing.T) {
			srv := wstest.NewGorilla()
			startWS(t, sc.name == "wss", srv.Start, srv.StartTLS)
			c, err := p.Dial(ctx, srv.URL+"/echo", &sc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.SendText([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			got := ""
			for got == "" {
				if _, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
					if cc == c && ev.Kind == talaris.EventText {
						got = string(ev.Payload)
					}
				}); err != nil {
					t.Fatalf("pump before the echo: %v", err) // (ErrPoolClosed: the hang guard)
				}
			}
			expectAborted(t, c, "open "+sc.name)
		})
	}

	t.Run("queued", func(t *testing.T) {
		done := make(chan struct{})
		srv := wstest.NewRaw(func(c *wstest.RawConn) { <-done }).Start(t) // never reads
		t.Cleanup(func() { close(done) })
		c, err := p.Dial(ctx, srv.URL+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		big := make([]byte, 1<<20)
		for range 16 { // more than the socket buffers take: the rest waits in the loop
			if err := c.SendBinary(big); err != nil {
				t.Fatal(err)
			}
		}
		if f := expectAborted(t, c, "16 MiB queued"); f.SendDropped == 0 {
			t.Errorf("aborted with 16 MiB queued for a peer that never reads: final %+v counts no message dropped (the abort waited for the queue?)", f)
		}
	})

	t.Run("dialing", func(t *testing.T) {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() { // accept and say nothing: the upgrade never completes
			for {
				nc, err := ln.Accept()
				if err != nil {
					return
				}
				defer nc.Close()
			}
		}()
		c, err := p.DialAsync("ws://"+ln.Addr().String()+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		expectAborted(t, c, "dialing")
	})

	t.Run("memory", func(t *testing.T) {
		c, err := p.DialMemory()
		if err != nil {
			t.Fatal(err)
		}
		expectAborted(t, c, "memory")
	})
}

// TestAbortRaces: Abort, Close and Send race from their own goroutines on
// live connections (ws and wss), and in a second part Pool.Close joins
// them. Every call returns nil, ErrClosed or ErrPoolClosed; each
// connection ends with exactly one final event, ErrAborted or a clean
// close; Pool.Close returns within its CloseTimeout bound.
func TestAbortRaces(t *testing.T) {
	rounds, poolRounds := 40, 10
	if testing.Short() {
		rounds, poolRounds = 10, 4
	}
	small := testhook.WithKnobs(talaris.Config{ArenaSize: 1 << 20, MaxMessageSize: 64 << 10, BufCount: 64, MaxConns: 16, CloseTimeout: 2 * time.Second}, testhook.Knobs{EventRingSize: 1024, CmdRingSize: 1 << 16})
	okErr := func(err error) bool {
		return err == nil || errors.Is(err, talaris.ErrClosed) || errors.Is(err, talaris.ErrPoolClosed)
	}
	for _, sc := range schemes() {
		t.Run(sc.name, func(t *testing.T) {
			srv := wstest.NewGorilla()
			startWS(t, sc.name == "wss", srv.Start, srv.StartTLS)
			ctx, cancel := dialCtx(t)
			defer cancel()
			p := newTestPool(t, small, hangGuard)
			for r := range rounds {
				c, err := p.Dial(ctx, srv.URL+"/echo", &sc.opts)
				if err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				errs := make(chan error, 64)
				wg.Add(3)
				go func() { defer wg.Done(); errs <- c.Abort() }()
				go func() { defer wg.Done(); errs <- c.Close(talaris.CloseNormal, "race") }()
				go func() {
					defer wg.Done()
					for i := 0; i < 20; i++ {
						if err := c.SendText([]byte("x")); err != nil {
							errs <- err
							return
						}
					}
				}()
				f, _ := pumpFinal(t, p, c, nil)
				wg.Wait()
				close(errs)
				for err := range errs {
					if !okErr(err) {
						t.Errorf("round %d: call returned %v", r, err)
					}
				}
				aborted := f.Kind == talaris.EventError && errors.Is(f.Err, talaris.ErrAborted)
				closed := f.Kind == talaris.EventClose && f.Code == talaris.CloseNormal
				if !aborted && !closed {
					t.Fatalf("round %d: final %+v, want ErrAborted or a clean close", r, f)
				}
				checkDead(t, c)
			}

			for r := range poolRounds {
				p, err := talaris.NewPool(small)
				if err != nil {
					t.Fatal(err)
				}
				var conns []talaris.Conn
				for range 3 {
					c, err := p.Dial(ctx, srv.URL+"/echo", &sc.opts)
					if err != nil {
						t.Fatal(err)
					}
					conns = append(conns, c)
				}
				var wg sync.WaitGroup
				errs := make(chan error, 256)
				pumped := make(chan error, 1)
				go func() {
					for {
						_, err := p.Pump(func(talaris.Conn, talaris.Event) {})
						if poolEmptied(err) {
							// every connection ended before Pool.Close
							continue
						}
						if err != nil {
							pumped <- err
							return
						}
					}
				}()
				for _, c := range conns {
					wg.Add(3)
					go func() { defer wg.Done(); errs <- c.Abort() }()
					go func() { defer wg.Done(); errs <- c.Close(talaris.CloseGoingAway, "race") }()
					go func() {
						defer wg.Done()
						for i := 0; i < 20; i++ {
							if err := c.SendText([]byte("x")); err != nil {
								errs <- err
								return
							}
						}
					}()
				}
				t0 := time.Now()
				if err := p.Close(); err != nil {
					t.Fatal(err)
				}
				if d := time.Since(t0); d > small.CloseTimeout+2*time.Second {
					t.Errorf("pool round %d: Close took %v", r, d)
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					if !okErr(err) {
						t.Errorf("pool round %d: call returned %v", r, err)
					}
				}
				if err := <-pumped; !errors.Is(err, talaris.ErrPoolClosed) {
					t.Errorf("pool round %d: pump ended with %v, want ErrPoolClosed", r, err)
				}
				for _, c := range conns {
					if err := c.Abort(); !okErr(err) || err == nil {
						t.Errorf("pool round %d: Abort after Pool.Close: %v", r, err)
					}
				}
			}
		})
	}
}

// ---- closes ----

// TestPoolCloseGoingAway: Pool.Close sends 1001 "pool closed" and waits
// for the close handshake: a raw Go server (ws) and Python websockets
// (wss) both receive 1001, and Close returns once the handshake is done
// (in milliseconds: logged); against a server that never answers it
// returns after CloseTimeout. Where the handshake completes, the pool's
// CloseTimeout is longer than the hang guard: a Close that returns within
// the hang guard was ended by the handshake (the server's echo, then its
// FIN or the short grace), not by the close timer, however loaded the
// machine.
func TestPoolCloseGoingAway(t *testing.T) {
	ctx, cancel := dialCtx(t)
	defer cancel()
	const longClose = 2 * hangGuard
	closePool := func(t *testing.T, p *talaris.Pool) time.Duration {
		t.Helper()
		t0 := time.Now()
		done := make(chan struct{})
		go func() {
			p.Close()
			close(done)
		}()
		select {
		case <-done:
			return time.Since(t0)
		case <-time.After(hangGuard): // hang guard: the handshake takes milliseconds
			t.Fatalf("Pool.Close did not return in %v (CloseTimeout %v): the close handshake did not complete", hangGuard, longClose)
			return 0
		}
	}

	t.Run("raw_ws", func(t *testing.T) {
		got := make(chan string, 1)
		srv := wstest.NewRaw(func(c *wstest.RawConn) {
			c.SetDeadline(30 * time.Second)
			code, reason, err := c.ExpectClose()
			got <- fmt.Sprintf("%d %s %v", code, reason, err)
			c.WriteClose(code, "")
			for { // until the client's FIN
				if _, _, err := c.ReadFrame(); err != nil {
					return
				}
			}
		}).Start(t)
		p, err := talaris.NewPool(talaris.Config{CloseTimeout: longClose})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Dial(ctx, srv.URL+"/", nil); err != nil {
			t.Fatal(err)
		}
		d := closePool(t, p)
		g := <-got
		t.Logf("server received %q; Pool.Close took %v", g, d)
		if g != "1001 pool closed <nil>" {
			t.Errorf("server received close %q, want 1001 pool closed", g)
		}
	})

	t.Run("python_wss", func(t *testing.T) {
		pp := startPython(t, true)
		p, err := talaris.NewPool(talaris.Config{CloseTimeout: longClose})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Dial(ctx, "wss://127.0.0.1:"+pp.port+"/record", tlsOpts); err != nil {
			t.Fatal(err)
		}
		d := closePool(t, p)
		l := pp.waitLine(t, "CLOSED")
		t.Logf("%s: Python websockets printed %q; Pool.Close took %v", talaris.TLSBackend(), l, d)
		if l != "CLOSED 1001 pool closed" {
			t.Errorf("server saw %q, want CLOSED 1001 pool closed", l)
		}
	})

	t.Run("flood_unpumped", func(t *testing.T) {
		// The server floods (and reads in parallel) and nobody pumps: the
		// event ring is full and the connection stalled when Close runs.
		// The close handshake still completes (events are dropped once
		// the pool closes): Close returns though CloseTimeout is longer
		// than the hang guard.
		got := make(chan string, 1)
		srv := wstest.NewRaw(func(c *wstest.RawConn) {
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				msg := make([]byte, 1000)
				for !stop.Load() {
					if c.WriteFrame(true, ws.OpBinary, msg) != nil {
						return
					}
				}
			}()
			c.SetDeadline(30 * time.Second)
			code, reason, err := c.ExpectClose()
			stop.Store(true)
			wg.Wait()
			got <- fmt.Sprintf("%d %s %v", code, reason, err)
			c.WriteClose(code, "")
			for {
				if _, _, err := c.ReadFrame(); err != nil {
					return
				}
			}
		}).Start(t)
		p, err := talaris.NewPool(testhook.WithKnobs(talaris.Config{ArenaSize: 1 << 20, MaxMessageSize: 64 << 10, CloseTimeout: longClose}, testhook.Knobs{EventRingSize: 1024}))
		if err != nil {
			t.Fatal(err)
		}
		c, err := p.Dial(ctx, srv.URL+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		for c.Stats().MsgsIn < 512 { // the ring (1024 events) fills (hang guard: the test timeout)
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond)
		d := closePool(t, p)
		g := <-got
		t.Logf("Pool.Close of a stalled flooded connection took %v (CloseTimeout %v); server received %q", d, longClose, g)
		if g != "1001 pool closed <nil>" {
			t.Errorf("server received close %q, want 1001 pool closed", g)
		}
	})

	t.Run("unanswered", func(t *testing.T) {
		done := make(chan struct{})
		srv := wstest.NewRaw(func(c *wstest.RawConn) { <-done }).Start(t)
		t.Cleanup(func() { close(done) })
		p, err := talaris.NewPool(talaris.Config{CloseTimeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.Dial(ctx, srv.URL+"/", nil); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		p.Close()
		d := time.Since(t0)
		t.Logf("Pool.Close with an unanswered 1001 took %v (CloseTimeout 300ms)", d)
		if d < 250*time.Millisecond || d > 3*time.Second {
			t.Errorf("Pool.Close took %v, want about CloseTimeout", d)
		}
	})
}

// closePeer is one server of the close timing table: URLs of an endpoint
// that waits for the client's close and one that closes at once.
type closePeer struct {
	name, waitURL, closeURL string
	wss                     bool
}

// TestCloseTiming closes connections in both directions against Python
// websockets, Node ws, gorilla and coder, over wss (and ws for
// reference), and logs how long each close took: from Close to the final
// event, and from the open to the final event of a server-closed
// connection. Over TLS the client answers the completed handshake with
// close_notify and its FIN, so none waits for CloseTimeout any more: with
// a CloseTimeout of 30 s (far beyond any handshake on a loaded machine,
// within the hang guard) the final event must be a clean EventClose 1000,
// which only the handshake gives (the server's close frame, then its FIN
// or the 100 ms grace); a close the timer ended is EventError wrapping
// ErrCloseTimeout. The times are logged, not asserted.
func TestCloseTiming(t *testing.T) {
	ctx, cancel := dialCtx(t)
	defer cancel()
	tlsCfg := serverTLS(t, testCertFile, testKeyFile, 0, 0)
	var peers []closePeer
	for _, k := range []struct {
		name string
		new  func() *wstest.Server
	}{{"gorilla", wstest.NewGorilla}, {"coder", wstest.NewCoder}} {
		for _, wss := range []bool{false, true} {
			srv := k.new()
			if wss {
				srv.StartTLS(t, tlsCfg)
			} else {
				srv.Start(t)
			}
			peers = append(peers, closePeer{k.name, srv.URL + "/echo", srv.URL + "/close?code=1000&reason=done", wss})
		}
	}
	for _, wss := range []bool{false, true} {
		if exec.Command("python3", "-c", "import websockets").Run() != nil {
			t.Log("python3 websockets not installed: skipping the Python peer")
			break
		}
		pp := startPython(t, wss)
		u := "ws://127.0.0.1:" + pp.port
		if wss {
			u = "wss://127.0.0.1:" + pp.port
		}
		peers = append(peers, closePeer{"python-websockets", u + "/echo", u + "/stream?n=0", wss})
	}
	if _, err := os.Stat("../build/node/node_modules/ws"); err == nil || os.Getenv("TALARIS_NODE_MODULES") != "" {
		pp := startNode(t)
		u := "wss://127.0.0.1:" + pp.port
		peers = append(peers, closePeer{"node-ws", u + "/stream?n=0&hold=1", u + "/stream?n=0", true})
	} else {
		t.Log("node ws not installed: skipping the Node peer")
	}

	p := newTestPool(t, talaris.Config{CloseTimeout: hangGuard / 2}, hangGuard)
	for _, pc := range peers {
		scheme := "ws"
		opts := &talaris.DialOptions{}
		if pc.wss {
			scheme, opts = "wss", tlsOpts
		}
		t.Run(pc.name+"_"+scheme, func(t *testing.T) {
			c, err := p.Dial(ctx, pc.waitURL, opts)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			if err := c.Close(talaris.CloseNormal, "bye"); err != nil {
				t.Fatal(err)
			}
			fc, at := pumpFinal(t, p, c, nil)
			dClient := at.Sub(t0)

			t1 := time.Now()
			c2, err := p.Dial(ctx, pc.closeURL, opts)
			if err != nil {
				t.Fatal(err)
			}
			fs, at2 := pumpFinal(t, p, c2, nil)
			dServer := at2.Sub(t1)
			t.Logf("close timing %s %s %s: client-initiated %v, server-initiated (dial+close) %v",
				talaris.TLSBackend(), pc.name, scheme, dClient.Round(10*time.Microsecond), dServer.Round(10*time.Microsecond))
			if fc.Kind != talaris.EventClose || fc.Code != talaris.CloseNormal {
				t.Errorf("client-initiated close ended with %+v (after %v), want EventClose 1000: the handshake's end, not the close timer's", fc, dClient)
			}
			if fs.Kind != talaris.EventClose || fs.Code != talaris.CloseNormal {
				t.Errorf("server-initiated close ended with %+v (after %v), want EventClose 1000: the handshake's end, not the close timer's", fs, dServer)
			}
		})
	}
}

// TestCloseTimeoutReported: a server that reads the close frame but never
// answers it (nor ends TCP) makes the close time out, and that is
// reported as EventError wrapping ErrCloseTimeout, not as a clean close.
// (A server that answers but never ends TCP ends cleanly after a short
// grace: TestClosePrompt.)
func TestCloseTimeoutReported(t *testing.T) {
	done := make(chan struct{})
	srv := wstest.NewRaw(func(c *wstest.RawConn) {
		c.ExpectClose()
		<-done // keep TCP open, answer nothing
	}).Start(t)
	t.Cleanup(func() { close(done) })
	p := newTestPool(t, talaris.Config{CloseTimeout: 300 * time.Millisecond}, hangGuard)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := p.Dial(ctx, srv.URL+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := c.Close(talaris.CloseNormal, "bye"); err != nil {
		t.Fatal(err)
	}
	f, at := pumpFinal(t, p, c, nil)
	t.Logf("close with no TCP end: %+v after %v", f, at.Sub(t0))
	if f.Kind != talaris.EventError || !errors.Is(f.Err, talaris.ErrCloseTimeout) {
		t.Fatalf("final %+v, want EventError ErrCloseTimeout", f)
	}
}

// TestCloseByClient: Close(4001, "bye") reaches the server, which answers
// with the same code; the handshake ends with EventClose.
func TestCloseByClient(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv *wstest.Server) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		c := dial(t, p, srv.URL+"/echo")
		if err := c.SendText([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		echoed := false
		closed := false
		f := pumpOne(t, p, c, func(ev talaris.Event) {
			if ev.Kind == talaris.EventText && string(ev.Payload) == "hello" && !closed {
				echoed = true
				closed = true
				if err := c.Close(4001, "bye"); err != nil {
					t.Errorf("Close: %v", err)
				}
			}
		})
		if !echoed {
			t.Errorf("echo did not arrive")
		}
		if f.Kind != talaris.EventClose || f.Code != 4001 {
			t.Errorf("final %+v, want EventClose 4001 (the server echoes the client's code)", f)
		}
		if err := c.SendText([]byte("x")); !errors.Is(err, talaris.ErrClosed) {
			t.Errorf("SendText after close: %v, want ErrClosed", err)
		}
	})
	t.Run("raw", func(t *testing.T) {
		type got struct {
			code   int
			reason string
			err    error
		}
		ch := make(chan got, 1)
		srv := wstest.NewRaw(func(rc *wstest.RawConn) {
			rc.SetDeadline(30 * time.Second)
			code, reason, err := rc.ExpectClose()
			ch <- got{code, reason, err}
			if err == nil {
				rc.WriteClose(code, "ack "+reason)
			}
			rc.Close()
		}).Start(t)
		p := newTestPool(t, talaris.Config{}, hangGuard)
		c := dial(t, p, srv.URL+"/")
		if err := c.Close(4001, "bye"); err != nil {
			t.Fatal(err)
		}
		f := pumpOne(t, p, c, nil)
		g := <-ch
		if g.err != nil || g.code != 4001 || g.reason != "bye" {
			t.Errorf("server saw close %d %q (err %v), want 4001 \"bye\"", g.code, g.reason, g.err)
		}
		if f.Kind != talaris.EventClose || f.Code != 4001 || f.Reason != "ack bye" {
			t.Errorf("final %+v, want EventClose 4001 \"ack bye\"", f)
		}
	})
}

// TestCloseByServer: the server's close code and reason reach the client.
func TestCloseByServer(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv *wstest.Server) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		for _, tc := range []struct {
			code   int
			reason string
		}{{4002, "x"}, {1000, ""}, {1001, "going away"}, {3999, "ünïcödé"}} {
			c := dial(t, p, srv.URL+"/close?code="+strconv.Itoa(tc.code)+"&reason="+urlQueryEscape(tc.reason))
			f := pumpOne(t, p, c, nil)
			if f.Kind != talaris.EventClose || f.Code != tc.code || f.Reason != tc.reason {
				t.Errorf("final %+v, want EventClose %d %q", f, tc.code, tc.reason)
			}
		}
		// A close frame without a body reports 1005.
		c := dial(t, p, srv.URL+"/close?code=0")
		if f := pumpOne(t, p, c, nil); f.Kind != talaris.EventClose || f.Code != talaris.CloseNoStatus {
			t.Errorf("empty close: final %+v, want EventClose 1005", f)
		}
	})
}

func urlQueryEscape(s string) string {
	var b bytes.Buffer
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// TestServerDrop: TCP closed (FIN or reset) without a close frame ends the
// connection with EventError, code 1006 and ErrConnectionLost, after every
// message sent before the drop.
func TestServerDrop(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv *wstest.Server) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		for _, rst := range []bool{false, true} {
			spec := streamSpec{n: 1000, size: 100}
			path := spec.path()
			path = "/drop" + path[len("/stream"):]
			if rst {
				path += "&rst=1"
			}
			c := dial(t, p, srv.URL+path)
			st := newStreamState(spec)
			st.opened = true // EventOpen is checked by the other tests
			f := pumpOne(t, p, c, func(ev talaris.Event) {
				if ev.Kind != talaris.EventOpen {
					st.on(ev)
				}
			})
			if st.err != nil {
				t.Errorf("rst=%v: %v", rst, st.err)
			}
			// A reset may destroy data the kernel had not yet delivered;
			// with FIN every message must arrive.
			if !rst && st.chk.Count() != spec.n {
				t.Errorf("got %d messages before the drop, want %d", st.chk.Count(), spec.n)
			}
			if f.Kind != talaris.EventError || f.Code != talaris.CloseAbnormal || !errors.Is(f.Err, talaris.ErrConnectionLost) {
				t.Errorf("rst=%v: final %+v, want EventError 1006 ErrConnectionLost", rst, f)
			}
			var ce *talaris.ConnError
			if !errors.As(f.Err, &ce) || ce.Code != talaris.CloseAbnormal {
				t.Errorf("rst=%v: Err %v is not a *ConnError with Code 1006", rst, f.Err)
			}
		}
	})
}

// TestCloseFromCallback: Pool.Close called inside a pump callback returns
// promptly and the pump then returns ErrPoolClosed, for Pump and for
// PumpData with OnEvent (from both the data and the event callback).
func TestCloseFromCallback(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	for _, mode := range []string{"Pump", "PumpData/data", "PumpData/OnEvent"} {
		t.Run(mode, func(t *testing.T) {
			var p *talaris.Pool
			var took time.Duration
			closeNow := func() {
				start := time.Now()
				if err := p.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				took = time.Since(start)
			}
			cfg := talaris.Config{}
			if mode == "PumpData/OnEvent" {
				cfg.OnEvent = func(c talaris.Conn, ev talaris.Event) {
					if ev.Kind == talaris.EventOpen && took == 0 {
						closeNow()
					}
				}
			}
			p = newTestPool(t, cfg, hangGuard)
			dial(t, p, srv.URL+"/stream?n=1000&size=8")
			var err error
			for took == 0 && err == nil {
				switch mode {
				case "Pump":
					_, err = p.Pump(func(c talaris.Conn, ev talaris.Event) {
						if ev.Kind == talaris.EventBinary && took == 0 {
							closeNow()
						}
					})
				default:
					_, err = p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {
						if mode == "PumpData/data" && took == 0 {
							closeNow()
						}
					})
				}
			}
			if !errors.Is(err, talaris.ErrPoolClosed) {
				t.Errorf("pump after Close in its callback: %v, want ErrPoolClosed", err)
			}
			if _, err := p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {}); !errors.Is(err, talaris.ErrPoolClosed) {
				t.Errorf("next PumpData: %v, want ErrPoolClosed", err)
			}
			// Generous: it used to wait 2 s for the pumper, itself.
			if took > time.Second {
				t.Errorf("Close inside a callback took %v", took)
			}
			t.Logf("Close inside a callback: %v", took)
		})
	}
}

// TestPoolCloseRace: Pool.Close while 8 goroutines call Dial, DialAsync,
// State, Stats, Send, Ping, Close and Abort (of conns) and Pool.Stats,
// with a pumper running: no crash, no race, and every call returns nil or
// a documented error; afterwards every handle reports StateClosed. Over ws
// and wss (run with -tags talaris_openssl for the other TLS backend).
func TestPoolCloseRace(t *testing.T) {
	// 1,000 rounds over ws; the wss rounds run under each TLS backend.
	// The ws rounds do not depend on the backend: the openssl build runs
	// fewer of them (CI runs both builds).
	wsRounds, wssRounds := 1000, 150
	if talaris.TLSBackend() == "openssl" {
		wsRounds = 100
	}
	if testing.Short() {
		wsRounds, wssRounds = 100, 50
	}
	if raceEnabled {
		wsRounds, wssRounds = wsRounds/4, wssRounds/4
	}
	plain := wstest.NewGorilla().Start(t)
	secure := wstest.NewGorilla().StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
	for _, tc := range []struct {
		name, url string
		opts      *talaris.DialOptions
		rounds    int
		loops     int // Config.Loops: the connections spread over them
	}{
		{"ws", plain.URL + "/echo", nil, wsRounds, 1}, {"wss", secure.URL + "/echo", tlsOpts, wssRounds, 1},
		{"ws-loops3", plain.URL + "/echo", nil, max(wsRounds/4, 20), 3},
		{"wss-loops2", secure.URL + "/echo", tlsOpts, max(wssRounds/3, 10), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.opts == nil {
				skipPlainInTLSOnly(t)
			}
			for round := range tc.rounds {
				closeRaceRound(t, round, tc.url, tc.opts, tc.loops)
				if t.Failed() {
					return
				}
			}
		})
	}
}

// allowedAfterClose reports whether err is one a call racing Pool.Close
// may return.
func allowedAfterClose(err error) bool {
	return err == nil || errors.Is(err, talaris.ErrPoolClosed) || errors.Is(err, talaris.ErrClosed) ||
		errors.Is(err, talaris.ErrTooManyConns) || errors.Is(err, talaris.ErrConnectionLost)
}

func closeRaceRound(t *testing.T, round int, url string, opts *talaris.DialOptions, loops int) {
	cfg := smallPool()
	cfg.Loops = loops
	var events atomic.Int64
	cfg.OnEvent = func(talaris.Conn, talaris.Event) { events.Add(1) } // PumpData's rounds
	p, err := talaris.NewPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := dialCtx(t)
	defer cancel()
	first, err := p.Dial(ctx, url, opts)
	if err != nil {
		t.Fatalf("round %d: Dial: %v", round, err)
	}
	var mu sync.Mutex
	handles := []talaris.Conn{first}
	var wg sync.WaitGroup
	start := make(chan struct{})
	closed := make(chan struct{})
	pumped := make(chan error, 1)
	go func() {
		for {
			var err error
			if round%2 == 0 {
				_, err = p.Pump(func(talaris.Conn, talaris.Event) {})
			} else {
				_, err = p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {})
			}
			if poolEmptied(err) {
				// every connection so far ended; more may be dialed
				continue
			}
			if err != nil {
				pumped <- err
				return
			}
		}
	}()
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; ; i++ {
				var err error
				mu.Lock()
				c := handles[i%len(handles)]
				mu.Unlock()
				op := (g + i) % 8
				if op < 2 && i >= 8 {
					op = 2 // a few dials per goroutine and round: each round stays cheap
				}
				switch op {
				case 0:
					var nc talaris.Conn
					dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
					nc, err = p.Dial(dctx, url, opts)
					dcancel()
					if err == nil {
						mu.Lock()
						handles = append(handles, nc)
						mu.Unlock()
					}
				case 1:
					var nc talaris.Conn
					nc, err = p.DialAsync(url, opts)
					if err == nil {
						mu.Lock()
						handles = append(handles, nc)
						mu.Unlock()
					}
				case 2:
					if st := c.State(); st == talaris.StateIdle {
						t.Errorf("round %d: State of a dialed handle: idle", round)
					}
				case 3:
					c.Stats()
				case 4:
					err = c.SendText([]byte("racing"))
				case 5:
					testhook.Stats(p)
					p.ConnCount()
				case 6:
					if i%16 == 6 {
						err = c.Close(talaris.CloseNormal, "")
					}
				case 7:
					c.Subprotocol()
					err = c.Ping([]byte("p"))
					if errors.Is(err, talaris.ErrWouldBlock) {
						err = nil // not open yet (DialAsync): control frames are not queued
					}
					if i%32 == 15 {
						err = c.Abort()
					}
				}
				if !allowedAfterClose(err) {
					t.Errorf("round %d: op %d: %v", round, op, err)
				}
				select {
				case <-closed:
					if i > 0 && (errors.Is(err, talaris.ErrPoolClosed) || i > 1000) {
						return
					}
				default:
				}
				// 8 hammering goroutines on a 2-core box: yield, so Close
				// and the loop thread get the CPU they need to finish.
				runtime.Gosched()
			}
		}()
	}
	close(start)
	time.Sleep(time.Duration(round%7) * 100 * time.Microsecond)
	if err := p.Close(); err != nil {
		t.Errorf("round %d: Close: %v", round, err)
	}
	close(closed)
	wg.Wait()
	if err := <-pumped; !errors.Is(err, talaris.ErrPoolClosed) {
		t.Errorf("round %d: Pump: %v", round, err)
	}
	for _, h := range handles {
		if st := h.State(); st != talaris.StateClosed {
			t.Errorf("round %d: handle State %v after Close, want closed", round, st)
		}
		if s := h.Stats(); s != (talaris.ConnStats{}) {
			t.Errorf("round %d: handle Stats %+v after Close, want zero", round, s)
		}
	}
	if n := p.ConnCount(); n != 0 {
		t.Errorf("round %d: ConnCount %d after Close", round, n)
	}
}

// TestPoolCloseWithFullRing: Close returns even when the ring is full and
// the server keeps sending (final events that find no room are dropped).
func TestPoolCloseWithFullRing(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	p, err := talaris.NewPool(testhook.WithKnobs(talaris.Config{}, testhook.Knobs{EventRingSize: 64}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = ctx
	for i := 0; i < 4; i++ {
		if _, err := p.DialAsync(srv.URL+"/stream?n=1000000&size=64", nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; testhook.Stats(p).Stalls == 0 && testhook.Stats(p).NoBufs == 0; i++ {
		if i > 3000 {
			t.Fatalf("never stalled: %+v", testhook.Stats(p))
		}
		time.Sleep(time.Millisecond)
	}
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Pool.Close hung with a full event ring")
	}
	if _, err := p.Pump(func(talaris.Conn, talaris.Event) {}); err != talaris.ErrPoolClosed {
		t.Fatalf("Pump after Close: %v, want ErrPoolClosed", err)
	}
}
