//go:build linux && cgo

package talaris_test

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
)

// The pump's reply doorbell (Config.ReplyDoorbell; docs/ARCHITECTURE.md,
// "Wait strategies"): after a direct send the pump sleeps in epoll on the
// socket and the loop's eventfd. These tests run a real gorilla server whose
// echo comes 1 ms late, so the pump has given up spinning and sleeps on the
// doorbell for every reply, and check that every reply still arrives in
// order, that Pool.Close and Conn.Close racing the ping-pong end it, and that
// a peer that stops reading or resets ends it cleanly. Timeouts are hang
// guards only.

// bellPeer is how the delayed echo server behaves after `after` echoes.
type bellPeer int

const (
	bellEcho     bellPeer = iota // keep echoing
	bellStopRead                 // stop reading (and echoing), keep the connection
	bellReset                    // reset the connection (RST)
)

// delayedEcho starts a gorilla echo server that answers each message after
// delay, behaving as mode says once it has echoed after messages.
func delayedEcho(t *testing.T, delay time.Duration, mode bellPeer, after int) string {
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for i := 0; ; i++ {
			if i == after && mode != bellEcho {
				if mode == bellReset {
					if tc, ok := c.UnderlyingConn().(*net.TCPConn); ok {
						tc.SetLinger(0)
					}
					return
				}
				time.Sleep(hangGuard)
				return
			}
			op, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			time.Sleep(delay)
			if c.WriteMessage(op, msg) != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

func TestReplyDoorbell(t *testing.T) {
	url := delayedEcho(t, time.Millisecond, bellEcho, 0)
	secure := wstest.NewGorilla().StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0)).URL + "/echo"
	for _, tc := range []struct {
		name     string
		cfg      talaris.Config
		url      string
		opts     *talaris.DialOptions
		wantBell bool
	}{
		{"bell/ws", talaris.Config{ReplyDoorbell: true}, url, nil, true},
		{"default/ws", talaris.Config{}, url, nil, false},
		{"bell-nodirect/ws", talaris.Config{ReplyDoorbell: true, NoDirectSend: true}, url, nil, false},
		{"bell-block/ws", talaris.Config{ReplyDoorbell: true, LoopWait: talaris.WaitBlock, ConsumerWait: talaris.WaitBlock}, url, nil, false},
		// wss sends go through the loop: no direct send, no doorbell.
		{"bell/wss", talaris.Config{ReplyDoorbell: true}, secure, tlsOpts, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, c := dialOpts(t, tc.cfg, tc.url, tc.opts)
			const n = 100
			if seen, err := pingPong(p, c, n); err != nil || seen != n {
				t.Fatalf("%d/%d echoes: %v", seen, n, err)
			}
			st := p.Stats()
			t.Logf("pump sleeps %d, on the doorbell %d, rung by the socket %d", st.PumpSleeps, st.BellSleeps, st.BellRings)
			if tc.wantBell && st.BellSleeps == 0 {
				t.Fatalf("the pump never slept on its doorbell (%d sleeps) over %d replies 1 ms apart", st.PumpSleeps, n)
			}
			if !tc.wantBell && (st.BellSleeps != 0 || st.BellRings != 0) {
				t.Fatalf("doorbell used: %+v", st)
			}
		})
	}
}

// bellDial opens a pool of cfg (hang-guarded) and dials url on it.
func bellDial(t *testing.T, cfg talaris.Config, url string) (*talaris.Pool, talaris.Conn) {
	t.Helper()
	return dialOpts(t, cfg, url, nil)
}

