//go:build linux && cgo

package talaris_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// Lifecycle tests: events in every pump,
// ErrNoConns, Pool.Close racing every method, states, and quiet failed
// dials. Real gorilla/coder servers and raw TCP peers on loopback.

// TestHostileAPIRaces: the public API of the send and fairness paths
// (SendBinary, SendContext, Ping, Stats and testhook.DirectSends,
// Pool.Stats with FairHolds, Metrics, Abort, Conn.Close, Pool.Close), all
// called at once from their own goroutines while the connection is ended
// by Conn.Close, Pool.Close, Abort or all three at once, against a peer
// that floods and never reads, resets, or closes in the middle of a frame;
// with the default configuration and with NoDirectSend and small fairness
// shares. No call panics, blocks past the end or returns an error outside
// its documented set; the counters keep their invariants; after the end
// every call answers ErrClosed or ErrPoolClosed, and Stats is zero. Each
// iteration is the race only if a call ran while an ender ran (not all
// ended by the peer's end first): it is set up again until one did (at
// most 20 attempts), else the test fails.
func TestHostileAPIRaces(t *testing.T) {
	cfgs := []struct {
		name     string
		cfg      talaris.Config
		noDirect bool
	}{
		{"default", talaris.Config{}, false},
		{"nodirect-fair", testhook.WithKnobs(talaris.Config{}, testhook.Knobs{NoDirectSend: true, MaxConnPendingEvents: 16, MaxConnPendingBytes: 4096}), true},
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
							const attempts = 20
							var raced int64
							for a := range attempts {
								if raced = hostileOnce(t, useTLS, peer, end, cf.cfg, cf.noDirect, it+a*iters); raced > 0 || t.Failed() {
									if a > 0 {
										t.Logf("iteration %d: the race happened in attempt %d", it, a+1)
									}
									break
								}
							}
							if raced == 0 && !t.Failed() {
								t.Fatalf("iteration %d: in %d attempts no call ran while %s ran (peer %s): the race never happened", it, attempts, end, peer)
							}
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

// hostileOnce runs one race and returns how many calls ran while an ender
// ran (the race; none when the calls ended before the enders started).
func hostileOnce(t *testing.T, useTLS bool, peer, end string, cfg talaris.Config, noDirect bool, it int) int64 {
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
	// A call raced the end when it ran while an ender ran: it started
	// before the last ender returned and returned after the first started.
	var endStarted, endFinished atomic.Bool
	var racing atomic.Int64
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
				early := !endFinished.Load()
				err := f()
				if early && endStarted.Load() {
					racing.Add(1)
				}
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
			ds, hs := testhook.DirectSends(c)
			st := c.Stats() // after: its MsgsOut counts every direct send read above
			if hs > ds || (st != (talaris.ConnStats{}) && ds > st.MsgsOut) {
				report("%d handoffs, %d direct sends, %d messages out", hs, ds, st.MsgsOut)
			}
			if (useTLS || noDirect) && ds != 0 {
				report("%d direct sends on a connection that takes none", ds)
			}
			ps := testhook.Stats(p)
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
	var endsLeft atomic.Int32
	endsLeft.Store(1)
	if end == "all" {
		endsLeft.Store(int32(len(enders)))
	}
	for name, f := range enders {
		if end != "all" && end != name {
			continue
		}
		endWG.Add(1)
		go func() {
			defer endWG.Done()
			endStarted.Store(true)
			err := f()
			if endsLeft.Add(-1) == 0 {
				endFinished.Store(true)
			}
			// The peer may have ended the connection first (or another
			// ender did): then ErrClosed / ErrPoolClosed is the answer.
			if err != nil && !ended(err) {
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
	_, _ = testhook.Stats(p), p.Metrics()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return racing.Load()
}

// TestZeroConnAPI: every method of the zero Conn (a Dial that failed
// returns one) answers without a panic: sends, SendContext, Ping, Pong,
// Close and Abort refuse with ErrClosed, Stats is zero, State idle.
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
		if err := f(); !errors.Is(err, talaris.ErrClosed) {
			t.Errorf("zero Conn %s: %v, want ErrClosed", name, err)
		}
	}
	if st := c.Stats(); st != (talaris.ConnStats{}) {
		t.Errorf("zero Conn Stats = %+v, want zero", st)
	}
	if st := c.State(); st != talaris.StateIdle {
		t.Errorf("zero Conn State = %v, want idle", st)
	}
}

// TestOnEventEveryPump: with Config.OnEvent, PumpData and PumpDataNowait
// deliver open, ping, data, close in order on the pumping
// goroutine; once the last connection's final event was consumed,
// PumpData returns ErrNoConns instead of blocking.
func TestOnEventEveryPump(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv *wstest.Server) {
		for _, pump := range []string{"PumpData", "PumpDataNowait"} {
			t.Run(pump, func(t *testing.T) {
				var got []recorded
				cfg := talaris.Config{OnEvent: func(c talaris.Conn, ev talaris.Event) {
					got = append(got, recorded{c: c, kind: ev.Kind, data: string(ev.Payload), code: ev.Code, err: ev.Err})
				}}
				p := newTestPool(t, cfg, hangGuard)
				spec := streamSpec{n: 50, size: 16, text: true, ping: true}
				c := dial(t, p, srv.URL+spec.path())
				data := func(cc talaris.Conn, op talaris.Opcode, b []byte) {
					got = append(got, recorded{c: cc, kind: talaris.EventKind(op + 1), data: string(b)})
				}
				final := func() bool {
					return len(got) > 0 && (got[len(got)-1].kind == talaris.EventClose || got[len(got)-1].kind == talaris.EventError)
				}
				for !final() {
					var err error
					switch pump {
					case "PumpData":
						_, err = p.PumpData(data)
					case "PumpDataNowait":
						_, err = p.PumpDataNowait(data)
						if !final() {
							time.Sleep(100 * time.Microsecond)
						}
					}
					if err != nil {
						t.Fatalf("%s: %v", pump, err)
					}
				}
				// open, then per message a ping and the message, then close 1000 "done".
				if len(got) != 2+2*spec.n {
					t.Fatalf("%d events, want %d: %+v", len(got), 2+2*spec.n, got[:min(len(got), 6)])
				}
				if got[0].kind != talaris.EventOpen {
					t.Errorf("first event %v, want open", got[0].kind)
				}
				for i := range spec.n {
					ping, msg := got[1+2*i], got[2+2*i]
					if ping.kind != talaris.EventPing || ping.data != fmt.Sprintf("p%d", i) {
						t.Fatalf("event %d: %v %q, want ping p%d", 1+2*i, ping.kind, ping.data, i)
					}
					if msg.kind != talaris.EventText || msg.data != string(wstest.TextPayload(i, spec.size)) {
						t.Fatalf("event %d: %v %q, want text message %d", 2+2*i, msg.kind, msg.data, i)
					}
				}
				last := got[len(got)-1]
				if last.kind != talaris.EventClose || last.code != 1000 || last.data != "" {
					t.Errorf("final event %+v, want close 1000", last)
				}
				for _, r := range got {
					if r.c != c {
						t.Fatalf("event for %#x, want %#x", r.c.ID(), c.ID())
					}
				}
				if n, err := p.PumpData(data); n != 0 || !errors.Is(err, talaris.ErrNoConns) {
					t.Errorf("PumpData with no connection left: %d, %v; want ErrNoConns", n, err)
				}
			})
		}
	})
}

// TestPumpNoConns: every blocking pump (Pump, PumpData, PumpStamped) ends
// the same way: on a pool that never had a connection it returns
// ErrNoConns at once; asleep on an idle connection it is woken by that
// connection's final event and returns ErrNoConns once the event was
// delivered; after Close it returns ErrPoolClosed.
func TestPumpNoConns(t *testing.T) {
	pumps := map[string]func(p *talaris.Pool) (int, error){
		"Pump":     func(p *talaris.Pool) (int, error) { return p.Pump(func(talaris.Conn, talaris.Event) {}) },
		"PumpData": func(p *talaris.Pool) (int, error) { return p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {}) },
		"PumpStamped": func(p *talaris.Pool) (int, error) {
			return p.PumpStamped(func(talaris.Conn, talaris.Opcode, []byte, talaris.Stamps) {})
		},
	}
	for name, pump := range pumps {
		t.Run(name, func(t *testing.T) {
			p := newTestPool(t, talaris.Config{}, hangGuard)
			if n, err := pump(p); n != 0 || !errors.Is(err, talaris.ErrNoConns) {
				t.Fatalf("%s on an empty pool: %d, %v; want ErrNoConns", name, n, err)
			}
			// An idle connection: the server holds it, then drops it.
			release := make(chan struct{})
			srv := wstest.NewRaw(func(c *wstest.RawConn) { <-release }).Start(t)
			var events []talaris.EventKind
			p2 := newTestPool(t, talaris.Config{OnEvent: func(_ talaris.Conn, ev talaris.Event) { events = append(events, ev.Kind) }}, hangGuard)
			dial(t, p2, srv.URL)
			if p2.ConnCount() != 1 {
				t.Fatalf("ConnCount %d, want 1", p2.ConnCount())
			}
			done := make(chan error, 1)
			go func() {
				for {
					if _, err := pump(p2); err != nil {
						done <- err
						return
					}
				}
			}()
			time.Sleep(300 * time.Millisecond) // the pump is asleep on the idle connection
			select {
			case err := <-done:
				t.Fatalf("%s returned %v while a connection was live", name, err)
			default:
			}
			close(release) // the server drops the connection
			if err := <-done; !errors.Is(err, talaris.ErrNoConns) {
				t.Fatalf("%s after the last connection ended: %v, want ErrNoConns", name, err)
			}
			if name != "Pump" && (len(events) != 2 || events[0] != talaris.EventOpen || events[1] != talaris.EventError) {
				t.Errorf("OnEvent saw %v, want [open error]", events)
			}
			if p2.ConnCount() != 0 {
				t.Errorf("ConnCount %d after the final event, want 0", p2.ConnCount())
			}
			p2.Close()
			if _, err := pump(p2); !errors.Is(err, talaris.ErrPoolClosed) {
				t.Errorf("%s after Close: %v, want ErrPoolClosed", name, err)
			}
		})
	}
}

