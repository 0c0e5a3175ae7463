//go:build linux && cgo

package talaris_test

import (
	"errors"
	"net"
	"testing"
	"time"

	. "github.com/talaris-go/talaris"
)

// TestCloseDuringBackoffCode: Close of a policy connection waiting out
// its backoff (State Connecting) ends it as Abort does: EventError
// wrapping ErrAborted, Code 1006. Found by a review (Close gave Code 0).
func TestCloseDuringBackoffCode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "ws://" + ln.Addr().String() + "/"
	ln.Close() // refused from now on
	for _, abort := range []bool{false, true} {
		p := newTestPool(t, Config{}, hangGuard)
		c, err := p.DialAsync(url, &DialOptions{Reconnect: &ReconnectPolicy{MinDelay: time.Second, MaxDelay: time.Second}})
		if err != nil {
			t.Fatal(err)
		}
		closed := false
		f := pumpOne(t, p, c, func(ev Event) {
			if ev.Kind == EventReconnecting && !closed {
				closed = true
				t.Logf("state at close: %v", c.State())
				if abort {
					c.Abort()
				} else {
					c.Close(CloseNormal, "")
				}
			}
		})
		t.Logf("abort=%v: final %v Code %d Err %v (ErrAborted %v)", abort, f.Kind, f.Code, f.Err, errors.Is(f.Err, ErrAborted))
		if f.Code != 1006 {
			t.Errorf("abort=%v: Code %d, want 1006 (as Abort / as Close before the handshake)", abort, f.Code)
		}
	}
}
