//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// TestHostileAPIRaces: the public API of the send and fairness paths
// (SendBinary, SendContext, Ping, Stats with DirectSends/DirectHandoffs,
// Pool.Stats with FairHolds, Metrics, Abort, Conn.Close, Pool.Close), all
// called at once from their own goroutines while the connection is ended
// by Conn.Close, Pool.Close, Abort or all three at once, against a peer
// that floods and never reads, resets, or closes in the middle of a frame;
// with the default configuration and with NoDirectSend and small fairness
// shares. No call panics, blocks past the end or returns an error outside
// its documented set; the counters keep their invariants; after the end
// every call answers ErrClosed or ErrPoolClosed, and Stats is zero.
func TestHostileAPIRaces(t *testing.T) {
	cfgs := []struct {
		name string
		cfg  talaris.Config
	}{
		{"default", talaris.Config{}},
		{"nodirect-fair", talaris.Config{NoDirectSend: true, MaxConnPendingEvents: 16, MaxConnPendingBytes: 4096}},
	}
	iters := 2
	if testing.Short() { // (the race run: every iteration costs several times more)
		iters = 1
	}
	for _, peer := range []string{"stops-reading", "resets", "closes-mid-frame"} {
		for _, end := range []string{"Conn.Close", "Pool.Close", "Abort", "all"} {
			for _, cf := range cfgs {
				t.Run(peer+"/"+end+"/"+cf.name, func(t *testing.T) {
					forEachTransport(t, func(t *testing.T, useTLS bool) {
						for it := range iters {
							hostileOnce(t, useTLS, peer, end, cf.cfg, it)
						}
					})
				})
			}
		}
	}
}

// hostilePeer floods the client with 64-byte frames from a goroutine and,
// after a few of the client's frames (or at once when it never reads),
// stops reading, resets, or writes half a frame and closes.
func hostilePeer(peer string) func(rc *wstest.RawConn) {
	return func(rc *wstest.RawConn) {
		stop, wdone := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(wdone)
			msg := make([]byte, 64)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if rc.WriteFrame(true, ws.OpBinary, msg) != nil {
					return
				}
			}
		}()
		defer func() { close(stop); <-wdone }()
		if peer == "stops-reading" {
			// Never read: the client's bytes stay in the kernel, which
			// stops its sends. The flood ends when the client's end closes
			// the socket (the write fails), and with it this peer.
			<-wdone
			return
		}
		for range 20 {
			if _, _, err := rc.ReadFrame(); err != nil {
				break
			}
		}
		if peer == "resets" {
			rc.Reset()
			return
		}
		// Closes mid-frame: the flood stops, then a 1000-byte frame of
		// which 10 bytes come, then FIN.
		close(stop)
		<-wdone
		stop = make(chan struct{})
		rc.WriteFrameLen(ws.Header{Fin: true, Op: ws.OpBinary, Length: 1000}, 2, make([]byte, 10))
		rc.Close()
	}
}

