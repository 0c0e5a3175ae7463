//go:build linux && cgo

package talaris_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// Send-path tests: per-connection send queues, back-pressure
// (ErrWouldBlock, SendContext), close ordering. The peers are real
// servers on loopback: a raw sink (ws:// and wss://, on whichever TLS
// backend the test binary was built with) that reads when told to, at a
// rate if asked, and checks every message; gorilla and coder for echo and
// /collect. Timeouts are hang guards; the one latency bound (the healthy
// connection's p99) is generous and the measured figure is logged.

// TestConcurrentSends: several goroutines send at once on one connection;
// the server receives every message intact and, per goroutine, in order.
func TestConcurrentSends(t *testing.T) {
	runConcurrentSenders(t, 8, testhook.WithKnobs(talaris.Config{}, testhook.Knobs{CmdRingSize: 1 << 16}), func(c talaris.Conn, _ context.Context, op talaris.Opcode, b []byte) error {
		if op == talaris.OpText {
			return c.SendText(b)
		}
		return c.SendBinary(b)
	})
}

// TestSendTransfer: 1 GiB (256 MiB with -short, 64 MiB with -race) of 16 KiB
// messages through a 64 KiB MaxSendQueue to a peer reading as fast as it
// can arrives complete, in order and intact (SendContext waits for room).
func TestSendTransfer(t *testing.T) {
	total := 1 << 30
	if testing.Short() || raceEnabled {
		total = 256 << 20
	}
	if raceEnabled { // still 4,096 messages through a queue of 4 (92 s of a race run at 256 MiB, load 10)
		total = 64 << 20
	}
	const size = 16 << 10
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		s := newSink(t, useTLS, true, 0)
		p := newTestPool(t, talaris.Config{MaxSendQueue: 64 << 10}, 3*hangGuard)
		c := dialSink(t, p, s)
		ctx, cancel := context.WithTimeout(context.Background(), 3*hangGuard)
		defer cancel()
		n := total / size
		buf := make([]byte, size)
		start := time.Now()
		for i := range n {
			if err := c.SendContext(ctx, talaris.OpBinary, seqMsg(buf, i)); err != nil {
				t.Fatalf("SendContext %d: %v (stats %+v)", i, err, c.Stats())
			}
			if q := c.Stats().SendQueued; q > 64<<10 {
				t.Fatalf("SendQueued %d passed MaxSendQueue 64 KiB", q)
			}
		}
		s.waitCount(t, n)
		el := time.Since(start)
		st := c.Stats()
		t.Logf("%d MiB in %v: %.0f MiB/s; SendQueueFull %d, WireOut %d", total>>20, el.Round(time.Millisecond),
			float64(total>>20)/el.Seconds(), st.SendQueueFull, st.WireOut)
		if _, b, _ := s.state(); b != int64(total) {
			t.Fatalf("sink got %d bytes, want %d", b, total)
		}
		if st.BytesOut != uint64(total) || st.MsgsOut != uint64(n) {
			t.Errorf("stats %+v: want BytesOut %d MsgsOut %d", st, total, n)
		}
		if f := closeAndWait(t, p, c); f.Kind != talaris.EventClose {
			t.Errorf("final %+v, want EventClose", f)
		}
	})
}