// dialOpts opens a pool of cfg (hang-guarded) and dials url on it with opts.
func dialOpts(t *testing.T, cfg talaris.Config, url string, opts *talaris.DialOptions) (*talaris.Pool, talaris.Conn) {
	t.Helper()
	p := newTestPool(t, cfg, hangGuard)
	ctx, cancel := dialCtx(t)
	defer cancel()
	c, err := p.Dial(ctx, url, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p, c
}

// TestReplyDoorbellCloseRace closes the Pool (and, every other round, the
// connection first) from another goroutine while the pump sleeps on its
// doorbell between delayed echoes: the pump returns ErrPoolClosed or
// ErrClosed, Close returns, and sends and pumps afterwards fail cleanly.
func TestReplyDoorbellCloseRace(t *testing.T) {
	url := delayedEcho(t, time.Millisecond, bellEcho, 0)
	for i := 0; i < 16; i++ {
		p := newTestPool(t, talaris.Config{ReplyDoorbell: true}, hangGuard)
		ctx, cancel := dialCtx(t)
		c, err := p.Dial(ctx, url, nil)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		pingPongCloseRace(t, p, c, i, time.Duration(i%8)*time.Millisecond+time.Duration(i)*137*time.Microsecond)
	}
}

// TestReplyDoorbellPeerEnds: the peer resets the connection, or stops
// reading and answering, while the pump sleeps on its doorbell for a reply.
// A reset ends the connection (the pump consumes its final event and, with
// no connection left, returns ErrNoConns); a silent peer leaves the
// pump asleep (not spinning: the doorbell is only a way to sleep) until
// Pool.Close, which wakes it with ErrPoolClosed.
func TestReplyDoorbellPeerEnds(t *testing.T) {
	t.Run("reset", func(t *testing.T) {
		url := delayedEcho(t, time.Millisecond, bellReset, 20)
		p, c := bellDial(t, talaris.Config{ReplyDoorbell: true}, url)
		seen, err := pingPong(p, c, 1<<30)
		// The answer to echo 20 meets the reset (ErrClosed) or goes out
		// before it; either way the pump then takes the final event.
		for errors.Is(err, talaris.ErrClosed) {
			_, err = p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {})
		}
		if seen != 20 || !errors.Is(err, talaris.ErrNoConns) {
			t.Fatalf("%d echoes before the reset (want 20), pump: %v (want ErrNoConns: the connection ended)", seen, err)
		}
		if st := c.State(); st != talaris.StateClosed {
			t.Fatalf("state %v after the reset", st)
		}
		if err := c.SendBinary([]byte("late")); err == nil {
			t.Fatal("send after the reset succeeded")
		}
	})
	t.Run("stop-reading", func(t *testing.T) {
		url := delayedEcho(t, time.Millisecond, bellStopRead, 20)
		p, c := bellDial(t, talaris.Config{ReplyDoorbell: true, CloseTimeout: 200 * time.Millisecond}, url) // the silent peer never answers our close
		go func() {
			// Ping-pong until the peer goes silent, then close once the
			// pump has been asleep a while.
			time.Sleep(300 * time.Millisecond)
			c0 := cpuTime()
			time.Sleep(200 * time.Millisecond)
			if used := cpuTime() - c0; used > 100*time.Millisecond {
				t.Errorf("%v CPU in 200 ms waiting for a silent peer: something spins", used)
			}
			p.Close()
		}()
		msg := make([]byte, 64)
		seen, err := pingPong(p, c, 1<<30)
		if seen != 20 || !errors.Is(err, talaris.ErrPoolClosed) {
			t.Fatalf("%d echoes (want 20), pump: %v (want ErrPoolClosed)", seen, err)
		}
		if err := c.SendBinary(msg); err == nil {
			t.Fatal("send after Close succeeded")
		}
	})
}

// TestReplyDoorbellAllocs: a round trip through the doorbell (a direct
// send, the pump asleep in epoll, woken by the socket or the eventfd)
// makes no cgo call and no allocation beyond the default's (the in-process
// gorilla server's own: the count is the process's).
func TestReplyDoorbellAllocs(t *testing.T) {
	url := delayedEcho(t, time.Millisecond, bellEcho, 0)
	var base float64
	for _, bell := range []bool{false, true} {
		p, c := bellDial(t, talaris.Config{ReplyDoorbell: bell}, url)
		msg := make([]byte, 64)
		got := false
		fn := func(talaris.Conn, talaris.Opcode, []byte) { got = true }
		var fail error
		round := func() {
			if err := c.SendBinary(msg); err != nil {
				fail = err
				return
			}
			for got = false; !got && fail == nil; {
				_, fail = p.PumpData(fn)
			}
		}
		round() // the socket joins the doorbell, the frame buffer grows
		cgo0, sleeps0 := runtime.NumCgoCall(), p.Stats().BellSleeps
		allocs := testing.AllocsPerRun(50, round)
		cgo, sleeps := runtime.NumCgoCall()-cgo0, p.Stats().BellSleeps-sleeps0
		if fail != nil {
			t.Fatal(fail)
		}
		t.Logf("doorbell %v: %.2f allocations and %d cgo calls per round trip; %d doorbell sleeps in 51", bell, allocs, cgo, sleeps)
		if !bell {
			base = allocs
			continue
		}
		if allocs > base || cgo != 0 || sleeps == 0 {
			t.Fatalf("%.2f allocations (%.2f without the doorbell), %d cgo calls per round trip, %d doorbell sleeps: want no more, 0, > 0",
				allocs, base, cgo, sleeps)
		}
	}
}
