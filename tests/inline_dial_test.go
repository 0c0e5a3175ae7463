//go:build linux && cgo

package talaris_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
)

// TestInlineDialContext: a Dial from the pool's goroutine (nobody else
// runs the loop) to a server that accepts TCP and never answers the
// upgrade ends with its context.
func TestInlineDialContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	p := newTestPool(t, inlineCfg, hangGuard)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := p.Dial(ctx, "ws://"+ln.Addr().String()+"/", nil); !errors.Is(err, talaris.ErrTimeout) {
		t.Fatalf("dial: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("dial with a 150 ms context took %v", d)
	}
}

// slowUpgrade starts a gorilla server (ws, or wss when secure) that
// answers the upgrade only after delay, then sends "hello" and reads
// until the connection ends; every ended connection is reported on the
// returned channel.
func slowUpgrade(t *testing.T, delay time.Duration, secure bool) (string, <-chan struct{}) {
	ended := make(chan struct{}, 16)
	up := websocket.Upgrader{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { ended <- struct{}{} }()
		time.Sleep(delay)
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		if c.WriteMessage(websocket.TextMessage, []byte("hello")) != nil {
			return
		}
		for {
			if _, _, err := c.ReadMessage(); err != nil {
				return
			}
		}
	}))
	if secure {
		srv.TLS = serverTLS(t, testCertFile, testKeyFile, 0, 0)
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	if secure {
		return "wss" + strings.TrimPrefix(srv.URL, "https"), ended
	}
	return "ws" + strings.TrimPrefix(srv.URL, "http"), ended
}

// dialAway dials url from another goroutine with a context of d and
// reports its error (a Conn it returned is an error too: these dials
// must give up).
func dialAway(p *talaris.Pool, url string, opts *talaris.DialOptions, d time.Duration) <-chan error {
	res := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		c, err := p.Dial(ctx, url, opts)
		if err == nil {
			err = fmt.Errorf("dial returned %v", c)
		}
		res <- err
	}()
	return res
}

// TestInlineAbandonedDial: a Dial from a goroutine that does not pump
// gives up (its context ends) while its connection waits for a slow
// upgrade; the pool's goroutine, which ran the loop while the dial
// started, pumps again only after the server answered the upgrade and
// sent a message. The caller never got the Conn, so nothing of it may
// surface: no EventOpen, no message; the connection is closed (the
// server sees it end) and its slot freed (ConnCount 0). The threaded
// mode, the model, is held to the same.
func TestInlineAbandonedDial(t *testing.T) {
	for _, mode := range []string{"inline", "threaded"} {
		for _, secure := range []bool{false, true} {
			name := mode + "/ws"
			opts := (*talaris.DialOptions)(nil)
			if secure {
				name, opts = mode+"/wss", tlsOpts
			}
			t.Run(name, func(t *testing.T) {
				url, ended := slowUpgrade(t, 500*time.Millisecond, secure)
				var got []string
				record := func(c talaris.Conn, ev talaris.Event) { got = append(got, fmt.Sprintf("%v %q", ev.Kind, ev.Payload)) }
				cfg := talaris.Config{OnEvent: record}
				if mode == "inline" {
					cfg.Tuning.InlineLoop = true
				}
				p := newTestPool(t, cfg, hangGuard)
				start := time.Now()
				dialed := dialAway(p, url, opts, 250*time.Millisecond)
				// Run the loop while the dial starts (connect, TLS, the
				// upgrade request), then not at all.
				for time.Since(start) < 100*time.Millisecond {
					if _, err := p.PumpNowait(record); err != nil {
						t.Fatal(err)
					}
					time.Sleep(time.Millisecond)
				}
				if err := <-dialed; !errors.Is(err, talaris.ErrTimeout) {
					t.Fatalf("dial with a 250 ms context, upgrade after 500 ms: %v", err)
				}
				// The upgrade and "hello" arrive while nobody pumps.
				time.Sleep(800*time.Millisecond - time.Since(start))
				deadline := time.Now().Add(5 * time.Second)
				for p.ConnCount() != 0 || time.Since(start) < time.Second {
					if time.Now().After(deadline) {
						t.Fatalf("abandoned dial still counted 5 s on (events %q)", got)
					}
					if _, err := p.PumpNowait(record); err != nil {
						t.Fatal(err)
					}
					time.Sleep(time.Millisecond)
				}
				if len(got) != 0 {
					t.Fatalf("events of a Conn the caller never got: %q", got)
				}
				select {
				case <-ended:
				case <-time.After(10 * time.Second):
					t.Fatal("the server's connection did not end")
				}
			})
		}
	}
}