// TestSendPeerNotReading: against a peer that does not read, Send*
// accepts about MaxSendQueue (beyond what the kernel buffers), then
// returns ErrWouldBlock at once, every time, without queueing more;
// SendContext waits and returns at its deadline; once the peer reads,
// a waiting SendContext goes on and everything arrives intact.
func TestSendPeerNotReading(t *testing.T) {
	const queue = 1 << 20
	const size = 16 << 10
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		s := newSink(t, useTLS, false, 0)
		p := newTestPool(t, talaris.Config{MaxSendQueue: queue}, hangGuard)
		c := dialSink(t, p, s)
		next := 0
		fillUntilBlocked(t, c, &next, size, 1<<30)
		t.Logf("first ErrWouldBlock after %d KiB (stats %+v)", next*size>>10, c.Stats())
		saturate(t, c, &next, size)
		st := c.Stats()
		t.Logf("accepted %d KiB in all before the socket stopped taking more; stats %+v", next*size>>10, st)
		if st.SendQueued > queue || st.SendQueued == 0 {
			t.Fatalf("SendQueued %d with the queue full, want in (0, %d]", st.SendQueued, queue)
		}
		if st.SendQueueFull < 1 {
			t.Errorf("SendQueueFull %d, want at least 1", st.SendQueueFull)
		}
		// Refused at once and for good: nothing more is taken in, memory
		// stays bounded, other calls do not wait either. (The kernel may
		// still take a little now and then, as it compacts the peer's
		// receive queue, so these use a message as big as the whole
		// queue: refused while anything at all is queued.)
		big := make([]byte, queue)
		var worst time.Duration
		const tries = 2000
		for range tries {
			t0 := time.Now()
			err := c.SendBinary(big)
			if d := time.Since(t0); d > worst {
				worst = d
			}
			if !errors.Is(err, talaris.ErrWouldBlock) {
				t.Fatalf("SendBinary on a full queue: %v, want ErrWouldBlock", err)
			}
		}
		t.Logf("slowest of %d refused sends: %v", tries, worst)
		if worst > time.Second {
			t.Errorf("a refused send took %v: ErrWouldBlock must not wait", worst)
		}
		st2 := c.Stats()
		if st2.SendQueued > st.SendQueued || st2.BytesOut != st.BytesOut || st2.MsgsOut != st.MsgsOut {
			t.Errorf("refused sends changed the queue: %+v then %+v", st, st2)
		}
		if st2.SendQueueFull != st.SendQueueFull+tries {
			t.Errorf("SendQueueFull %d, want %d", st2.SendQueueFull, st.SendQueueFull+tries)
		}
		fillUntilBlocked(t, c, &next, size, 1<<30) // top up whatever the kernel took meanwhile
		if err := c.Ping(make([]byte, 125)); err != nil && !errors.Is(err, talaris.ErrWouldBlock) {
			t.Errorf("Ping on a full queue: %v, want nil or ErrWouldBlock", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err := c.SendContext(ctx, talaris.OpBinary, big)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("SendContext on a full queue: %v, want DeadlineExceeded", err)
		}
		// A cancelled (not timed out) context wakes the waiter too.
		ctx, cancel = context.WithCancel(context.Background())
		time.AfterFunc(20*time.Millisecond, cancel)
		if err := c.SendContext(ctx, talaris.OpBinary, big); !errors.Is(err, context.Canceled) {
			t.Fatalf("SendContext with a cancelled context: %v, want Canceled", err)
		}
		// A waiting sender, then the peer starts reading.
		const more = 200
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			b := make([]byte, size)
			for i := next; i < next+more; i++ {
				if err := c.SendContext(ctx, talaris.OpBinary, seqMsg(b, i)); err != nil {
					done <- fmt.Errorf("SendContext %d: %w", i, err)
					return
				}
			}
			done <- nil
		}()
		time.Sleep(20 * time.Millisecond)
		close(s.gate)
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(hangGuard):
			t.Fatalf("SendContext made no progress after the peer started reading (stats %+v)", c.Stats())
		}
		s.waitCount(t, next+more)
		if f := closeAndWait(t, p, c); f.Kind != talaris.EventClose {
			t.Errorf("final %+v, want EventClose", f)
		}
		if n, _, err := s.state(); n != next+more || err != nil {
			t.Errorf("sink: %d messages (want %d), %v", n, next+more, err)
		}
	})
}

// TestSendSlowReader: a peer reading 1 MiB/s gets everything sent through
// a small queue, intact. 64 MiB through 1 MiB with TALARIS_LONG_TESTS=1
// (about a minute); 4 MiB by default, 2 MiB through 256 KiB with -short
// (the reader's pace, not the library, sets the time).
func TestSendSlowReader(t *testing.T) {
	total, queue := 4<<20, uint64(1<<20)
	if os.Getenv("TALARIS_LONG_TESTS") != "" {
		total = 64 << 20
	} else if testing.Short() {
		total, queue = 2<<20, 256<<10
	}
	const size = 16 << 10
	const rate = 1 << 20
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		if useTLS && total > 8<<20 {
			total = 8 << 20 // the rate, not the transport, sets the time
		}
		s := newSink(t, useTLS, true, rate)
		guard := time.Duration(total/rate)*2*time.Second + hangGuard
		p := newTestPool(t, talaris.Config{MaxSendQueue: queue}, guard)
		c := dialSink(t, p, s)
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		start := time.Now()
		buf := make([]byte, size)
		var worstQueued uint64
		for i := range total / size {
			if err := c.SendContext(ctx, talaris.OpBinary, seqMsg(buf, i)); err != nil {
				t.Fatalf("SendContext %d: %v", i, err)
			}
			worstQueued = max(worstQueued, c.Stats().SendQueued)
		}
		s.waitCount(t, total/size)
		el := time.Since(start)
		t.Logf("%d MiB to a 1 MiB/s reader in %v; SendQueued at most %d; SendQueueFull %d", total>>20,
			el.Round(time.Millisecond), worstQueued, c.Stats().SendQueueFull)
		if worstQueued > queue {
			t.Errorf("SendQueued reached %d, MaxSendQueue is %d", worstQueued, queue)
		}
		if f := closeAndWait(t, p, c); f.Kind != talaris.EventClose {
			t.Errorf("final %+v, want EventClose", f)
		}
	})
}

