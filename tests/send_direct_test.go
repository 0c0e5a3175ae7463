//go:build linux && cgo

package talaris_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// Direct-send tests (testhook.Knobs.NoDirectSend): on ws:// a
// send finding the connection's queue empty and the loop not writing is
// written by the calling goroutine; a short write hands the rest to the
// loop. The peers are real servers on loopback that parse every frame (a
// byte of one frame inside another fails the parse) and check every
// message's number and content. wss:// runs the same tests through the
// loop path (testhook.DirectSends stays 0).

// TestDirectSendConcurrentSenders: 16 goroutines send sequence-numbered
// messages on one connection with SendBinary (retrying on ErrWouldBlock),
// so sends race for the socket: some go out directly, the rest queue
// behind them. The server sees every sender's messages complete, intact
// and in order.
func TestDirectSendConcurrentSenders(t *testing.T) {
	send := func(c talaris.Conn, ctx context.Context, op talaris.Opcode, b []byte) error {
		for {
			var err error
			if op == talaris.OpText {
				err = c.SendText(b)
			} else {
				err = c.SendBinary(b)
			}
			if !errors.Is(err, talaris.ErrWouldBlock) {
				return err
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
	runConcurrentSendersCheck(t, 16, talaris.Config{MaxSendQueue: 256 << 10}, send, func(t *testing.T, st talaris.ConnStats, ds uint64) {
		if ds == 0 {
			t.Errorf("no message went out directly (stats %+v)", st)
		}
		if ds >= st.MsgsOut {
			t.Errorf("every message went out directly: the mix with queued sends was not exercised (%d direct, stats %+v)", ds, st)
		}
	})
}

// TestDirectSendPeerStopsReading: against a peer that does not read,
// direct sends fill the socket until it refuses (EAGAIN: the rest of that
// frame goes to the loop), then the queue fills to ErrWouldBlock. When the
// peer reads, every message arrives in order and intact, then more sent
// with SendContext, then the close.
func TestDirectSendPeerStopsReading(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		s := newSink(t, useTLS, false, 0)
		p := newTestPool(t, talaris.Config{MaxSendQueue: 256 << 10}, hangGuard)
		c := dialSink(t, p, s)
		// The loop offers the socket once its output after the upgrade is
		// done, a moment after Dial returns: until then sends queue.
		next := 0
		buf := make([]byte, 1000)
		if err := c.SendBinary(seqMsg(buf, next)); err != nil {
			t.Fatalf("SendBinary: %v", err)
		}
		next++
		for c.Stats().SendQueued != 0 {
			time.Sleep(time.Millisecond)
		}
		fillUntilBlocked(t, c, &next, 1000, 1<<30)
		ds, hs := testhook.DirectSends(c)
		st := c.Stats()
		t.Logf("refused after %d messages: %+v, %d direct sends, %d handed off", next, st, ds, hs)
		if useTLS {
			if ds != 0 {
				t.Errorf("wss: %d direct sends, want 0 (the loop owns the TLS session)", ds)
			}
		} else {
			if ds == 0 || hs == 0 {
				t.Errorf("want direct sends and at least one handoff to the loop (%d, %d)", ds, hs)
			}
			if st.SendQueued == 0 {
				t.Errorf("queue empty at ErrWouldBlock (stats %+v)", st)
			}
		}
		close(s.gate)
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		for range 2000 {
			if err := c.SendContext(ctx, talaris.OpBinary, seqMsg(buf, next)); err != nil {
				t.Fatalf("SendContext %d: %v", next, err)
			}
			next++
		}
		s.waitCount(t, next)
		// The sink can read the last bytes before the loop reaps the
		// completion of the write that carried them: tx_done (and so
		// SendQueued) trails the wire by that much.
		st = waitSendQueuedDrained(t, c)
		if st.MsgsOut != uint64(next) || st.SendQueued != 0 {
			t.Errorf("stats %+v after %d messages arrived", st, next)
		}
		if f := closeAndWait(t, p, c); f.Kind != talaris.EventClose {
			t.Errorf("final %+v, want EventClose", f)
		}
		if n, _, err := s.state(); err != nil || n != next {
			t.Errorf("sink: %d messages, err %v; want %d", n, err, next)
		}
	})
}

// TestDirectSendControlInterleaved: while one goroutine sends data (direct
// and queued), the server pings the client (the loop's pongs go out
// between our frames), another goroutine sends pings, and then the close
// goes out: the server parses every frame, sees the data in order and
// intact, the pongs in the order of its pings, our pings, and the close
// after the last message.
func TestDirectSendControlInterleaved(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		minimum := scaled(20000)
		var seenPongs, seenPings atomic.Int64 // what the server has seen so far
		type result struct {
			n, pongs, pings, atClose int
			err                      error
		}
		res := make(chan result, 1)
		srv := wstest.NewRaw(func(rc *wstest.RawConn) {
			var r result
			stop := make(chan struct{})
			var sent atomic.Int64
			go func() { // the server's pings, until the close arrives
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					case <-time.After(200 * time.Microsecond):
					}
					if rc.WriteFrame(true, ws.OpPing, fmt.Appendf(nil, "p%d", i)) != nil {
						return
					}
					sent.Add(1)
				}
			}()
			defer func() { close(stop); res <- r }()
			for {
				h, pl, err := rc.ReadFrame()
				if err != nil {
					r.err = fmt.Errorf("after %d messages: %w", r.n, err)
					return
				}
				switch h.Op {
				case ws.OpPong:
					if want := fmt.Sprintf("p%d", r.pongs); string(pl) != want {
						r.err = fmt.Errorf("pong %q, want %q", pl, want)
						return
					}
					r.pongs++
					seenPongs.Add(1)
				case ws.OpPing:
					r.pings++
					seenPings.Add(1)
				case ws.OpClose:
					r.atClose = r.n
					rc.WriteClose(talaris.CloseNormal, "")
					return
				default:
					if !h.Fin {
						r.err = fmt.Errorf("message %d fragmented", r.n)
						return
					}
					if err := checkSeqMsg(pl, r.n); err != nil {
						r.err = err
						return
					}
					r.n++
				}
			}
		})
		opts := startWS(t, useTLS, srv.Start, srv.StartTLS)
		p := newTestPool(t, talaris.Config{MaxSendQueue: 128 << 10}, hangGuard)
		c, bg := dialPumped(t, p, srv.URL, opts)
		stopPing := make(chan struct{})
		pingDone := make(chan struct{})
		go func() {
			defer close(pingDone)
			for {
				select {
				case <-stopPing:
					return
				case <-time.After(time.Millisecond):
				}
				if err := c.Ping([]byte("c")); err != nil && !errors.Is(err, talaris.ErrWouldBlock) {
					t.Errorf("Ping: %v", err)
					return
				}
			}
		}()
		// At least minimum messages, and on until the server has seen some
		// of our pongs and pings among them (a fast run could end first).
		buf := make([]byte, 2100)
		total := 0
		deadline := time.Now().Add(hangGuard)
		for ; total < minimum || seenPongs.Load() < 3 || seenPings.Load() < 3; total++ {
			if time.Now().After(deadline) {
				t.Fatalf("after %d messages the server saw %d pongs, %d pings", total, seenPongs.Load(), seenPings.Load())
			}
			if err := sendRetry(c, seqMsg(buf[:100+(total*37)%2000], total)); err != nil {
				t.Fatalf("send %d: %v", total, err)
			}
		}
		close(stopPing)
		<-pingDone
		ds, _ := testhook.DirectSends(c)
		st := c.Stats()
		if err := c.Close(talaris.CloseNormal, "done"); err != nil {
			t.Fatalf("Close: %v", err)
		}
		f := bg.wait(t)
		var r result
		select {
		case r = <-res:
		case <-time.After(hangGuard):
			t.Fatal("server did not finish")
		}
		t.Logf("server: %d messages, %d pongs, %d pings; client stats %+v", r.n, r.pongs, r.pings, st)
		if r.err != nil {
			t.Fatalf("server: %v", r.err)
		}
		if r.n != total || r.atClose != total {
			t.Errorf("server got %d messages (%d before the close), want %d", r.n, r.atClose, total)
		}
		if r.pongs == 0 || r.pings == 0 {
			t.Errorf("pongs %d, pings %d: the control frames were not exercised", r.pongs, r.pings)
		}
		if f == nil || f.Kind != talaris.EventClose {
			t.Errorf("final %+v, want EventClose", f)
		}
		if !useTLS && ds == 0 {
			t.Errorf("no direct sends (stats %+v)", st)
		}
	})
}