// TestInlineDialWhileCallbackWaits: the pool's goroutine is inside a
// pump callback (not running the loop) that waits for another
// goroutine's Dial; that Dial's context ends. Dial must return
// ErrTimeout with its context, not when the callback returns (it did not
// while the pump was claimed, and a callback waiting for it never
// returned); its connection then never surfaces, and the pool's own
// connection goes on.
func TestInlineDialWhileCallbackWaits(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(map[bool]string{false: "ws", true: "wss"}[secure], func(t *testing.T) {
			slow, _ := slowUpgrade(t, 300*time.Millisecond, secure)
			echo := wstest.NewGorilla().Start(t).URL + "/echo"
			p, c := dialOpts(t, inlineCfg, echo, nil)
			opts := (*talaris.DialOptions)(nil)
			if secure {
				opts = tlsOpts
			}
			if err := c.SendText([]byte("go")); err != nil {
				t.Fatal(err)
			}
			var dialErr error
			waited := time.Duration(-1)
			var others []string
			echoes := 0
			for echoes < 2 {
				if _, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
					if cc != c {
						others = append(others, fmt.Sprintf("%v %q", ev.Kind, ev.Payload))
						return
					}
					if ev.Kind != talaris.EventText {
						return
					}
					echoes++
					if echoes == 1 {
						start := time.Now()
						res := dialAway(p, slow, opts, 200*time.Millisecond)
						select {
						case dialErr = <-res:
							waited = time.Since(start)
						case <-time.After(5 * time.Second):
						}
						if err := c.SendText([]byte("again")); err != nil {
							t.Error(err)
						}
					}
				}); err != nil {
					t.Fatal(err)
				}
			}
			if waited < 0 || !errors.Is(dialErr, talaris.ErrTimeout) {
				t.Fatalf("Dial with a 200 ms context, the loop's goroutine in a callback waiting for it: %v after %v", dialErr, waited)
			}
			// The abandoned connection ends (the loop aborts it, maybe
			// before it connected) without an event; the pool's own one
			// stays.
			deadline := time.Now().Add(10 * time.Second)
			for p.ConnCount() != 1 {
				if time.Now().After(deadline) {
					t.Fatalf("%d connections 10 s on", p.ConnCount())
				}
				if _, err := p.PumpNowait(func(cc talaris.Conn, ev talaris.Event) {
					if cc != c {
						others = append(others, fmt.Sprintf("%v %q", ev.Kind, ev.Payload))
					}
				}); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Millisecond)
			}
			if len(others) != 0 || c.State() != talaris.StateOpen {
				t.Fatalf("events of a Conn the caller never got: %q; own connection %v", others, c.State())
			}
		})
	}
}

