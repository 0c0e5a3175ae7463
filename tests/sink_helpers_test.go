//go:build linux && cgo

package talaris_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// The sink (a raw server that reads and checks sequence-numbered
// messages), filling a send queue, concurrent senders and the close races
// the send tests share.

// sink is a raw WebSocket server that reads once gate is closed (at rate
// bytes/s if rate > 0), checks that messages arrive in order and intact
// (seqMsg), and answers a close frame.
type sink struct {
	srv      *wstest.RawServer
	url      string
	opts     *talaris.DialOptions
	gate     chan struct{}
	stop     chan struct{}
	rate     int
	progress chan struct{}

	mu        sync.Mutex
	n         int   // messages checked
	bytes     int64 // their payload bytes
	err       error
	closeCode int // the client's close code, 0 before it arrived
	atClose   int // messages checked when the close frame arrived
}

// newSink starts a sink; open says whether it reads from the start.
func newSink(t *testing.T, useTLS, open bool, rate int) *sink {
	t.Helper()
	s := &sink{gate: make(chan struct{}), stop: make(chan struct{}), rate: rate, progress: make(chan struct{}, 1)}
	if open {
		close(s.gate)
	}
	s.srv = wstest.NewRaw(s.handle)
	s.opts = startWS(t, useTLS, s.srv.Start, s.srv.StartTLS)
	s.url = s.srv.URL
	t.Cleanup(func() { close(s.stop) }) // runs before the server's Close
	return s
}

func (s *sink) handle(c *wstest.RawConn) {
	defer s.signal()
	select {
	case <-s.gate:
	case <-s.stop:
		return
	}
	if s.rate > 0 {
		c.SetReadRate(s.rate)
	}
	for {
		op, p, err := c.ReadMessage()
		if err != nil {
			s.fail(err)
			return
		}
		switch op {
		case ws.OpClose:
			code, _, _ := ws.ParseClosePayload(p)
			s.mu.Lock()
			s.closeCode, s.atClose = code, s.n
			s.mu.Unlock()
			c.WriteClose(code, "")
			return
		case ws.OpPing, ws.OpPong:
			continue
		}
		s.mu.Lock()
		if s.err == nil {
			s.err = checkSeqMsg(p, s.n)
		}
		s.n++
		s.bytes += int64(len(p))
		s.mu.Unlock()
		s.signal()
	}
}

func (s *sink) signal() {
	select {
	case s.progress <- struct{}{}:
	default:
	}
}

func (s *sink) fail(err error) {
	s.mu.Lock()
	if s.err == nil && s.closeCode == 0 {
		s.err = fmt.Errorf("sink read: %w", err)
	}
	s.mu.Unlock()
}

func (s *sink) state() (n int, bytes int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n, s.bytes, s.err
}

// waitCount waits until n messages have been checked (or one failed).
func (s *sink) waitCount(t *testing.T, n int) {
	t.Helper()
	guard := time.After(hangGuard)
	for {
		got, _, err := s.state()
		if err != nil {
			t.Fatalf("sink after %d messages: %v", got, err)
		}
		if got >= n {
			return
		}
		select {
		case <-s.progress:
		case <-guard:
			t.Fatalf("sink got %d of %d messages within %v", got, n, hangGuard)
		}
	}
}

// waitSendQueuedDrained waits until c's SendQueued reads 0 and returns
// the stats that showed it (or the last ones read, after hangGuard). A
// peer can read a write's last byte before the loop reaps that write's
// completion, which is when the bytes stop counting as queued.
func waitSendQueuedDrained(t *testing.T, c talaris.Conn) talaris.ConnStats {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		st := c.Stats()
		if st.SendQueued == 0 || time.Now().After(deadline) {
			return st
		}
		time.Sleep(time.Millisecond)
	}
}

func dialSink(t *testing.T, p *talaris.Pool, s *sink) talaris.Conn {
	t.Helper()
	ctx, cancel := dialCtx(t)
	defer cancel()
	c, err := p.Dial(ctx, s.url, s.opts)
	if err != nil {
		t.Fatalf("Dial %s: %v", s.url, err)
	}
	return c
}

// forEachTransport runs fn over ws:// and wss://.
func forEachTransport(t *testing.T, fn func(t *testing.T, useTLS bool)) {
	t.Run("ws", func(t *testing.T) {
		skipPlainInTLSOnly(t)
		fn(t, false)
	})
	t.Run("wss", func(t *testing.T) {
		t.Logf("TLS backend %s", talaris.TLSBackend())
		fn(t, true)
	})
}