// TestSendConcurrentSenders: 16 goroutines send numbered messages (some
// large enough to be fragmented) through one connection with a 64 KiB
// queue, waiting with SendContext; the server sees every sender's
// messages complete and in order.
func TestSendConcurrentSenders(t *testing.T) {
	runConcurrentSenders(t, 16, testhook.WithKnobs(talaris.Config{MaxSendQueue: 64 << 10}, testhook.Knobs{CmdRingSize: 1 << 16}), talaris.Conn.SendContext)
}

// TestSendStuckBesideHealthy: one connection whose peer stopped reading,
// its queue full and a SendContext waiting on it, does not touch another
// connection of the same Pool: the healthy one's echo round trips all
// complete, in order, while the stuck one stays stuck (its queue full,
// its sender waiting: they never waited for it to drain; the round trip's
// p50/p99 are logged, a figure: BenchmarkSendBesideStuck measures it), a
// new Dial and the healthy Close complete, and the stuck one's Close ends it within
// CloseTimeout, returning its waiting sender ErrClosed. With Loops 2 the
// stuck connection and the healthy one live on different loop threads.
func TestSendStuckBesideHealthy(t *testing.T) {
	for _, loops := range []int{1, 2} {
		t.Run(fmt.Sprintf("loops%d", loops), func(t *testing.T) { testSendStuckBesideHealthy(t, loops) })
	}
}

