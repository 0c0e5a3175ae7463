//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// Heartbeat tests (DialOptions.PingInterval, ReadTimeout) against real
// peers: Python websockets and Node ws in their own processes (SIGSTOP
// freezes one), gorilla, coder and raw Go servers. They run under both TLS
// backends (go test and go test -tags talaris_openssl). Time bounds are
// generous: the measured figures are logged.

// ---- heartbeat ----

// TestReadTimeoutStoppedServer: Python websockets in its own process
// echoes a message; the moment the echo arrives the server is frozen with
// SIGSTOP (TCP stays up, nothing flows), and a ReadTimeout of 300 ms fails
// the connection: EventError wrapping ErrReadTimeout, code 1006, about
// 300 ms after that last receive. (That pongs keep a healthy idle
// connection within its ReadTimeout is TestPingIntervalKeepsIdleOpen's:
// a Python process on a loaded machine may well not answer within 300 ms.)
func TestReadTimeoutStoppedServer(t *testing.T) {
	for _, sc := range schemes() {
		t.Run(sc.name, func(t *testing.T) {
			pp := startPython(t, sc.name == "wss")
			p := newTestPool(t, talaris.Config{}, hangGuard)
			ctx, cancel := dialCtx(t)
			defer cancel()
			opts := sc.opts
			opts.ReadTimeout = 300 * time.Millisecond
			// The last receive happened after before and before seen (the
			// pump's view lags the loop's): the timeout fires no sooner
			// than 300ms after before, and about 300ms after seen.
			before := time.Now()
			c, err := p.Dial(ctx, fmt.Sprintf("%s://127.0.0.1:%s/echo", sc.name, pp.port), &opts)
			if err != nil {
				t.Fatal(err)
			}
			seen := time.Now()
			sendAt := time.Now()
			if err := c.SendText([]byte("last words")); err != nil {
				t.Fatal(err)
			}
			echoed := false
			f, at := pumpFinal(t, p, c, func(ev talaris.Event) {
				if ev.Kind == talaris.EventText && !echoed {
					echoed, before, seen = true, sendAt, time.Now()
					if err := pp.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
						t.Fatal(err)
					}
				}
			})
			// A server starved of CPU for 300ms under load did not echo in
			// time: the timeout then rightly fired after the handshake,
			// the last receive, and is checked from there.
			last := "the echo"
			if !echoed {
				last = "the handshake (no echo within 300ms)"
			}
			t.Logf("%s %s: read timeout 300ms fired %v after %s", talaris.TLSBackend(), sc.name, at.Sub(seen), last)
			if f.Kind != talaris.EventError || !errors.Is(f.Err, talaris.ErrReadTimeout) || f.Code != talaris.CloseAbnormal {
				t.Fatalf("final event %+v, want EventError ErrReadTimeout 1006", f)
			}
			if at.Sub(before) < 300*time.Millisecond || at.Sub(seen) > 2*time.Second {
				t.Errorf("read timeout fired %v after the last receive could have been, %v after it was seen; want about 300ms",
					at.Sub(before), at.Sub(seen))
			}
		})
	}
}

// idleKiller is a raw server that drops a client it has heard nothing
// from (not even a ping) for idle; it answers pings and records when
// they arrived.
type idleKiller struct {
	*wstest.RawServer
	mu       sync.Mutex
	pings    []time.Time
	timedOut bool
}

func newIdleKiller(t *testing.T, idle time.Duration) *idleKiller {
	k := &idleKiller{}
	k.RawServer = wstest.NewRaw(func(c *wstest.RawConn) {
		for {
			c.SetDeadline(idle)
			h, p, err := c.ReadFrame()
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				k.mu.Lock()
				k.timedOut = true
				k.mu.Unlock()
				return // drop the client: TCP closed without a close frame
			}
			if err != nil {
				return
			}
			switch h.Op {
			case ws.OpPing:
				k.mu.Lock()
				k.pings = append(k.pings, time.Now())
				k.mu.Unlock()
				c.SetDeadline(time.Second)
				if c.WriteFrame(true, ws.OpPong, p) != nil {
					return
				}
			case ws.OpClose:
				code, _, _ := ws.ParseClosePayload(p)
				c.WriteClose(code, "")
				return
			}
		}
	}).Start(t)
	return k
}