// closeAndWait closes c and pumps until its final event.
func closeAndWait(t *testing.T, p *talaris.Pool, c talaris.Conn) finalEvent {
	t.Helper()
	if err := c.Close(talaris.CloseNormal, "done"); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return pumpOne(t, p, c, nil)
}

// fillUntilBlocked sends size-byte messages numbered from *next until
// SendBinary refuses one with ErrWouldBlock; *next is then the refused
// message's number.
func fillUntilBlocked(t *testing.T, c talaris.Conn, next *int, size int, limit int) {
	t.Helper()
	buf := make([]byte, size)
	for {
		err := c.SendBinary(seqMsg(buf, *next))
		if errors.Is(err, talaris.ErrWouldBlock) {
			return
		}
		if err != nil {
			t.Fatalf("SendBinary %d: %v", *next, err)
		}
		*next++
		if *next*size > limit {
			t.Fatalf("%d bytes accepted and never ErrWouldBlock (stats %+v)", *next*size, c.Stats())
		}
	}
}

// saturate fills c's queue (fillUntilBlocked) until the socket takes no
// more: the kernel's buffers first absorb a few MiB as the loop writes what
// was accepted, so a queue full at the first refusal empties again. It is
// saturated when the loop has taken every accepted message (MsgsOut) and
// WireOut has not moved over several looks (one look could fall in a
// moment the loop thread was not scheduled, on a loaded machine).
func saturate(t *testing.T, c talaris.Conn, next *int, size int) {
	t.Helper()
	still := 0
	for round := 0; still < 4; round++ {
		fillUntilBlocked(t, c, next, size, 1<<30)
		w := c.Stats().WireOut
		time.Sleep(50 * time.Millisecond)
		if st := c.Stats(); st.WireOut == w && st.MsgsOut == uint64(*next) {
			still++
		} else {
			still = 0
		}
		if round > 400 {
			t.Fatalf("the socket never stopped taking bytes from a peer that does not read (stats %+v)", c.Stats())
		}
	}
}

// runConcurrentSenders runs senders goroutines that each send scaled(2000)
// sequence-numbered messages on one connection through send; the server
// must see every sender's messages complete and in order.
func runConcurrentSenders(t *testing.T, senders int, cfg talaris.Config, send func(c talaris.Conn, ctx context.Context, op talaris.Opcode, b []byte) error) {
	runConcurrentSendersCheck(t, senders, cfg, send, nil)
}