func testSendStuckBesideHealthy(t *testing.T, loops int) {
	const closeTimeout = time.Second
	stuckSrv := newSink(t, false, false, 0)
	echo := wstest.NewGorilla().Start(t)
	p := newTestPool(t, talaris.Config{MaxSendQueue: 1 << 20, CloseTimeout: closeTimeout, Loops: loops}, hangGuard)
	stuck := dialSink(t, p, stuckSrv)
	next := 0
	saturate(t, stuck, &next, 16<<10)
	waiter := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		defer cancel()
		// As big as the whole queue: it waits while anything is queued.
		waiter <- stuck.SendContext(ctx, talaris.OpBinary, seqMsg(make([]byte, 1<<20), next))
	}()
	healthy := dial(t, p, echo.URL+"/echo")
	if ls, lh := testhook.ConnLoop(p, stuck.Slot()), testhook.ConnLoop(p, healthy.Slot()); loops > 1 && ls == lh {
		t.Fatalf("stuck and healthy connections both on loop %d of %d: a dial picks the least loaded loop", ls, loops)
	}

	rounds := 1000
	if testing.Short() || raceEnabled {
		rounds = 200
	}
	rtts := make([]time.Duration, 0, rounds)
	msg := make([]byte, 64)
	for k := range rounds {
		binary.LittleEndian.PutUint64(msg, uint64(k))
		t0 := time.Now()
		if err := healthy.SendBinary(msg); err != nil {
			t.Fatalf("healthy SendBinary %d: %v", k, err)
		}
		got := false
		pumpUntil(t, p, func(c talaris.Conn, ev talaris.Event) {
			if c == healthy && ev.Kind == talaris.EventBinary && len(ev.Payload) == 64 &&
				binary.LittleEndian.Uint64(ev.Payload) == uint64(k) {
				got = true
			}
		}, func() bool { return got }, nil)
		rtts = append(rtts, time.Since(t0))
	}
	slices.Sort(rtts)
	p50, p99 := rtts[len(rtts)/2], rtts[len(rtts)*99/100]
	t.Logf("healthy echo round trip beside a stuck connection: p50 %v p99 %v max %v (%d rounds)",
		p50, p99, rtts[len(rtts)-1], rounds)
	// Every round trip above completed while the stuck connection stayed
	// stuck: still open, its queue not drained, its sender still waiting.
	if st := stuck.Stats(); st.SendQueued == 0 || stuck.State() != talaris.StateOpen {
		t.Errorf("the stuck connection drained or ended during the healthy round trips: state %v, stats %+v", stuck.State(), st)
	}
	select {
	case err := <-waiter:
		t.Fatalf("SendContext on the stuck connection returned during the healthy round trips: %v", err)
	default:
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	third, err := p.Dial(ctx, echo.URL+"/echo", nil)
	cancel()
	if err != nil {
		t.Fatalf("Dial beside a stuck connection: %v", err)
	}
	select {
	case err := <-waiter:
		t.Fatalf("SendContext on the stuck connection returned early: %v", err)
	default:
	}
	fw := watchFreezes(t)
	t0 := time.Now()
	for _, c := range []talaris.Conn{healthy, third, stuck} {
		if err := c.Close(talaris.CloseNormal, ""); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	finals := map[talaris.Conn]finalEvent{}
	pumpUntil(t, p, func(c talaris.Conn, ev talaris.Event) {
		if ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError {
			finals[c] = copyFinal(ev)
		}
	}, func() bool { return len(finals) == 3 }, nil)
	el := time.Since(t0)
	t.Logf("three Closes (the stuck one with a full queue) done in %v; stuck final %+v", el, finals[stuck])
	if fw.Running(el) > closeTimeout+2*time.Second {
		t.Errorf("Closes took %v (process frozen for %v of it), CloseTimeout is %v", el, el-fw.Running(el), closeTimeout)
	}
	for _, c := range []talaris.Conn{healthy, third} {
		if f := finals[c]; f.Kind != talaris.EventClose {
			t.Errorf("healthy final %+v, want EventClose", f)
		}
	}
	select {
	case err := <-waiter:
		if !errors.Is(err, talaris.ErrClosed) {
			t.Errorf("waiting SendContext after Close: %v, want ErrClosed", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("a SendContext waiting on a closed connection did not return")
	}
}

// BenchmarkSendBesideStuck: the echo round trip of a connection beside
// one of the same Pool whose peer stopped reading (its queue full): the
// figure TestSendStuckBesideHealthy logs but does not assert. ns/op is
// the mean round trip; p50-ns and p99-ns its percentiles.
func BenchmarkSendBesideStuck(b *testing.B) {
	gate := make(chan struct{})
	stuckSrv := wstest.NewRaw(func(*wstest.RawConn) { <-gate }).Start(b) // never reads
	b.Cleanup(func() { close(gate) })
	echo := wstest.NewGorilla().Start(b)
	p := newTestPool(b, talaris.Config{MaxSendQueue: 1 << 20, CloseTimeout: time.Second}, hangGuard)
	stuck := dial(b, p, stuckSrv.URL+"/")
	// Fill its queue until the socket takes no more: refused at once
	// again after a pause in which the loop could have written.
	big := make([]byte, 64<<10)
	for refused := 0; refused < 3; {
		err := stuck.SendBinary(big)
		switch {
		case errors.Is(err, talaris.ErrWouldBlock):
			refused++
			time.Sleep(50 * time.Millisecond)
		case err != nil:
			b.Fatal(err)
		default:
			refused = 0
		}
	}
	healthy := dial(b, p, echo.URL+"/echo")
	msg := make([]byte, 64)
	rtts := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for k := range b.N {
		binary.LittleEndian.PutUint64(msg, uint64(k))
		t0 := time.Now()
		if err := healthy.SendBinary(msg); err != nil {
			b.Fatal(err)
		}
		got := false
		pumpUntil(b, p, func(c talaris.Conn, ev talaris.Event) {
			if c == healthy && ev.Kind == talaris.EventBinary && len(ev.Payload) == 64 &&
				binary.LittleEndian.Uint64(ev.Payload) == uint64(k) {
				got = true
			}
		}, func() bool { return got }, nil)
		rtts = append(rtts, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(rtts)
	b.ReportMetric(float64(rtts[len(rtts)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(rtts[len(rtts)*99/100].Nanoseconds()), "p99-ns")
	if st := stuck.Stats(); st.SendQueued == 0 {
		b.Fatalf("the stuck connection drained: %+v", st)
	}
}

// TestSendCloseWithQueued: Close keeps what it accepted. With 60 MiB
// queued, if the peer then reads, every message arrives, in order, before
// the close frame, the handshake completes cleanly and nothing is counted
// dropped. If it never reads, the connection ends at its close timeout
// (DialOptions.CloseTimeout, shorter than the pool's) with
// ErrCloseTimeout, and the final event, ConnStats and Metrics count the
// messages that never reached the socket.
func TestSendCloseWithQueued(t *testing.T) {
	const poolTimeout, dialTimeout = 30 * time.Second, 2 * time.Second
	const size = 1 << 20
	for _, reads := range []bool{true, false} {
		name := "peer-reads-after-close"
		if !reads {
			name = "peer-never-reads"
		}
		t.Run(name, func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, useTLS bool) {
				s := newSink(t, useTLS, false, 0)
				p := newTestPool(t, talaris.Config{MaxSendQueue: 64 << 20, CloseTimeout: poolTimeout}, hangGuard)
				var opts talaris.DialOptions
				if s.opts != nil {
					opts = *s.opts
				}
				if !reads {
					opts.CloseTimeout = dialTimeout
				}
				ctx, cancel := dialCtx(t)
				defer cancel()
				c, err := p.Dial(ctx, s.url, &opts)
				if err != nil {
					t.Fatalf("Dial: %v", err)
				}
				buf := make([]byte, size)
				i := 0
				for c.Stats().SendQueued < 60<<20 {
					if err := c.SendBinary(seqMsg(buf, i)); err != nil {
						t.Fatalf("SendBinary %d: %v (stats %+v)", i, err, c.Stats())
					}
					i++
				}
				queued := c.Stats().SendQueued
				fw := watchFreezes(t)
				t0 := time.Now()
				if err := c.Close(talaris.CloseNormal, "bye"); err != nil {
					t.Fatalf("Close: %v", err)
				}
				if err := c.SendBinary(buf[:10]); !errors.Is(err, talaris.ErrClosed) {
					t.Errorf("SendBinary after Close: %v, want ErrClosed", err)
				}
				if reads {
					close(s.gate)
				}
				f := pumpOne(t, p, c, nil)
				el := time.Since(t0)
				n, b, err := s.state()
				dropped := p.Metrics().SendDropped
				t.Logf("%d MiB queued (%d messages); Close to final event %v (%+v); peer read %d messages (%d MiB) before the close; %d dropped",
					queued>>20, i, el.Round(time.Millisecond), f, n, b>>20, dropped)
				if !reads {
					if !errors.Is(f.Err, talaris.ErrCloseTimeout) {
						t.Errorf("final %+v, want ErrCloseTimeout", f)
					}
					if fw.Running(el) > dialTimeout+time.Second {
						t.Errorf("Close took %v (process frozen for %v of it), DialOptions.CloseTimeout is %v", el, el-fw.Running(el), dialTimeout)
					}
					if f.SendDropped == 0 || f.SendDropped > uint64(i) || dropped != f.SendDropped {
						t.Errorf("final event SendDropped %d, Metrics.SendDropped %d; want the same count in 1..%d", f.SendDropped, dropped, i)
					}
					if !strings.Contains(f.Err.Error(), "queued messages dropped") {
						t.Errorf("final error %q does not say messages were dropped", f.Err)
					}
					return
				}
				if f.Kind != talaris.EventClose || f.Code != talaris.CloseNormal || f.SendDropped != 0 || dropped != 0 {
					t.Errorf("final %+v (Metrics.SendDropped %d), want EventClose 1000 and nothing dropped", f, dropped)
				}
				if err != nil {
					t.Errorf("sink: %v", err)
				}
				s.mu.Lock()
				code, at := s.closeCode, s.atClose
				s.mu.Unlock()
				if code != talaris.CloseNormal || at != i || n != i {
					t.Errorf("sink saw close %d after %d messages (read %d); %d were accepted before Close", code, at, n, i)
				}
			})
		})
	}
}

// TestSendRacingClose: senders (SendBinary, SendContext, Ping, Pong) race
// Conn.Close or Pool.Close from other goroutines. No panic, no hang; every
// error is ErrClosed, ErrPoolClosed or ErrWouldBlock; after the end every
// send returns ErrClosed (or ErrPoolClosed after Pool.Close). Each
// iteration is the race only if a send got in and a send ran while the
// close ran: it is set up again until both happened (at most 20
// attempts), else the test fails.
func TestSendRacingClose(t *testing.T) {
	iters := 6
	if testing.Short() || raceEnabled {
		iters = 2
	}
	for _, poolClose := range []bool{false, true} {
		name := "Conn.Close"
		if poolClose {
			name = "Pool.Close"
		}
		t.Run(name, func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, useTLS bool) {
				for it := range iters {
					const attempts = 20
					var raced int64
					for a := range attempts {
						if raced = raceOnce(t, useTLS, poolClose, it%2 == 0); raced > 0 || t.Failed() {
							if a > 0 {
								t.Logf("iteration %d: the race happened in attempt %d", it, a+1)
							}
							break
						}
					}
					if raced == 0 && !t.Failed() {
						t.Fatalf("iteration %d (reading %v): in %d attempts no send ran while %s ran: the race never happened", it, it%2 == 0, attempts, name)
					}
				}
			})
		})
	}
}

// raceOnce runs one race and returns how many sends ran while the close
// ran (0 when no send got in at all).
func raceOnce(t *testing.T, useTLS, poolClose, reading bool) int64 {
	s := newSink(t, useTLS, reading, 0)
	p := newTestPool(t, talaris.Config{MaxSendQueue: 256 << 10, CloseTimeout: 300 * time.Millisecond}, hangGuard)
	c := dialSink(t, p, s)
	ended := func(err error) bool {
		return errors.Is(err, talaris.ErrClosed) || errors.Is(err, talaris.ErrPoolClosed)
	}
	var wg sync.WaitGroup
	var sent atomic.Int64
	// A send raced the close when it ran while the close ran: it started
	// before the close returned and returned after the close started.
	var closing, closed atomic.Bool
	var racing atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := make([]byte, 4096+g*1000)
			for {
				var err error
				early := !closed.Load()
				switch g % 4 {
				case 0:
					err = c.SendBinary(b)
				case 1:
					err = c.SendContext(ctx, talaris.OpBinary, b)
				case 2:
					err = c.Ping(b[:8])
				default:
					err = c.Pong(b[:8])
				}
				if early && closing.Load() {
					racing.Add(1)
				}
				switch {
				case err == nil:
					sent.Add(1)
				case ended(err):
					return
				case errors.Is(err, talaris.ErrWouldBlock):
					time.Sleep(10 * time.Microsecond)
				default:
					t.Errorf("sender %d: %v", g, err)
					return
				}
			}
		}()
	}
	time.Sleep(time.Duration(5+len(t.Name())%7) * time.Millisecond)
	closer := make(chan error, 1)
	go func() {
		closing.Store(true)
		var err error
		if poolClose {
			err = p.Close()
		} else {
			err = c.Close(talaris.CloseNormal, "")
		}
		closed.Store(true)
		closer <- err
	}()
	fin := make(chan struct{})
	go func() { wg.Wait(); close(fin) }()
	select {
	case <-fin:
	case <-time.After(hangGuard):
		t.Fatal("senders did not return after Close")
	}
	if err := <-closer; err != nil {
		t.Fatalf("close: %v", err)
	}
	want := talaris.ErrClosed
	if poolClose {
		want = talaris.ErrPoolClosed
	} else {
		pumpOne(t, p, c, nil) // the final event: the connection has ended
	}
	if err := c.SendText([]byte("late")); !errors.Is(err, want) {
		t.Errorf("SendText after the end: %v, want %v", err, want)
	}
	if err := c.SendContext(ctx, talaris.OpText, []byte("late")); !errors.Is(err, want) {
		t.Errorf("SendContext after the end: %v, want %v", err, want)
	}
	if err := c.Ping(nil); !errors.Is(err, want) {
		t.Errorf("Ping after the end: %v, want %v", err, want)
	}
	if err := c.Close(talaris.CloseNormal, ""); !errors.Is(err, want) {
		t.Errorf("Close after the end: %v, want %v", err, want)
	}
	if sent.Load() == 0 {
		return 0 // no send got in at all: not the race
	}
	return racing.Load()
}

