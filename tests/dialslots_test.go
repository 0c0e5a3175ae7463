//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	. "github.com/talaris-go/talaris"
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "ws://" + ln.Addr().String() + "/"
	ln.Close()
	busy := wstest.NewRaw(func(*wstest.RawConn) {})
	busy.Response = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
	busy.Start(t)
	stall, err := net.Listen("tcp", "127.0.0.1:0") // accepts (backlog), never answers
	if err != nil {
		t.Fatal(err)
	}
	defer stall.Close()
	good := wstest.NewGorilla().Start(t)

	p := newTestPool(t, Config{MaxConns: 4}, hangGuard)
	for i := range 24 {
		var url string
		var want error
		d := 5 * time.Second
		switch i % 3 {
		case 0:
			url, want = refused, syscall.ECONNREFUSED
		case 1:
			url, want = busy.URL, ErrHandshake
		case 2:
			url, want, d = "ws://"+stall.Addr().String()+"/", ErrTimeout, 30*time.Millisecond
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
	var kinds []EventKind
	for len(kinds) < 2 {
		if _, err := p.Pump(func(cc Conn, ev Event) {
			if cc != c {
				t.Errorf("event %v for a Conn nobody had", ev.Kind)
			}
			kinds = append(kinds, ev.Kind)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if kinds[0] != EventOpen || kinds[1] != EventText {
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
			p := newTestPool(t, Config{}, hangGuard)
			c, err := p.DialAsync("ws://"+ln.Addr().String()+"/", nil)
			if err != nil {
				t.Fatal(err)
			}
			for c.State() < StateUpgrading {
				time.Sleep(time.Millisecond)
			}
			if how == "abort" {
				err = c.Abort()
			} else {
				err = c.Close(CloseNormal, "")
			}
			if err != nil {
				t.Fatal(err)
			}
			if f := pumpOne(t, p, c, nil); f.Kind != EventError || !errors.Is(f.Err, ErrAborted) || f.Code != CloseAbnormal {
				t.Fatalf("final %+v, want EventError, ErrAborted, Code 1006", f)
			}
		})
	}
}
