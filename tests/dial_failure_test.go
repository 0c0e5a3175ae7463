//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
)

// TestFailedDialsGiveSlotsBack: a service that dials (and retries) before
// it starts pumping. A failed synchronous Dial delivers no event; its slot
// and ConnCount come back when Dial returns, without a pump call
// (reapQuiet). Found by a hostile review: with MaxConns 4 the fifth failed
// Dial in a row said ErrTooManyConns with no connection open, and
// ConnCount counted connections nobody had, until something pumped.
// Refused connects, refused upgrades (503) and contexts that end while the
// server holds the upgrade back, 24 dials on 4 slots; then a good dial
// opens and a pump delivers its events only.
func TestFailedDialsGiveSlotsBack(t *testing.T) {
	refused := "ws://" + refusedAddr(t) + "/"
	busy := wstest.NewRaw(func(*wstest.RawConn) {})
	busy.Response = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
	busy.Start(t)
	stall, err := net.Listen("tcp", "127.0.0.1:0") // accepts (backlog), never answers
	if err != nil {
		t.Fatal(err)
	}
	defer stall.Close()
	good := wstest.NewGorilla().Start(t)

	p := newTestPool(t, talaris.Config{MaxConns: 4}, hangGuard)
	for i := range 24 {
		var url string
		var want error
		d := 5 * time.Second
		switch i % 3 {
		case 0:
			url, want = refused, syscall.ECONNREFUSED
		case 1:
			url, want = busy.URL, talaris.ErrHandshake
		case 2:
			url, want, d = "ws://"+stall.Addr().String()+"/", talaris.ErrTimeout, 30*time.Millisecond
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		_, err := p.Dial(ctx, url, nil)
		cancel()
		if !errors.Is(err, want) {
			t.Fatalf("Dial %d (%s): %v, want %v", i, url, err, want)
		}
		if n := p.ConnCount(); n != 0 {
			t.Fatalf("ConnCount %d after failed Dial %d, want 0", n, i)
		}
	}
	c := dial(t, p, good.URL+"/echo")
	if err := c.SendText([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	var kinds []talaris.EventKind
	for len(kinds) < 2 {
		if _, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
			if cc != c {
				t.Errorf("event %v for a Conn nobody had", ev.Kind)
			}
			kinds = append(kinds, ev.Kind)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if kinds[0] != talaris.EventOpen || kinds[1] != talaris.EventText {
		t.Fatalf("events %v, want open then the echo", kinds)
	}
}

// TestEndWhileDialingCode: Close and Abort while the server holds the
// upgrade back end the connection the same way: EventError wrapping
// ErrAborted with Code 1006 (no close frame: nothing was open). Found by a
// hostile review: Close gave Code 0, Abort 1006.
func TestEndWhileDialingCode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts (backlog), never answers
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	for _, how := range []string{"abort", "close"} {
		t.Run(how, func(t *testing.T) {
			p := newTestPool(t, talaris.Config{}, hangGuard)
			c, err := p.DialAsync("ws://"+ln.Addr().String()+"/", nil)
			if err != nil {
				t.Fatal(err)
			}
			for c.State() < talaris.StateUpgrading {
				time.Sleep(time.Millisecond)
			}
			if how == "abort" {
				err = c.Abort()
			} else {
				err = c.Close(talaris.CloseNormal, "")
			}
			if err != nil {
				t.Fatal(err)
			}
			if f := pumpOne(t, p, c, nil); f.Kind != talaris.EventError || !errors.Is(f.Err, talaris.ErrAborted) || f.Code != talaris.CloseAbnormal {
				t.Fatalf("final %+v, want EventError, ErrAborted, Code 1006", f)
			}
		})
	}
}

// blockingWarn holds every Warn record (a failed connection's) until
// release is closed, after telling entered.
type blockingWarn struct{ entered, release chan struct{} }

func (h blockingWarn) Enabled(context.Context, slog.Level) bool { return true }

func (h blockingWarn) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && r.Message != "dial failed" {
		select {
		case h.entered <- struct{}{}:
		default:
		}
		<-h.release
	}
	return nil
}

func (h blockingWarn) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h blockingWarn) WithGroup(string) slog.Handler { return h }

// TestFailedDialLogsOutsidePumpClaim: a failed Dial passes its quiet
// events itself (reapQuiet) under the pump claim; the Config.Logger
// records of them are written after it gave the claim back, so a user's
// slow handler never holds up a pump call. Here the handler blocks until
// PumpDataNowait has returned. Found by a review: the records were written
// under the claim and PumpDataNowait spun for as long as the handler ran.
func TestFailedDialLogsOutsidePumpClaim(t *testing.T) {
	url := "ws://" + refusedAddr(t) + "/"
	h := blockingWarn{entered: make(chan struct{}, 1), release: make(chan struct{})}
	p := newTestPool(t, talaris.Config{Logger: slog.New(h)}, hangGuard)
	dialDone := make(chan error, 1)
	go func() {
		_, err := p.Dial(context.Background(), url, nil)
		dialDone <- err
	}()
	select {
	case <-h.entered: // the reaping Dial writes the failure record
	case <-time.After(hangGuard):
		t.Fatal("the failed connection's record was never written")
	}
	pumped := make(chan error, 1)
	go func() {
		_, err := p.PumpDataNowait(func(talaris.Conn, talaris.Opcode, []byte) {})
		pumped <- err
	}()
	select {
	case err := <-pumped:
		if err != nil {
			t.Errorf("PumpDataNowait: %v", err)
		}
	case <-time.After(hangGuard):
		t.Error("PumpDataNowait waits on the Logger of a failed Dial")
	}
	close(h.release)
	if err := <-dialDone; err == nil {
		t.Error("Dial to a closed port succeeded")
	}
}

// TestCloseDuringBackoffCode: Close of a policy connection waiting out
// its backoff (State Connecting) ends it as Abort does: EventError
// wrapping ErrAborted, Code 1006. Found by a review (Close gave Code 0).
func TestCloseDuringBackoffCode(t *testing.T) {
	url := "ws://" + refusedAddr(t) + "/"
	for _, abort := range []bool{false, true} {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		c, err := p.DialAsync(url, &talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MinDelay: time.Second, MaxDelay: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		closed := false
		f := pumpOne(t, p, c, func(ev talaris.Event) {
			if ev.Kind == talaris.EventReconnecting && !closed {
				closed = true
				t.Logf("state at close: %v", c.State())
				if abort {
					c.Abort()
				} else {
					c.Close(talaris.CloseNormal, "")
				}
			}
		})
		t.Logf("abort=%v: final %v Code %d Err %v (ErrAborted %v)", abort, f.Kind, f.Code, f.Err, errors.Is(f.Err, talaris.ErrAborted))
		if f.Code != 1006 {
			t.Errorf("abort=%v: Code %d, want 1006 (as Abort / as Close before the handshake)", abort, f.Code)
		}
	}
}

// TestFailedDialsRaceClose: failed Dials passing their own events
// (reapQuiet) race Pool.Close, a pumping goroutine and each other: refused
// connects and 503 refusals over ws and wss, four dialers, PumpDataNowait in a
// loop, Close at a different moment each round. Every call returns
// (ErrPoolClosed once Close started), every other failed Dial with its
// target's sentinel (ErrDial for the refused connect, ErrBadStatus for
// the 503s; each seen) or ErrTooManyConns (the four slots held by failed
// Dials whose final events the pump has not passed yet), nothing panics;
// under -race in the race lane. Both TLS backends (run with -tags talaris_openssl).
func TestFailedDialsRaceClose(t *testing.T) {
	busy := wstest.NewRaw(func(*wstest.RawConn) {})
	busy.Response = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
	busy.Start(t)
	busyTLS := wstest.NewRaw(func(*wstest.RawConn) {})
	busyTLS.Response = busy.Response
	busyTLS.StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
	// Each failure is its own sentinel; Pool.Close makes every later one
	// ErrPoolClosed.
	targets := []struct {
		url  string
		want error
	}{
		{"ws://" + refusedAddr(t) + "/", talaris.ErrDial},
		{busy.URL, talaris.ErrBadStatus},
		{busyTLS.URL, talaris.ErrBadStatus},
	}
	seen := make([]atomic.Int64, len(targets)) // Dials that failed with their target's want
	for round := range 6 {
		p := newTestPool(t, talaris.Config{MaxConns: 4, Logger: slog.New(slog.DiscardHandler)}, hangGuard)
		done := make(chan struct{})
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					k := (g + i) % len(targets)
					tg := targets[k]
					_, err := p.Dial(context.Background(), tg.url, tlsOpts)
					switch {
					case errors.Is(err, talaris.ErrPoolClosed):
						return
					case errors.Is(err, tg.want):
						seen[k].Add(1)
					case errors.Is(err, talaris.ErrTooManyConns):
					default:
						t.Errorf("Dial %s: %v, want an error matching %q (or ErrTooManyConns, ErrPoolClosed)", tg.url, err, tg.want)
						return
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, err := p.PumpDataNowait(func(talaris.Conn, talaris.Opcode, []byte) {}); errors.Is(err, talaris.ErrPoolClosed) {
					return
				}
				select {
				case <-done:
				default:
					continue
				}
				return
			}
		}()
		time.Sleep(time.Duration(10+20*round) * time.Millisecond)
		p.Close()
		close(done)
		ended := make(chan struct{})
		go func() { wg.Wait(); close(ended) }()
		select {
		case <-ended:
		case <-time.After(hangGuard):
			t.Fatalf("round %d: a Dial or the pump did not return after Pool.Close", round)
		}
	}
	for k, tg := range targets {
		t.Logf("%s: %d Dials failed with %q", tg.url, seen[k].Load(), tg.want)
		if seen[k].Load() == 0 {
			t.Errorf("no Dial to %s failed with %q in 6 rounds: its failure never raced the Close", tg.url, tg.want)
		}
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
	if n, err := p.PumpNowait(func(c talaris.Conn, ev talaris.Event) { t.Errorf("Pump saw %v for %#x", ev.Kind, c.ID()) }); n != 0 || err != nil {
		t.Errorf("PumpNowait after failed dials: %d, %v", n, err)
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
	// Close must return while the lookup is still blocked: the lookup is
	// only let go after Close returned, so a Close that waited for it
	// would never return (the order is the verdict, not the time taken).
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		t.Logf("Close returned in %v with the name lookup still blocked", time.Since(start))
		if err != nil {
			t.Error(err)
		}
	case <-time.After(20 * time.Second): // hang guard: Close returns in microseconds
		close(unblock)
		t.Fatal("Close did not return while a Dial's name lookup was blocked: it waits for the lookup")
	}
	select {
	case <-done:
		t.Fatal("the Dial returned before its lookup ended")
	default:
	}
	close(unblock)
	if err := <-done; !errors.Is(err, talaris.ErrResolve) && !errors.Is(err, talaris.ErrPoolClosed) {
		t.Errorf("Dial after its lookup ended: %v, want ErrResolve or ErrPoolClosed", err)
	}
}

// TestFailedDialsConcurrentSlots: four goroutines each make eight
// synchronous Dials that are refused, on a Pool of four slots that nobody
// pumps. Every Dial gets its refusal (never ErrTooManyConns: a failed Dial
// gives its slot back before it returns), and no slot is held once they
// are done. Refusals come whole, after a late body, after a close, and
// with a reset. Found by a review: a failed Dial that found another one
// reaping gave up on its own slot, which then stayed taken until
// something pumped.
func TestFailedDialsConcurrentSlots(t *testing.T) {
	for mode := 0; mode < 4; mode++ {
		t.Run(strconv.Itoa(mode), func(t *testing.T) {
			p := newTestPool(t, talaris.Config{MaxConns: 4}, hangGuard)
			done := make(chan struct{})
			defer close(done)
			ln, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			answerRequests(ln, func(nc net.Conn) {
				switch mode {
				case 0:
					io.WriteString(nc, "HTTP/1.1 503 X\r\nContent-Length: 2\r\n\r\nok")
					<-done
				case 1:
					io.WriteString(nc, "HTTP/1.1 503 X\r\nTransfer-Encoding: chunked\r\n\r\n")
					time.Sleep(10 * time.Millisecond)
					io.WriteString(nc, "2\r\nok\r\n0\r\n\r\n")
					<-done
				case 2:
					io.WriteString(nc, "HTTP/1.1 503 X\r\n\r\n")
					time.Sleep(10 * time.Millisecond)
					io.WriteString(nc, "ok")
				case 3:
					io.WriteString(nc, "HTTP/1.1 503 X\r\nContent-Length: 2\r\n\r\n")
					time.Sleep(5 * time.Millisecond)
					nc.(*net.TCPConn).SetLinger(0)
				}
			})
			url := "ws://" + ln.Addr().String() + "/"
			errc := make(chan error, 64)
			for g := 0; g < 4; g++ {
				go func() {
					for i := 0; i < 8; i++ {
						ctx, cancel := dialCtx(t)
						_, err := p.Dial(ctx, url, nil)
						cancel()
						var he *talaris.HandshakeError
						if !errors.As(err, &he) || he.StatusCode != 503 {
							errc <- err
						}
					}
					errc <- nil
				}()
			}
			for g := 0; g < 4; {
				if err := <-errc; err == nil {
					g++
				} else {
					t.Errorf("a refused Dial returned %v", err)
				}
			}
			if n := p.ConnCount(); n != 0 {
				t.Errorf("ConnCount %d after every Dial returned", n)
			}
		})
	}
}

// TestFailedDialsRaceCloseReaping: Pool.Close lands while four goroutines'
// refused Dials pass each other's final events (the reapers' claim):
// every Dial returns (the refusal or ErrPoolClosed), twenty times, with
// Close at 0-19 ms into the storm. From the review of the reaping fix.
func TestFailedDialsRaceCloseReaping(t *testing.T) {
	for r := 0; r < 20; r++ {
		p := newTestPool(t, talaris.Config{MaxConns: 4}, hangGuard)
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		answerRequests(ln, func(nc net.Conn) { io.WriteString(nc, "HTTP/1.1 503 X\r\nContent-Length: 2\r\n\r\nok") })
		url := "ws://" + ln.Addr().String() + "/"
		errc := make(chan error, 4)
		for k := 0; k < 4; k++ {
			go func() {
				for i := 0; i < 50; i++ {
					ctx, cancel := dialCtx(t)
					_, err := p.Dial(ctx, url, nil)
					cancel()
					var he *talaris.HandshakeError
					if errors.Is(err, talaris.ErrPoolClosed) {
						break
					}
					if !errors.As(err, &he) {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
		}
		time.Sleep(time.Duration(r) * time.Millisecond)
		p.Close()
		for k := 0; k < 4; k++ {
			if err := <-errc; err != nil {
				t.Errorf("round %d: a Dial returned %v", r, err)
			}
		}
		ln.Close()
	}
}

// TestRefusalRaceDialContext: Dial's context ends before, near and after
// the 200 ms a refusal waits for its body (a Content-Length body that
// never comes whole), on a threaded and an inline Pool: every Dial returns
// the refusal with the body so far, or ErrTimeout when its context ended
// before the refusal came; no slot stays taken. From the review of the
// refusal wait.
func TestRefusalRaceDialContext(t *testing.T) {
	for _, inline := range []bool{false, true} {
		p := newTestPool(t, talaris.Config{MaxConns: 4, Tuning: talaris.Tuning{InlineLoop: inline}}, hangGuard)
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		answerRequests(ln, func(nc net.Conn) {
			io.WriteString(nc, "HTTP/1.1 503 X\r\nContent-Length: 100\r\n\r\nabc")
			time.Sleep(time.Second)
		})
		url := "ws://" + ln.Addr().String() + "/"
		for i := 0; i < 12; i++ {
			d := 194*time.Millisecond + time.Duration(i)*time.Millisecond
			if i%4 == 0 {
				d = time.Duration(i) * 5 * time.Millisecond
			}
			ctx, cancel := context.WithTimeout(context.Background(), d)
			_, err := p.Dial(ctx, url, nil)
			cancel()
			var he *talaris.HandshakeError
			switch {
			case errors.As(err, &he):
				if he.StatusCode != 503 || string(he.Body) != "abc" {
					t.Errorf("inline %v, context %v: status %d body %q", inline, d, he.StatusCode, he.Body)
				}
			case errors.Is(err, talaris.ErrTimeout):
			default:
				t.Errorf("inline %v, context %v: %v", inline, d, err)
			}
		}
		if inline {
			pumpUntil(t, p, func(talaris.Conn, talaris.Event) {}, func() bool { return p.ConnCount() == 0 }, nil)
		}
		if n := p.ConnCount(); n != 0 {
			t.Errorf("inline %v: ConnCount %d", inline, n)
		}
	}
}