// TestSendValidation: SendText refuses invalid UTF-8 and SendContext a
// non-data opcode, before anything reaches the wire: the server's first
// message is the valid one sent after them.
func TestSendValidation(t *testing.T) {
	srv := wstest.NewGorilla()
	got := make(chan []byte, 4)
	srv.OnMessage = func(op ws.Opcode, b []byte) { got <- b }
	srv.Start(t)
	p := newTestPool(t, talaris.Config{}, hangGuard)
	c := dial(t, p, srv.URL+"/collect")
	bad := []byte("ok \xff\xfe")
	if err := c.SendText(bad); !errors.Is(err, talaris.ErrInvalidUTF8) {
		t.Errorf("SendText(invalid UTF-8): %v, want ErrInvalidUTF8", err)
	}
	if err := c.SendContext(context.Background(), talaris.OpText, bad); !errors.Is(err, talaris.ErrInvalidUTF8) {
		t.Errorf("SendContext(OpText, invalid UTF-8): %v, want ErrInvalidUTF8", err)
	}
	if err := c.SendContext(context.Background(), talaris.Opcode(9), []byte("x")); !errors.Is(err, talaris.ErrInvalidOpcode) {
		t.Errorf("SendContext(opcode 9): %v, want ErrInvalidOpcode", err)
	}
	if err := c.SendBinary(bad); err != nil {
		t.Errorf("SendBinary of the same bytes: %v", err)
	}
	select {
	case b := <-got:
		if !bytes.Equal(b, bad) {
			t.Errorf("server's first message %q, want the binary %q", b, bad)
		}
	case <-time.After(hangGuard):
		t.Fatal("nothing arrived")
	}
	if f := closeAndWait(t, p, c); f.Kind != talaris.EventClose {
		t.Errorf("final %+v", f)
	}
}