// TestDirectSendRacingEnd: goroutines sending small messages (the direct
// path) race Conn.Abort, Conn.Close and Pool.Close from another goroutine,
// against a peer that reads and one that does not: every sender returns
// (ErrClosed or ErrPoolClosed, or ErrWouldBlock while the peer does not
// read), the connection ends with the expected event, and sends after the
// end are refused. Each iteration is the race only if a send ran while the
// end call ran, and, on ws with the reading peer, sends went the direct
// path before the end: it is set up again until both happened (at most 20
// attempts), else the test fails.
func TestDirectSendRacingEnd(t *testing.T) {
	for _, how := range []string{"Abort", "Conn.Close", "Pool.Close"} {
		t.Run(how, func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, useTLS bool) {
				for it := range 4 {
					reading := it%2 == 0
					needDirect := !useTLS && reading // (TLS takes no direct sends)
					const attempts = 20
					var racing, direct int64
					for a := range attempts {
						racing, direct = directRaceOnce(t, useTLS, how, reading)
						if t.Failed() || (racing > 0 && (direct > 0 || !needDirect)) {
							if a > 0 {
								t.Logf("iteration %d: the race happened in attempt %d", it, a+1)
							}
							break
						}
					}
					if t.Failed() {
						return
					}
					if racing == 0 {
						t.Fatalf("iteration %d (reading %v): in %d attempts no send ran while %s ran: the race never happened", it, reading, attempts, how)
					}
					if needDirect && direct == 0 {
						t.Fatalf("iteration %d: in %d attempts no direct send before %s: the direct path never raced the end", it, attempts, how)
					}
				}
			})
		})
	}
}