// TestConnCountLive: ConnCount counts live connections only. Failed
// synchronous Dials leave it when Dial returns, even while nobody pumps
// and their quiet events wait behind the live connections' data.
func TestConnCountLive(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	refused := refusedAddr(t)
	p := newTestPool(t, talaris.Config{}, hangGuard)
	// Four live connections, each with an echo waiting in the ring: the
	// failed dials' events queue behind data nobody pumps.
	for range 4 {
		c := dial(t, p, srv.URL+"/echo")
		if err := c.SendText([]byte("hi")); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 7 {
		ctx, cancel := dialCtx(t)
		_, err := p.Dial(ctx, "ws://"+refused, nil)
		cancel()
		if err == nil {
			t.Fatal("Dial to a refused port succeeded")
		}
		if got := p.ConnCount(); got != 4 {
			t.Fatalf("ConnCount after %d failed dials beside 4 live connections: %d, want 4", i+1, got)
		}
	}
}

// TestStates: a DialAsync handle is never StateIdle (it reports
// StateConnecting before the loop has seen it); an ended handle's Stats
// are zero; after Pool.Close every handle reports StateClosed, ConnCount
// is 0 and every method returns ErrPoolClosed.
func TestStates(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	// A server that accepts and never answers: the handle stays before open.
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	p := newTestPool(t, talaris.Config{}, hangGuard)
	for range 20 {
		c, err := p.DialAsync("ws://"+ln.Addr().String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if st := c.State(); st != talaris.StateConnecting && st != talaris.StateUpgrading {
			t.Fatalf("DialAsync handle: %v, want connecting (or upgrading)", st)
		}
	}
	// An ended connection: Stats zero, State closed.
	c := dial(t, p, srv.URL+"/echo")
	if err := c.SendText([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	echoed := false
	pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
		if cc == c && ev.Kind == talaris.EventText {
			echoed = true
		}
	}, func() bool { return echoed }, nil)
	if s := c.Stats(); s.MsgsIn != 1 || s.MsgsOut != 1 {
		t.Errorf("live Stats %+v, want one message each way", s)
	}
	c.Close(talaris.CloseNormal, "")
	ended := false
	pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
		if cc == c && (ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError) {
			ended = true
		}
	}, func() bool { return ended }, nil)
	if st := c.State(); st != talaris.StateClosed {
		t.Errorf("ended handle: %v, want closed", st)
	}
	if s := c.Stats(); s != (talaris.ConnStats{}) {
		t.Errorf("Stats of an ended handle: %+v, want zero", s)
	}
	if err := c.SendText([]byte("late")); !errors.Is(err, talaris.ErrClosed) {
		t.Errorf("SendText on an ended handle: %v, want ErrClosed", err)
	}
	if err := c.Close(talaris.CloseNormal, ""); !errors.Is(err, talaris.ErrClosed) {
		t.Errorf("Close of an ended handle: %v, want ErrClosed", err)
	}
	live := dial(t, p, srv.URL+"/echo")
	if p.ConnCount() != 21 {
		t.Errorf("ConnCount %d, want 21", p.ConnCount())
	}
	p.Close()
	for _, h := range []talaris.Conn{c, live} {
		if st := h.State(); st != talaris.StateClosed {
			t.Errorf("after Pool.Close: State %v, want closed", st)
		}
		if s := h.Stats(); s != (talaris.ConnStats{}) {
			t.Errorf("after Pool.Close: Stats %+v, want zero", s)
		}
		if err := h.SendText([]byte("x")); !errors.Is(err, talaris.ErrPoolClosed) {
			t.Errorf("SendText after Pool.Close: %v, want ErrPoolClosed", err)
		}
		if err := h.Close(talaris.CloseNormal, ""); !errors.Is(err, talaris.ErrPoolClosed) {
			t.Errorf("Close after Pool.Close: %v, want ErrPoolClosed", err)
		}
	}
	if n := p.ConnCount(); n != 0 {
		t.Errorf("ConnCount after Close: %d, want 0", n)
	}
	// The pool's counters stay readable after Close, frozen as the loop left them.
	if s, s2 := testhook.Stats(p), testhook.Stats(p); s.Events == 0 || s != s2 {
		t.Errorf("Pool.Stats after Close: %+v then %+v, want the final counters, unchanged", s, s2)
	}
	if _, err := p.DialAsync(srv.URL, nil); !errors.Is(err, talaris.ErrPoolClosed) {
		t.Errorf("DialAsync after Close: %v", err)
	}
	if (talaris.Conn{}).State() != talaris.StateIdle {
		t.Errorf("zero Conn: %v, want idle", (talaris.Conn{}).State())
	}
}

