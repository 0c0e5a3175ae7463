//go:build linux && cgo

package talaris_test

import (
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	. "github.com/talaris-go/talaris"
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
			p := newTestPool(t, Config{MaxConns: 4}, hangGuard)
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
						var he *HandshakeError
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