// directRaceOnce runs one race and returns how many sends ran while the
// end call ran, and how many direct sends the connection had made before.
func directRaceOnce(t *testing.T, useTLS bool, how string, reading bool) (racing, direct int64) {
	s := newSink(t, useTLS, reading, 0)
	p := newTestPool(t, talaris.Config{MaxSendQueue: 64 << 10, CloseTimeout: 300 * time.Millisecond}, hangGuard)
	c := dialSink(t, p, s)
	bg := startPump(t, p, c)
	ended := func(err error) bool {
		return errors.Is(err, talaris.ErrClosed) || errors.Is(err, talaris.ErrPoolClosed)
	}
	var wg sync.WaitGroup
	var directSeen atomic.Int64
	// A send raced the end when it ran while the end call ran: it started
	// before that returned and returned after it started.
	var ending, endDone atomic.Bool
	var raced atomic.Int64
	var inCall atomic.Int32 // senders inside SendBinary
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := make([]byte, 64+g*300)
			for {
				inCall.Add(1)
				early := !endDone.Load()
				err := c.SendBinary(b)
				inCall.Add(-1)
				if early && ending.Load() {
					raced.Add(1)
				}
				switch {
				case err == nil:
				case ended(err):
					return
				case errors.Is(err, talaris.ErrWouldBlock):
					time.Sleep(10 * time.Microsecond)
				default:
					t.Errorf("sender %d: %v", g, err)
					return
				}
				if g == 0 {
					ds, _ := testhook.DirectSends(c)
					directSeen.Store(int64(ds))
				}
			}
		}()
	}
	time.Sleep(time.Duration(3+len(t.Name())%5) * time.Millisecond)
	ds, _ := testhook.DirectSends(c) // (zero once the connection ended)
	direct = max(int64(ds), directSeen.Load())
	// End while a send is in flight (bounded: senders may all be asleep
	// on ErrWouldBlock, or gone if the connection ended).
	for deadline := time.Now().Add(100 * time.Millisecond); inCall.Load() == 0 && time.Now().Before(deadline); {
	}
	ending.Store(true)
	var err error
	switch how {
	case "Abort":
		err = c.Abort()
	case "Conn.Close":
		err = c.Close(talaris.CloseNormal, "")
	default:
		err = p.Close()
	}
	endDone.Store(true)
	if err != nil {
		t.Fatalf("%s: %v", how, err)
	}
	fin := make(chan struct{})
	go func() { wg.Wait(); close(fin) }()
	select {
	case <-fin:
	case <-time.After(hangGuard):
		t.Fatal("senders did not return after the end")
	}
	f := bg.wait(t)
	want := talaris.ErrClosed
	switch how {
	case "Pool.Close":
		want = talaris.ErrPoolClosed
	case "Abort":
		if f == nil || f.Kind != talaris.EventError || !errors.Is(f.Err, talaris.ErrAborted) {
			t.Errorf("final %+v, want EventError ErrAborted", f)
		}
	default:
		if f == nil {
			t.Errorf("no final event")
		}
	}
	if err := c.SendBinary([]byte("late")); !errors.Is(err, want) {
		t.Errorf("SendBinary after the end: %v, want %v", err, want)
	}
	if useTLS && direct != 0 {
		t.Errorf("%d direct sends on a TLS connection", direct)
	}
	return raced.Load(), direct
}