// TestLoopThreadName: each Pool's C loop runs on one new thread named
// "talaris-loop", which is gone once Pool.Close has returned.
func TestLoopThreadName(t *testing.T) {
	before := loopTids(t)
	p, err := talaris.NewPool(smallPool())
	if err != nil {
		t.Fatal(err)
	}
	var fresh []int
	for tid := range loopTids(t) {
		if !before[tid] {
			fresh = append(fresh, tid)
		}
	}
	if len(fresh) != 1 {
		p.Close()
		t.Fatalf("new talaris-loop threads after NewPool: %v, want exactly one", fresh)
	}
	p.Close()
	// Close joins the thread; the kernel wakes the joiner a moment before
	// the task leaves /proc, hence the short wait (bounded generously).
	for deadline := time.Now().Add(5 * time.Second); taskLive(fresh[0]); {
		if time.Now().After(deadline) {
			t.Fatalf("loop thread %d still running 5 s after Pool.Close returned", fresh[0])
		}
		time.Sleep(time.Millisecond)
	}
}

// TestZeroPool: a Pool not made by NewPool (var p talaris.Pool) behaves
// as a closed one: every call returns at once, the ones that can fail
// with ErrPoolClosed, Close and WritePrometheus (zero metrics) with nil,
// and nothing panics. Found by a
// hostile review: Close panicked (close of nil channel), Dial said
// ErrTooManyConns and PumpDataNowait nil.
func TestZeroPool(t *testing.T) {
	var p talaris.Pool
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	nop := func(talaris.Conn, talaris.Opcode, []byte) {}
	want := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, talaris.ErrPoolClosed) {
			t.Errorf("zero Pool: %s: %v, want ErrPoolClosed", what, err)
		}
	}
	_, err := p.Dial(ctx, "ws://127.0.0.1:1/", nil)
	want("Dial", err)
	_, err = p.DialAsync("ws://127.0.0.1:1/", nil)
	want("DialAsync", err)
	_, err = p.DialMemory()
	want("DialMemory", err)
	_, err = p.PumpDataNowait(nop)
	want("PumpDataNowait", err)
	_, err = p.PumpData(nop)
	want("PumpData", err)
	_, err = p.Pump(func(talaris.Conn, talaris.Event) {})
	want("Pump", err)
	_, err = p.PumpNowait(func(talaris.Conn, talaris.Event) {})
	want("PumpNowait", err)
	_, err = p.PumpStamped(func(talaris.Conn, talaris.Opcode, []byte, talaris.Stamps) {})
	want("PumpStamped", err)
	if n := p.ConnCount(); n != 0 {
		t.Errorf("zero Pool: ConnCount %d", n)
	}
	_ = testhook.Stats(&p)
	_ = p.Metrics()
	_ = p.MetricsInterval()
	// WritePrometheus has nothing to refuse: like a closed pool's, the
	// exposition of its (zero) Metrics.
	var prom bytes.Buffer
	if err := p.WritePrometheus(&prom); err != nil {
		t.Errorf("zero Pool: WritePrometheus: %v, want nil", err)
	} else if !bytes.Contains(prom.Bytes(), []byte("\ntalaris_gcm_selftest_failures_total{pool=\"\"} 0\n")) {
		t.Errorf("zero Pool: WritePrometheus wrote no zero talaris_gcm_selftest_failures_total sample:\n%.2000s", prom.Bytes())
	}
	if err := p.Close(); err != nil {
		t.Errorf("zero Pool: Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("zero Pool: second Close: %v", err)
	}
}