// TestSendPongFloodBounded: a peer that sends pings without end and never
// reads our pongs cannot make the loop queue replies without bound: once
// the pongs waiting pass MaxSendQueue the loop stops reading the
// connection, so the peer's writes block long before it has written 64
// MiB of pings (ws and wss).
func TestSendPongFloodBounded(t *testing.T) {
	const limit = 64 << 20
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		written := make(chan int64, 1)
		srv := wstest.NewRaw(func(c *wstest.RawConn) {
			var batch []byte
			for range 512 {
				batch = ws.AppendFrame(batch, true, ws.OpPing, bytes.Repeat([]byte{'p'}, 125))
			}
			var n int64
			for n < limit {
				c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
				if err := c.Write(batch); err != nil {
					break // blocked for a second: the client stopped reading
				}
				n += int64(len(batch))
			}
			written <- n
		})
		opts := startWS(t, useTLS, srv.Start, srv.StartTLS)
		p := newTestPool(t, talaris.Config{MaxSendQueue: 256 << 10, CloseTimeout: 300 * time.Millisecond}, hangGuard)
		ctx, cancel := dialCtx(t)
		defer cancel()
		c, err := p.Dial(ctx, srv.URL, opts)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		var pings int
		pumpUntil(t, p, func(_ talaris.Conn, ev talaris.Event) {
			if ev.Kind == talaris.EventPing {
				pings++
			}
		}, func() bool {
			select {
			case n = <-written:
				return true
			default:
				return false
			}
		}, nil)
		t.Logf("the peer wrote %d KiB of pings before blocking; %d pings delivered, stats %+v", n>>10, pings, c.Stats())
		if n >= limit {
			t.Fatalf("the peer wrote %d MiB of pings without blocking: replies are not bounded", n>>20)
		}
		if st := c.State(); st != talaris.StateOpen {
			t.Errorf("state %v after the flood, want open", st)
		}
	})
}