// TestInlineRingFullNobodyPumps: another goroutine sends while the pool's
// goroutine does not run the loop, until the command ring (4 KiB) is
// full. Send* and Ping then return ErrWouldBlock at once, as they
// promise, and SendContext returns with its context (before: all three
// waited for room until the pool's goroutine pumped); nothing accepted
// is lost: once the pool's goroutine pumps, every accepted message comes
// back from the echo server in order, and a SendContext goes through.
func TestInlineRingFullNobodyPumps(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(map[bool]string{false: "ws", true: "wss"}[secure], func(t *testing.T) {
			srv := wstest.NewGorilla()
			var opts *talaris.DialOptions
			if secure {
				srv, opts = srv.StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0)), tlsOpts
			} else {
				srv = srv.Start(t)
			}
			p, c := dialOpts(t, testhook.WithKnobs(talaris.Config{Tuning: talaris.Tuning{InlineLoop: true}}, testhook.Knobs{CmdRingSize: 4096, NoDirectSend: true}), srv.URL+"/echo", opts)
			type result struct {
				accepted       int
				send, ping, sc error
			}
			res := make(chan result, 1)
			go func() {
				var r result
				msg := make([]byte, 200)
				for r.send == nil && r.accepted < 1000 {
					binary.LittleEndian.PutUint64(msg, uint64(r.accepted))
					if r.send = c.SendBinary(msg); r.send == nil {
						r.accepted++
					}
				}
				for i := 0; i < 1000 && r.ping == nil; i++ {
					r.ping = c.Ping(nil) // (a ping's record is smaller)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				r.sc = c.SendContext(ctx, talaris.OpBinary, msg)
				cancel()
				res <- r
			}()
			var r result
			select {
			case r = <-res:
			case <-time.After(5 * time.Second):
				p.Close() // let the sender go: the test failed
				r = <-res
				t.Fatalf("sends to a full ring still waiting 5 s on (%d accepted; %v %v %v)", r.accepted, r.send, r.ping, r.sc)
			}
			if !errors.Is(r.send, talaris.ErrWouldBlock) || !errors.Is(r.ping, talaris.ErrWouldBlock) || !errors.Is(r.sc, context.DeadlineExceeded) {
				t.Fatalf("full ring after %d messages: send %v, ping %v, SendContext %v", r.accepted, r.send, r.ping, r.sc)
			}
			// The pool's goroutine pumps: everything accepted arrives,
			// and another goroutine's SendContext waits for room.
			sent := make(chan error, 1)
			go func() {
				ctx, cancel := dialCtx(t)
				defer cancel()
				msg := make([]byte, 200)
				binary.LittleEndian.PutUint64(msg, uint64(r.accepted))
				sent <- c.SendContext(ctx, talaris.OpBinary, msg)
			}()
			seen := 0
			for seen <= r.accepted {
				if _, err := p.PumpData(func(cc talaris.Conn, op talaris.Opcode, pl []byte) {
					if got := binary.LittleEndian.Uint64(pl); got != uint64(seen) {
						t.Fatalf("echo %d is message %d", seen, got)
					}
					seen++
				}); err != nil {
					t.Fatal(err)
				}
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestInlineDialAbortFullRing: another goroutine's Dial is in the ring
// when a third goroutine fills it (sends until ErrWouldBlock) and
// nobody runs the loop; the Dial's context ends. Its abort finds no room:
// Dial must still return ErrTimeout with its context (before: the abort
// waited for room, and Dial for the abort, until the pool closed). Once
// the pool's goroutine pumps, every accepted message is echoed and the
// abandoned connection ends at its upgrade without an event.
func TestInlineDialAbortFullRing(t *testing.T) {
	slow, _ := slowUpgrade(t, time.Second, false)
	echo := wstest.NewGorilla().Start(t).URL + "/echo"
	p, c := dialOpts(t, testhook.WithKnobs(talaris.Config{Tuning: talaris.Tuning{InlineLoop: true}}, testhook.Knobs{CmdRingSize: 4096, NoDirectSend: true}), echo, nil)
	start := time.Now()
	dialed := dialAway(p, slow, nil, 300*time.Millisecond)
	time.Sleep(50 * time.Millisecond) // the DIAL is in the ring
	filled := make(chan error, 1)
	accepted := 0
	go func() { // (this goroutine's sends would run the loop)
		msg := make([]byte, 200)
		for {
			binary.LittleEndian.PutUint64(msg, uint64(accepted))
			err := c.SendBinary(msg)
			if errors.Is(err, talaris.ErrWouldBlock) {
				break
			}
			if err != nil {
				filled <- err
				return
			}
			accepted++
		}
		for i := 0; i < 1000; i++ { // a ping's record is the abort's size
			if err := c.Ping(nil); err != nil {
				if !errors.Is(err, talaris.ErrWouldBlock) {
					filled <- err
					return
				}
				break
			}
		}
		filled <- nil
	}()
	if err := <-filled; err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-dialed:
		if !errors.Is(err, talaris.ErrTimeout) {
			t.Fatalf("dial: %v", err)
		}
	case <-time.After(5 * time.Second):
		p.Close()
		t.Fatalf("a 300 ms Dial still waiting %v on, its abort behind a full ring", time.Since(start))
	}
	seen := 0
	var others []string
	deadline := time.Now().Add(10 * time.Second)
	for seen < accepted || p.ConnCount() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d/%d echoes, %d connections", seen, accepted, p.ConnCount())
		}
		if _, err := p.PumpNowait(func(cc talaris.Conn, ev talaris.Event) {
			switch {
			case cc != c:
				others = append(others, fmt.Sprintf("%v %q", ev.Kind, ev.Payload))
			case ev.Kind == talaris.EventBinary:
				if got := binary.LittleEndian.Uint64(ev.Payload); got != uint64(seen) {
					t.Errorf("echo %d is message %d", seen, got)
				}
				seen++
			}
		}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Millisecond)
	}
	if len(others) != 0 {
		t.Fatalf("events of a Conn the caller never got: %q", others)
	}
	t.Logf("%d messages echoed, the abandoned dial gone, %v after the start", accepted, time.Since(start))
}