func hostileOnce(t *testing.T, useTLS bool, peer, end string, cfg talaris.Config, it int) {
	srv := wstest.NewRaw(hostilePeer(peer))
	opts := startWS(t, useTLS, srv.Start, srv.StartTLS)
	cfg.CloseTimeout = 300 * time.Millisecond
	cfg.MaxSendQueue = 64 << 10
	p := newTestPool(t, cfg, hangGuard)
	c, bg := dialPumped(t, p, srv.URL, opts)

	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	ended := func(err error) bool {
		return errors.Is(err, talaris.ErrClosed) || errors.Is(err, talaris.ErrPoolClosed)
	}
	var wg sync.WaitGroup
	var calls atomic.Int64
	errs := make(chan error, 16)
	report := func(format string, a ...any) {
		select {
		case errs <- fmt.Errorf(format, a...):
		default:
		}
	}
	run := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				err := f()
				calls.Add(1)
				switch {
				case err == nil:
				case ended(err):
					return
				case errors.Is(err, talaris.ErrWouldBlock):
					time.Sleep(20 * time.Microsecond)
				default:
					report("%s: %v", name, err)
					return
				}
			}
		}()
	}
	small, big := make([]byte, 64), make([]byte, 9000)
	run("SendBinary", func() error { return c.SendBinary(small) })
	run("SendBinary 9000", func() error { return c.SendBinary(big) })
	run("SendContext", func() error { return c.SendContext(ctx, talaris.OpBinary, small) })
	run("Ping", func() error { return c.Ping([]byte("hb")) })
	stopStats := make(chan struct{})
	var statsWG sync.WaitGroup
	statsWG.Add(1)
	go func() {
		defer statsWG.Done()
		var holds uint64
		for {
			select {
			case <-stopStats:
				return
			default:
			}
			st := c.Stats()
			if st.DirectHandoffs > st.DirectSends || st.DirectSends > st.MsgsOut {
				report("ConnStats: %d handoffs, %d direct sends, %d messages out", st.DirectHandoffs, st.DirectSends, st.MsgsOut)
			}
			if (useTLS || cfg.NoDirectSend) && st.DirectSends != 0 {
				report("ConnStats: %d direct sends on a connection that takes none", st.DirectSends)
			}
			ps := p.Stats()
			if ps.FairHolds < holds {
				report("PoolStats.FairHolds went back from %d to %d", holds, ps.FairHolds)
			}
			holds = ps.FairHolds
			_ = p.Metrics()
			_ = c.State()
			time.Sleep(50 * time.Microsecond)
		}
	}()

	time.Sleep(time.Duration(2+(it*7+len(t.Name()))%9) * time.Millisecond)
	enders := map[string]func() error{
		"Conn.Close": func() error { return c.Close(talaris.CloseNormal, "") },
		"Pool.Close": p.Close,
		"Abort":      c.Abort,
	}
	var endWG sync.WaitGroup
	for name, f := range enders {
		if end != "all" && end != name {
			continue
		}
		endWG.Add(1)
		go func() {
			defer endWG.Done()
			// The peer may have ended the connection first (or another
			// ender did): then ErrClosed / ErrPoolClosed is the answer.
			if err := f(); err != nil && !ended(err) {
				report("%s: %v", name, err)
			}
		}()
	}
	// Every call returns once the connection ended; Pool.Close is bounded
	// by CloseTimeout. A hang is a failure, not a wait.
	done := make(chan struct{})
	go func() { wg.Wait(); endWG.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Fatalf("calls or enders did not return after %s (peer %s)", end, peer)
	}
	if end == "Conn.Close" || end == "Abort" {
		// The final event (the pump stops on it), then the pool is closed
		// too, so both answers are checked below.
		if f := bg.wait(t); f == nil {
			t.Errorf("no final event after %s", end)
		} else if end == "Abort" && !errors.Is(f.Err, talaris.ErrClosed) && (peer == "stops-reading" || !errors.Is(f.Err, talaris.ErrConnectionLost)) {
			// (A peer's reset or cut that the loop met before the abort
			// ends it as lost.)
			t.Errorf("final %+v after Abort, want an error matching ErrClosed", *f)
		}
	}
	close(stopStats)
	statsWG.Wait()
	for _, f := range []func() error{
		func() error { return c.SendBinary(small) },
		func() error { return c.SendText([]byte("late")) },
		func() error { return c.SendContext(ctx, talaris.OpText, []byte("late")) },
		func() error { return c.Ping(nil) },
		func() error { return c.Pong(nil) },
		func() error { return c.Close(talaris.CloseNormal, "") },
		c.Abort,
	} {
		if err := f(); !ended(err) {
			t.Errorf("a call after the end (%s, peer %s) returned %v, want ErrClosed or ErrPoolClosed", end, peer, err)
		}
	}
	if st := c.Stats(); st != (talaris.ConnStats{}) {
		t.Errorf("Stats after the end = %+v, want zero", st)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Pool.Close after the end: %v", err)
	}
	_, _ = p.Stats(), p.Metrics()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if calls.Load() == 0 {
		t.Logf("no call got in before the end (timing)")
	}
}

// TestZeroConnAPI: every method of the zero Conn (a Dial that failed
// returns one) answers without a panic: sends, SendContext, Ping, Pong,
// Close and Abort refuse with an error, Stats is zero, State idle.
func TestZeroConnAPI(t *testing.T) {
	var c talaris.Conn
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	for name, f := range map[string]func() error{
		"SendText":    func() error { return c.SendText([]byte("x")) },
		"SendBinary":  func() error { return c.SendBinary([]byte("x")) },
		"SendContext": func() error { return c.SendContext(ctx, talaris.OpBinary, []byte("x")) },
		"Ping":        func() error { return c.Ping(nil) },
		"Pong":        func() error { return c.Pong(nil) },
		"Close":       func() error { return c.Close(talaris.CloseNormal, "") },
		"Abort":       c.Abort,
	} {
		if err := f(); err == nil {
			t.Errorf("zero Conn %s: nil error", name)
		} else {
			t.Logf("zero Conn %s: %v", name, err)
		}
	}
	if st := c.Stats(); st != (talaris.ConnStats{}) {
		t.Errorf("zero Conn Stats = %+v, want zero", st)
	}
	if st := c.State(); st != talaris.StateIdle {
		t.Errorf("zero Conn State = %v, want idle", st)
	}
}