// runConcurrentSendersCheck is runConcurrentSenders; check, if not nil,
// also gets the connection's stats once every message arrived.
func runConcurrentSendersCheck(t *testing.T, senders int, cfg talaris.Config, send func(c talaris.Conn, ctx context.Context, op talaris.Opcode, b []byte) error,
	check func(t *testing.T, st talaris.ConnStats, directSends uint64)) {
	perSender := scaled(2000)
	var mu sync.Mutex
	var recv [][]int
	var bad []string
	var all chan struct{}
	total := 0
	setup := func(srv *wstest.Server) {
		mu.Lock()
		recv, bad, total = make([][]int, senders), nil, 0
		all = make(chan struct{})
		mu.Unlock()
		srv.OnMessage = func(op ws.Opcode, b []byte) {
			mu.Lock()
			defer mu.Unlock()
			g, seq, ok := parseSendPayload(op, b)
			if !ok || g >= senders {
				if len(bad) < 5 {
					bad = append(bad, fmt.Sprintf("op %v len %d", op, len(b)))
				}
			} else {
				recv[g] = append(recv[g], seq)
			}
			total++
			if total == senders*perSender {
				close(all)
			}
		}
	}
	forEachServerSetup(t, setup, func(t *testing.T, srv *wstest.Server) {
		p := newTestPool(t, cfg, hangGuard)
		c := dial(t, p, srv.URL+"/collect")
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		var wg sync.WaitGroup
		for g := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perSender {
					op, b := sendPayload(g, i)
					if err := send(c, ctx, talaris.Opcode(op), b); err != nil {
						t.Errorf("sender %d message %d: %v", g, i, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		mu.Lock()
		done := all
		mu.Unlock()
		select {
		case <-done:
		case <-time.After(hangGuard):
			mu.Lock()
			n := total
			mu.Unlock()
			t.Fatalf("server received %d of %d messages", n, senders*perSender)
		}
		ds, _ := testhook.DirectSends(c)
		st := c.Stats()
		t.Logf("stats %+v", st)
		if check != nil {
			check(t, st, ds)
		}
		if f := closeAndWait(t, p, c); f.Kind != talaris.EventClose {
			t.Errorf("final %+v, want EventClose", f)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(bad) > 0 {
			t.Errorf("corrupt messages: %v", bad)
		}
		for g := range senders {
			if len(recv[g]) != perSender {
				t.Errorf("sender %d: %d messages arrived, want %d", g, len(recv[g]), perSender)
				continue
			}
			for i, s := range recv[g] {
				if s != i {
					t.Errorf("sender %d: message %d has seq %d", g, i, s)
					break
				}
			}
		}
	})
}

// poolEmptied reports whether a blocking pump's err is the end rule's
// ErrNoConns, after a short pause: for a pumper racing Dials or Pool.Close,
// a pool with no connection for a moment is no end, so it pumps again.
func poolEmptied(err error) bool {
	if !errors.Is(err, talaris.ErrNoConns) {
		return false
	}
	time.Sleep(100 * time.Microsecond)
	return true
}

// floodCloseRace pumps p, whose conns flood it, handing every event to
// check (which returns how many messages that connection has delivered).
// Once one has delivered 1000, conns[it%len] is closed and the pool is
// closed (it x 100 us later), each from a goroutine of its own, racing
// the pump; Pump must end with ErrPoolClosed.
func floodCloseRace(t *testing.T, p *talaris.Pool, conns []talaris.Conn, it int, check func(c talaris.Conn, ev talaris.Event) int) {
	t.Helper()
	var once sync.Once
	var wg sync.WaitGroup
	start := func() {
		wg.Add(2)
		go func() { defer wg.Done(); conns[it%len(conns)].Close(1000, "bye") }()
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(it) * 100 * time.Microsecond)
			p.Close()
		}()
	}
	var err error
	for err == nil || errors.Is(err, talaris.ErrNoConns) {
		if err != nil {
			// Every stream ended before the closers ran: once they have,
			// the next Pump says the pool is closed.
			once.Do(start)
			wg.Wait()
		}
		_, err = p.Pump(func(c talaris.Conn, ev talaris.Event) {
			if check(c, ev) >= 1000 {
				once.Do(start)
			}
		})
	}
	wg.Wait()
	if !errors.Is(err, talaris.ErrPoolClosed) {
		t.Errorf("Pump: %v, want ErrPoolClosed", err)
	}
}

// pingPong sends message 0 to an echo server and answers every echo with
// the next message from inside the PumpData callback, until n echoes came
// back in order. It returns the echoes seen and the pump's error.
func pingPong(p *talaris.Pool, c talaris.Conn, n int) (int, error) {
	msg := make([]byte, 64)
	seen := 0
	var bad error
	if err := c.SendBinary(msg); err != nil {
		return 0, err
	}
	for seen < n && bad == nil {
		_, err := p.PumpData(func(cc talaris.Conn, op talaris.Opcode, pl []byte) {
			if cc != c || op != talaris.OpBinary || len(pl) != 64 || binary.LittleEndian.Uint64(pl) != uint64(seen) {
				bad = fmt.Errorf("echo %d: conn %v op %v len %d seq %d", seen, cc == c, op, len(pl), binary.LittleEndian.Uint64(pl))
				return
			}
			seen++
			if seen < n {
				binary.LittleEndian.PutUint64(msg, uint64(seen))
				if err := c.SendBinary(msg); err != nil {
					bad = err
				}
			}
		})
		if err != nil {
			return seen, err
		}
	}
	return seen, bad
}

// pingPongCloseRace ping-pongs on c until another goroutine, after delay,
// closes the Pool (on odd rounds the connection first): the pump must
// return ErrPoolClosed or ErrClosed, and a send and a pump afterwards fail.
func pingPongCloseRace(t *testing.T, p *talaris.Pool, c talaris.Conn, i int, delay time.Duration) {
	t.Helper()
	closed := make(chan struct{})
	go func() {
		time.Sleep(delay)
		if i%2 == 1 {
			c.Close(talaris.CloseNormal, "race")
		}
		p.Close()
		close(closed)
	}()
	_, err := pingPong(p, c, 1<<30)
	if i%2 == 1 && errors.Is(err, talaris.ErrNoConns) {
		err = nil // the connection's Close ended it before Pool.Close ran
	}
	if err != nil && !errors.Is(err, talaris.ErrPoolClosed) && !errors.Is(err, talaris.ErrClosed) {
		t.Fatalf("round %d: ping-pong ended with %v, want ErrPoolClosed or ErrClosed", i, err)
	}
	<-closed
	if err := c.SendBinary([]byte("late")); err == nil {
		t.Fatalf("round %d: send after Close succeeded", i)
	}
	if _, err := p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {}); !errors.Is(err, talaris.ErrPoolClosed) {
		t.Fatalf("round %d: pump after Close: %v", i, err)
	}
}