// TestPingIntervalKeepsIdleOpen: a server that drops clients silent for
// 1 s drops a client without a heartbeat; with PingInterval 100 ms (and
// ReadTimeout 1 s, which the pongs keep from firing) the idle
// connection stays open for 3 s, and the server sees a ping about every
// 100 ms.
func TestPingIntervalKeepsIdleOpen(t *testing.T) {
	p := newTestPool(t, talaris.Config{}, hangGuard)
	ctx, cancel := dialCtx(t)
	defer cancel()

	t.Run("without", func(t *testing.T) {
		k := newIdleKiller(t, time.Second)
		c, err := p.Dial(ctx, k.URL+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		f, _ := pumpFinal(t, p, c, nil)
		k.mu.Lock()
		defer k.mu.Unlock()
		if !k.timedOut || f.Kind != talaris.EventError || !errors.Is(f.Err, talaris.ErrConnectionLost) {
			t.Fatalf("server timed out %v, final %+v: want the idle client dropped", k.timedOut, f)
		}
	})

	t.Run("with", func(t *testing.T) {
		// 3 s is three read-timeout windows, each ended by pongs (10 s
		// repeated the same check). Both bounds are wall-clock: a freeze
		// of this process as long as them (the flake seen once at load
		// 7-13; reproduced with SIGSTOP, see freezeWatch) stops the pings
		// and ends the connection whatever the heartbeat does. An attempt
		// that failed while the process was frozen for half a bound is
		// run again (at most 3); any other failure fails.
		const run = 3 * time.Second
		for attempt := 1; ; attempt++ {
			fw := watchFreezes(t)
			err := pingIdleOnce(t, p, ctx, run)
			fw.Stop()
			if err == nil {
				return
			}
			total, worst := fw.Frozen()
			if worst >= 500*time.Millisecond && attempt < 3 {
				t.Logf("attempt %d: %v; the process was frozen %v meanwhile (longest %v): again", attempt, err, total, worst)
				continue
			}
			t.Fatalf("%v (process frozen %v, longest %v)", err, total, worst)
		}
	})
}

// pingIdleOnce dials an idle killer (1 s) with PingInterval 100 ms and
// ReadTimeout 1 s, stays idle for run and checks that the connection
// stayed open, that the server saw a ping about every 100 ms and never
// timed the client out; then closes it. It returns what went wrong with
// the heartbeat (the caller decides whether a freeze explains it).
func pingIdleOnce(t *testing.T, p *talaris.Pool, ctx context.Context, run time.Duration) error {
	k := newIdleKiller(t, time.Second)
	c, err := p.Dial(ctx, k.URL+"/", &talaris.DialOptions{PingInterval: 100 * time.Millisecond, ReadTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	end := time.Now().Add(run)
	pongs := 0
	var ended error
	for ended == nil && time.Now().Before(end) {
		if _, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventPong:
				pongs++
			case talaris.EventClose, talaris.EventError:
				ended = fmt.Errorf("connection ended after %d pongs: %v %d %v", pongs, ev.Kind, ev.Code, ev.Err)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if ended != nil {
		return ended
	}
	if st := c.State(); st != talaris.StateOpen {
		return fmt.Errorf("state %v after %v, want open", st, run)
	}
	k.mu.Lock()
	pings := append([]time.Time(nil), k.pings...)
	timedOut := k.timedOut
	k.mu.Unlock()
	var maxGap, sum time.Duration
	for i := 1; i < len(pings); i++ {
		g := pings[i].Sub(pings[i-1])
		sum += g
		maxGap = max(maxGap, g)
	}
	mean := time.Duration(0)
	if len(pings) > 1 {
		mean = sum / time.Duration(len(pings)-1)
	}
	t.Logf("%v idle: %d pings at the server (mean interval %v, max %v), %d pongs back", run, len(pings), mean, maxGap, pongs)
	if timedOut {
		return errors.New("the server timed the client out")
	}
	if want := int(run / (200 * time.Millisecond)); len(pings) < want {
		return fmt.Errorf("%d pings in %v, want at least %d (interval 100ms)", len(pings), run, want)
	}
	if err := c.Close(talaris.CloseNormal, "bye"); err != nil {
		t.Fatal(err)
	}
	if f, _ := pumpFinal(t, p, c, nil); f.Kind != talaris.EventClose || f.Code != talaris.CloseNormal {
		t.Fatalf("final %+v, want EventClose 1000", f)
	}
	return nil
}

// TestHeartbeatOptionsValidated: heartbeat periods below 1 ms (or
// negative) are refused with ErrInvalidConfig before anything is dialed.
func TestHeartbeatOptionsValidated(t *testing.T) {
	p := newTestPool(t, talaris.Config{}, hangGuard)
	for _, o := range []talaris.DialOptions{{PingInterval: -time.Second}, {ReadTimeout: time.Microsecond}, {HandshakeTimeout: -1}} {
		if _, err := p.DialAsync("ws://127.0.0.1:1/", &o); !errors.Is(err, talaris.ErrInvalidConfig) {
			t.Errorf("DialAsync with %+v: %v, want ErrInvalidConfig", o, err)
		}
	}
	if n := p.ConnCount(); n != 0 {
		t.Errorf("ConnCount %d after refused dials", n)
	}
}