// TestSendBeforeOpen: messages sent right after DialAsync, before the
// upgrade completes, are queued and go out in order once it does (ws and
// wss).
func TestSendBeforeOpen(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		s := newSink(t, useTLS, true, 0)
		p := newTestPool(t, talaris.Config{}, hangGuard)
		c, err := p.DialAsync(s.url, s.opts)
		if err != nil {
			t.Fatal(err)
		}
		const n = 50
		st := c.State()
		for i := range n {
			if err := c.SendBinary(seqMsg(make([]byte, 100+i*300), i)); err != nil {
				t.Fatalf("SendBinary %d before open: %v", i, err)
			}
		}
		t.Logf("state at the first send: %v", st)
		opened := false
		pumpUntil(t, p, func(_ talaris.Conn, ev talaris.Event) {
			if ev.Kind == talaris.EventOpen {
				opened = true
			}
			if ev.Kind == talaris.EventError {
				t.Fatalf("dial failed: %v", ev.Err)
			}
		}, func() bool { return opened }, nil)
		s.waitCount(t, n)
		if f := closeAndWait(t, p, c); f.Kind != talaris.EventClose {
			t.Errorf("final %+v, want EventClose", f)
		}
	})
}

// TestSendAfterPeerClose: once the peer's close frame has arrived (the
// loop answered it; the connection is closing) sends return ErrClosed
// rather than being accepted and dropped.
func TestSendAfterPeerClose(t *testing.T) {
	release := make(chan struct{})
	srv := wstest.NewRaw(func(c *wstest.RawConn) {
		c.WriteClose(4001, "bye")
		c.ExpectClose()
		<-release // keep TCP open: the client stays in StateClosing
	}).Start(t)
	defer close(release)
	p := newTestPool(t, talaris.Config{CloseTimeout: 500 * time.Millisecond}, hangGuard)
	c := dial(t, p, srv.URL)
	for i := 0; c.State() != talaris.StateClosing; i++ {
		if i > 10000 {
			t.Fatalf("state %v, want closing", c.State())
		}
		time.Sleep(time.Millisecond)
	}
	if err := c.SendText([]byte("late")); !errors.Is(err, talaris.ErrClosed) {
		t.Errorf("SendText while closing: %v, want ErrClosed", err)
	}
	if err := c.SendContext(context.Background(), talaris.OpText, []byte("late")); !errors.Is(err, talaris.ErrClosed) {
		t.Errorf("SendContext while closing: %v, want ErrClosed", err)
	}
	if err := c.Ping(nil); !errors.Is(err, talaris.ErrClosed) {
		t.Errorf("Ping while closing: %v, want ErrClosed", err)
	}
	if st := c.Stats(); st.MsgsOut != 0 || st.SendQueued != 0 {
		t.Errorf("stats %+v: nothing should have been queued", st)
	}
}

