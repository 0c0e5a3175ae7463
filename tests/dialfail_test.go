//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
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
func (h blockingWarn) WithGroup(string) slog.Handler      { return h }

// TestFailedDialLogsOutsidePumpClaim: a failed Dial passes its quiet
// events itself (reapQuiet) under the pump claim; the Config.Logger
// records of them are written after it gave the claim back, so a user's
// slow handler never holds up a pump call. Here the handler blocks until
// PumpNowait has returned. Found by a review: the records were written
// under the claim and PumpNowait spun for as long as the handler ran.
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
		_, err := p.PumpNowait(func(talaris.Conn, talaris.Opcode, []byte) {})
		pumped <- err
	}()
	select {
	case err := <-pumped:
		if err != nil {
			t.Errorf("PumpNowait: %v", err)
		}
	case <-time.After(hangGuard):
		t.Error("PumpNowait waits on the Logger of a failed Dial")
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
// connects and 503 refusals over ws and wss, four dialers, PumpNowait in a
// loop, Close at a different moment each round. Every call returns
// (ErrPoolClosed once Close started), nothing panics; under -race in the
// race lane. Both TLS backends (run with -tags talaris_openssl).
func TestFailedDialsRaceClose(t *testing.T) {
	busy := wstest.NewRaw(func(*wstest.RawConn) {})
	busy.Response = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
	busy.Start(t)
	busyTLS := wstest.NewRaw(func(*wstest.RawConn) {})
	busyTLS.Response = busy.Response
	busyTLS.StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
	urls := []string{"ws://" + refusedAddr(t) + "/", busy.URL, busyTLS.URL}
	for round := range 6 {
		p := newTestPool(t, talaris.Config{MaxConns: 4, Logger: slog.New(slog.DiscardHandler)}, hangGuard)
		done := make(chan struct{})
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					url := urls[(g+i)%len(urls)]
					_, err := p.Dial(context.Background(), url, tlsOpts)
					if errors.Is(err, talaris.ErrPoolClosed) {
						return
					}
					if err == nil {
						t.Errorf("Dial %s succeeded", url)
						return
					}
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if _, err := p.PumpNowait(func(talaris.Conn, talaris.Opcode, []byte) {}); errors.Is(err, talaris.ErrPoolClosed) {
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
}
