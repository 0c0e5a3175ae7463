//go:build linux && cgo

package talaris_test

import (
	"context"
	"fmt"
	"github.com/talaris-go/talaris"
	"testing"
	"time"

	"github.com/talaris-go/talaris/internal/wstest"
)

// TestStalledConnDoesNotStarveOthers: a connection flooding a pool that
// nobody pumps fills the event ring and stalls; it must not hold the whole
// shared buffer ring, so a second connection's blocking Dial still
// completes (its 101 needs a buffer slot to be read).
func TestStalledConnDoesNotStarveOthers(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	p, err := talaris.NewPool(talaris.Config{EventRingSize: 256, BufSize: 4096, BufCount: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	flood, err := p.Dial(ctx, srv.URL+"/stream?n=2000000&size=64", nil)
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the flood has filled the ring (a stall) or used up the
	// receive slots, which hold in-place payloads until they are pumped:
	// either is counted (Stalls, NoBufs), or, with recv bundles (the
	// default), a recv that found the slots gone ends and waits for them
	// without an -ENOBUFS, so the flood's events simply stop growing
	// (nobody pumps, and the server has 2,000,000 messages to send).
	last, still := uint64(0), 0
	for i := 0; ; i++ {
		st := p.Stats()
		if st.Stalls != 0 || st.NoBufs != 0 || (st.Events > 0 && still >= 100) {
			break
		}
		if i > 5000 {
			t.Fatalf("flood never stalled: %+v", st)
		}
		if st.Events == last {
			still++
		} else {
			last, still = st.Events, 0
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // let it take every slot it can
	second, err := p.Dial(ctx, srv.URL+"/echo", &talaris.DialOptions{HandshakeTimeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("second dial behind a stalled flood: %v (stats %+v)", err, p.Stats())
	}
	if second.State() != talaris.StateOpen || flood.State() != talaris.StateOpen {
		t.Fatalf("states: flood %v second %v", flood.State(), second.State())
	}
}

// TestPoolCloseWithFullRing: Close returns even when the ring is full and
// the server keeps sending (final events that find no room are dropped).
func TestPoolCloseWithFullRing(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	p, err := talaris.NewPool(talaris.Config{EventRingSize: 64})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = ctx
	for i := 0; i < 4; i++ {
		if _, err := p.DialAsync(srv.URL+"/stream?n=1000000&size=64", nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; p.Stats().Stalls == 0 && p.Stats().NoBufs == 0; i++ {
		if i > 3000 {
			t.Fatalf("never stalled: %+v", p.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Pool.Close hung with a full event ring")
	}
	if _, err := p.Pump(func(talaris.Conn, talaris.Event) {}); err != talaris.ErrPoolClosed {
		t.Fatalf("Pump after Close: %v, want ErrPoolClosed", err)
	}
}

// TestDialsDuringFlood: 48 connections dialed at once, each flooding as soon
// as it opens, so later handshakes race earlier floods for receive buffers
// (handshakes have their own buffer group). Every one must open and deliver
// its whole stream.
func TestDialsDuringFlood(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	p, err := talaris.NewPool(talaris.Config{BufCount: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// The handshakes race the first floods' first messages; under -short
	// (the race run: 33 s of it at load 10) 2,000 messages a stream.
	const conns = 48
	n := scaled(20000)
	chk := map[talaris.Conn]*wstest.Checker{}
	for range conns {
		c, err := p.DialAsync(fmt.Sprintf("%s/stream?n=%d&size=64", srv.URL, n), nil)
		if err != nil {
			t.Fatal(err)
		}
		chk[c] = wstest.NewChecker(64)
	}
	done, opened := 0, 0
	deadline := time.Now().Add(60 * time.Second)
	for done < conns {
		if time.Now().After(deadline) {
			t.Fatalf("%d opened, %d done after 60s (stats %+v)", opened, done, p.Stats())
		}
		if _, err := p.Pump(func(c talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventOpen:
				opened++
			case talaris.EventBinary:
				if err := chk[c].Check(ev.Payload); err != nil {
					t.Fatal(err)
				}
			case talaris.EventClose, talaris.EventError:
				if ev.Kind != talaris.EventClose || chk[c].Count() != n {
					t.Errorf("conn %d: %v %v after %d messages", c.Slot(), ev.Kind, ev.Err, chk[c].Count())
				}
				done++
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if opened != conns {
		t.Fatalf("opened %d of %d", opened, conns)
	}
}
