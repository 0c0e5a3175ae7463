//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
)

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
		p := newTestPool(t, talaris.Config{MaxConns: 4, InlineLoop: inline}, hangGuard)
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