// TestDirectSendReconnect: a sender keeps sending while the server resets
// the connection and the client reconnects (ReconnectPolicy): a frame cut
// by the reset on the old socket is never finished on the new one. The
// second connection's server parses every frame and sees intact messages
// in increasing order.
func TestDirectSendReconnect(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		var conns atomic.Int32
		second := make(chan error, 1)
		var got2 atomic.Int64
		srv := wstest.NewRaw(func(rc *wstest.RawConn) {
			if conns.Add(1) == 1 {
				for i := 0; i < 500; i++ {
					if _, _, err := rc.ReadFrame(); err != nil {
						return
					}
				}
				rc.Reset() // mid-stream: the client has frames on the way
				return
			}
			last := -1
			for {
				op, pl, err := rc.ReadMessage()
				if err != nil {
					second <- fmt.Errorf("after %d messages: %w", got2.Load(), err)
					return
				}
				if op == ws.OpClose {
					rc.WriteClose(talaris.CloseNormal, "")
					second <- nil
					return
				}
				if op != ws.OpBinary {
					continue
				}
				if len(pl) < 8 {
					second <- fmt.Errorf("short message %d bytes", len(pl))
					return
				}
				i := int(binary.LittleEndian.Uint64(pl))
				if err := checkSeqMsg(pl, i); err != nil || i <= last {
					second <- fmt.Errorf("message %d after %d: %v", i, last, err)
					return
				}
				last = i
				got2.Add(1)
			}
		})
		opts := &talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MinDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond}}
		if tlsOn := startWS(t, useTLS, srv.Start, srv.StartTLS); tlsOn != nil {
			opts.TLS = tlsOn.TLS
		}
		p := newTestPool(t, talaris.Config{MaxSendQueue: 64 << 10}, hangGuard)
		c, bg := dialPumped(t, p, srv.URL, opts)
		buf := make([]byte, 9000)
		deadline := time.Now().Add(hangGuard)
		for i := 0; got2.Load() < 2000; i++ {
			if time.Now().After(deadline) {
				t.Fatalf("second connection got %d messages (stats %+v)", got2.Load(), c.Stats())
			}
			err := c.SendBinary(seqMsg(buf[:500+(i*131)%8000], i))
			if errors.Is(err, talaris.ErrWouldBlock) || errors.Is(err, talaris.ErrReconnecting) {
				time.Sleep(50 * time.Microsecond) // (the gap: the next open takes sends again)
			} else if err != nil {
				t.Fatalf("send %d: %v", i, err)
			}
		}
		ds, _ := testhook.DirectSends(c)
		st := c.Stats()
		if err := c.Close(talaris.CloseNormal, ""); err != nil {
			t.Fatalf("Close: %v", err)
		}
		bg.wait(t)
		select {
		case err := <-second:
			if err != nil {
				t.Fatalf("second connection: %v", err)
			}
		case <-time.After(hangGuard):
			t.Fatal("second connection did not end")
		}
		t.Logf("stats %+v", st)
		if st.Reconnects != 1 {
			t.Errorf("reconnects %d, want 1", st.Reconnects)
		}
		if !useTLS && ds == 0 {
			t.Errorf("no direct sends (stats %+v)", st)
		}
	})
}

// TestNoDirectSend: with testhook.Knobs.NoDirectSend every send goes through the
// loop (testhook.DirectSends stays 0) and arrives as before.
func TestNoDirectSend(t *testing.T) {
	s := newSink(t, false, true, 0)
	p := newTestPool(t, testhook.WithKnobs(talaris.Config{}, testhook.Knobs{NoDirectSend: true}), hangGuard)
	c := dialSink(t, p, s)
	buf := make([]byte, 300)
	for i := range 1000 {
		if err := sendRetry(c, seqMsg(buf, i)); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	s.waitCount(t, 1000)
	if ds, _ := testhook.DirectSends(c); ds != 0 {
		t.Errorf("%d direct sends, want none", ds)
	}
	if st := c.Stats(); st.MsgsOut != 1000 {
		t.Errorf("stats %+v: want 1000 messages, none direct", st)
	}
}