// TestSendInjectBacklogDoesNotBlock: a memory connection's injected input
// that waits for the pump (the event ring is full, nobody pumps) does not
// hold up another connection's dial and sends; once pumped, every
// injected message arrives in order.
func TestSendInjectBacklogDoesNotBlock(t *testing.T) {
	srv := wstest.NewGorilla()
	got := make(chan []byte, 4)
	srv.OnMessage = func(op ws.Opcode, b []byte) { got <- b }
	srv.Start(t)
	p := newTestPool(t, testhook.WithKnobs(talaris.Config{}, testhook.Knobs{EventRingSize: 256}), hangGuard)
	m, err := p.DialMemory()
	if err != nil {
		t.Fatal(err)
	}
	const n = 20000
	var stream []byte
	for i := range n {
		stream = ws.AppendFrame(stream, true, ws.OpBinary, wstest.Payload(i, 16))
	}
	if err := m.Inject(stream); err != nil {
		t.Fatal(err)
	}
	c := dial(t, p, srv.URL+"/collect") // its DIAL follows the INJECT in the ring
	if err := c.SendText([]byte("through")); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		if string(b) != "through" {
			t.Fatalf("server got %q", b)
		}
	case <-time.After(hangGuard):
		t.Fatal("a send waited behind another connection's injected backlog")
	}
	t.Logf("memory connection backlog while unpumped: SendQueued %d", m.Stats().SendQueued)
	chk := wstest.NewChecker(16)
	count := 0
	pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
		if cc == m && ev.Kind == talaris.EventBinary {
			if err := chk.Check(ev.Payload); err != nil && count < 3 {
				t.Errorf("message %d: %v", count, err)
			}
			count++
		}
	}, func() bool { return count == n }, nil)
	if q := m.Stats().SendQueued; q != 0 {
		t.Errorf("SendQueued %d after everything was pumped", q)
	}
}

// TestControlBeforeOpen: a ping or pong before the upgrade completes is
// refused with ErrWouldBlock (only data messages wait for the open), not
// accepted and dropped; once open, the same Ping goes out and its pong
// comes back.
func TestControlBeforeOpen(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// Accepts and answers the upgrade only when told: the connection
	// stays before open until then.
	answer := make(chan struct{})
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		<-answer
		key, err := readRequest(nc)
		if err != nil {
			return
		}
		if upgrade(nc, key) != nil {
			return
		}
		// Answer one ping with its pong, then wait for the close.
		var buf [256]byte
		n, _ := nc.Read(buf[:])
		if n >= 6 && buf[0]&0x0F == 0x9 {
			plen := int(buf[1] & 0x7F)
			payload := make([]byte, plen)
			for i := 0; i < plen && 6+i < n; i++ {
				payload[i] = buf[6+i] ^ buf[2+i%4]
			}
			nc.Write(append([]byte{0x8A, byte(plen)}, payload...))
		}
		nc.Read(buf[:])
	}()
	p := newTestPool(t, talaris.Config{CloseTimeout: 200 * time.Millisecond}, hangGuard)
	c, err := p.DialAsync("ws://"+ln.Addr().String()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Ping([]byte("early")); !errors.Is(err, talaris.ErrWouldBlock) {
		t.Errorf("Ping before open: %v, want ErrWouldBlock", err)
	}
	if err := c.Pong(nil); !errors.Is(err, talaris.ErrWouldBlock) {
		t.Errorf("Pong before open: %v, want ErrWouldBlock", err)
	}
	if s := c.Stats(); s.SendQueueFull != 0 || s.SendQueued != 0 {
		t.Errorf("after refused control frames: SendQueueFull %d, SendQueued %d; want 0, 0", s.SendQueueFull, s.SendQueued)
	}
	close(answer)
	opened, pong := false, false
	pumpUntil(t, p, func(_ talaris.Conn, ev talaris.Event) {
		switch ev.Kind {
		case talaris.EventOpen:
			opened = true
			if err := c.Ping([]byte("now")); err != nil {
				t.Errorf("Ping once open: %v", err)
			}
		case talaris.EventPong:
			pong = string(ev.Payload) == "now"
		case talaris.EventError:
			t.Fatalf("dial failed: %v", ev.Err)
		}
	}, func() bool { return opened && pong }, nil)
	c.Abort()
}
