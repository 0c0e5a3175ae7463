//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
)

// Lifecycle tests: events in every pump,
// ErrNoConns, Pool.Close racing every method, states, and quiet failed
// dials. Real gorilla/coder servers and raw TCP peers on loopback.

// recorded is one event as OnEvent or a DataFunc saw it, copied.
type recorded struct {
	c    talaris.Conn
	kind talaris.EventKind
	data string
	code int
	err  error
}

// smallPool is a Config cheap enough to create a thousand times.
func smallPool() talaris.Config {
	return talaris.Config{EventRingSize: 1024, ArenaSize: 1 << 20, MaxMessageSize: 1 << 18, BufCount: 64,
		CmdRingSize: 1 << 16, MaxConns: 64, CloseTimeout: time.Second}
}

// TestOnEventEveryPump: with Config.OnEvent, PumpData, PumpSpin and
// PumpNowait deliver open, ping, data, close in order on the pumping
// goroutine; once the last connection's final event was consumed,
// PumpData returns ErrNoConns instead of blocking.
func TestOnEventEveryPump(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv *wstest.Server) {
		for _, pump := range []string{"PumpData", "PumpSpin", "PumpNowait"} {
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
					case "PumpSpin":
						_, err = p.PumpSpin(1000, data)
					case "PumpNowait":
						_, err = p.PumpNowait(data)
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

// TestPumpDataNoConns: PumpData on a pool that never had a connection
// returns ErrNoConns at once; a PumpData sleeping on an idle connection is
// woken by that connection's final event and returns ErrNoConns; Pump
// still blocks until Close.
func TestPumpDataNoConns(t *testing.T) {
	p := newTestPool(t, talaris.Config{}, hangGuard)
	nop := func(talaris.Conn, talaris.Opcode, []byte) {}
	if n, err := p.PumpData(nop); n != 0 || !errors.Is(err, talaris.ErrNoConns) {
		t.Fatalf("PumpData on an empty pool: %d, %v; want ErrNoConns", n, err)
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
			if _, err := p2.PumpData(nop); err != nil {
				done <- err
				return
			}
		}
	}()
	time.Sleep(300 * time.Millisecond) // PumpData is asleep on the idle connection
	select {
	case err := <-done:
		t.Fatalf("PumpData returned %v while a connection was live", err)
	default:
	}
	close(release) // the server drops the connection
	if err := <-done; !errors.Is(err, talaris.ErrNoConns) {
		t.Fatalf("PumpData after the last connection ended: %v, want ErrNoConns", err)
	}
	if len(events) != 2 || events[0] != talaris.EventOpen || events[1] != talaris.EventError {
		t.Errorf("OnEvent saw %v, want [open error]", events)
	}
	if p2.ConnCount() != 0 {
		t.Errorf("ConnCount %d after the final event, want 0", p2.ConnCount())
	}
}

// TestDialFailureIsQuiet: a failed synchronous Dial (refused port,
// refused upgrade) returns its error and delivers no event through any
// pump; ConnCount goes back to 0. The error wraps the errno.
func TestDialFailureIsQuiet(t *testing.T) {
	refused := refusedAddr(t)
	srv429 := wstest.NewRaw(nil)
	srv429.Response = "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\n\r\n"
	srv429.Start(t)
	var seen atomic.Int32
	p := newTestPool(t, talaris.Config{OnEvent: func(c talaris.Conn, ev talaris.Event) { seen.Add(1) }}, hangGuard)
	for _, url := range []string{"ws://" + refused, srv429.URL} {
		ctx, cancel := dialCtx(t)
		c, err := p.Dial(ctx, url, nil)
		cancel()
		if err == nil {
			t.Fatalf("Dial %s succeeded", url)
		}
		if c != (talaris.Conn{}) {
			t.Errorf("Dial %s returned a non-zero Conn with its error", url)
		}
		if url != srv429.URL && (!errors.Is(err, talaris.ErrDial) || !errors.Is(err, syscall.ECONNREFUSED)) {
			t.Errorf("Dial to a refused port: %v; want ErrDial wrapping ECONNREFUSED", err)
		}
	}
	// A dial whose context ends first (the server accepts and never
	// answers): ErrTimeout wrapping the context's error, and no event.
	silent, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err = p.Dial(ctx, "ws://"+silent.Addr().String(), nil)
	cancel()
	if !errors.Is(err, talaris.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Dial past its context: %v, want ErrTimeout wrapping DeadlineExceeded", err)
	}
	// The failed dials' final events are consumed without a callback.
	if n, err := p.PumpEventsNowait(func(c talaris.Conn, ev talaris.Event) { t.Errorf("Pump saw %v for %#x", ev.Kind, c.ID()) }); n != 0 || err != nil {
		t.Errorf("PumpEventsNowait after failed dials: %d, %v", n, err)
	}
	if n, err := p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {}); n != 0 || !errors.Is(err, talaris.ErrNoConns) {
		t.Errorf("PumpData after failed dials: %d, %v; want ErrNoConns", n, err)
	}
	if seen.Load() != 0 {
		t.Errorf("OnEvent called %d times for failed dials", seen.Load())
	}
	if p.ConnCount() != 0 {
		t.Errorf("ConnCount %d, want 0", p.ConnCount())
	}
	// DialAsync's failure is an event: the caller has the Conn.
	c, err := p.DialAsync("ws://"+refused, nil)
	if err != nil {
		t.Fatal(err)
	}
	var final []talaris.Event
	for len(final) == 0 {
		if _, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
			if cc != c {
				t.Errorf("event %v for %#x", ev.Kind, cc.ID())
			}
			final = append(final, ev)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if final[0].Kind != talaris.EventError || !errors.Is(final[0].Err, syscall.ECONNREFUSED) {
		t.Errorf("DialAsync to a refused port: %v %v, want EventError wrapping ECONNREFUSED", final[0].Kind, final[0].Err)
	}
}

// refusedAddr returns a loopback address where connects are refused: a
// socket bound there without listening keeps anyone else off the port.
func refusedAddr(t *testing.T) string {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
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
	if s, s2 := p.Stats(), p.Stats(); s.Events == 0 || s != s2 {
		t.Errorf("Pool.Stats after Close: %+v then %+v, want the final counters, unchanged", s, s2)
	}
	if _, err := p.DialAsync(srv.URL, nil); !errors.Is(err, talaris.ErrPoolClosed) {
		t.Errorf("DialAsync after Close: %v", err)
	}
	if (talaris.Conn{}).State() != talaris.StateIdle {
		t.Errorf("zero Conn: %v, want idle", (talaris.Conn{}).State())
	}
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
				if errors.Is(err, talaris.ErrNoConns) {
					// every connection so far ended; more may be dialed
					time.Sleep(50 * time.Microsecond)
					continue
				}
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
					p.Stats()
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

// TestCloseDuringResolve: a Dial stuck in a slow name lookup does not
// hold Pool.Close up (the lookup reads no pool memory), and returns an
// error once the lookup ends.
func TestCloseDuringResolve(t *testing.T) {
	p := newTestPool(t, talaris.Config{}, hangGuard)
	entered := make(chan struct{}, 16)
	unblock := make(chan struct{})
	slow := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		entered <- struct{}{}
		<-unblock
		return nil, errors.New("test resolver: no answer")
	}}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := dialCtx(t)
		defer cancel()
		_, err := p.Dial(ctx, "ws://slow.talaris.test:1/", &talaris.DialOptions{Resolver: slow})
		done <- err
	}()
	<-entered // the lookup is under way
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	close(unblock)
	if err := <-done; !errors.Is(err, talaris.ErrResolve) && !errors.Is(err, talaris.ErrPoolClosed) {
		t.Errorf("Dial after its lookup ended: %v, want ErrResolve or ErrPoolClosed", err)
	}
	if took > time.Second { // generous: it returns in microseconds
		t.Errorf("Close waited %v for a name lookup", took)
	}
}
