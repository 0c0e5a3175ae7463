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
)

// Receive fairness (testhook.Knobs.MaxConnPendingEvents/Bytes): one event ring
// carries every connection's messages in arrival order, so a flood must
// not be able to queue more than its share ahead of another connection's
// message, nor keep that message out of the ring. These tests pin
// Loops: 1: the holds they check are per loop (a connection alone on its
// loop is never held); TestLoopsFairAcrossLoops covers several loops.

// defaultConnPendingEvents is testhook.Knobs.MaxConnPendingEvents's documented
// default.
const defaultConnPendingEvents = 256

// TestFairShareFloodBesideEcho: two connections flood a pool (n 64-byte
// messages each) beside an echo connection. Nobody pumps at first: each
// flood stops at its share of the ring (its MsgsIn never passes it) while
// the ring has room for far more, and an order sent on the echo
// connection is still delivered to the ring (the floods being held never
// stalls it). Then the pump runs, slowly: fewer than the floods' shares
// are passed before the echo, every round. Finally every flood message
// arrives, complete and in order, and each flood ends with its close.
func TestFairShareFloodBesideEcho(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		for _, share := range []uint32{0, 64} {
			t.Run(fmt.Sprintf("share=%d", share), func(t *testing.T) { fairFloodBesideEcho(t, useTLS, share) })
		}
	})
}

func fairFloodBesideEcho(t *testing.T, useTLS bool, share uint32) {
	srv, opts := fairServer(t, useTLS)
	p := newTestPool(t, testhook.WithKnobs(talaris.Config{Loops: 1}, testhook.Knobs{MaxConnPendingEvents: share}), hangGuard)
	limit := uint64(share)
	if share == 0 {
		limit = defaultConnPendingEvents
	}
	n := scaled(200000)
	o, floods, chk := dialEchoFloods(t, p, srv, opts, n)
	state := func() string {
		return fmt.Sprintf("echo %+v, floods %+v %+v, pool %+v", o.Stats(), floods[0].Stats(), floods[1].Stats(), testhook.Stats(p))
	}
	// Unpumped: each flood fills its share and is held there.
	waitFor(t, "floods held at their share", func() bool {
		return testhook.Stats(p).FairHolds >= 2 && floods[0].Stats().MsgsIn > 0 && floods[1].Stats().MsgsIn > 0
	}, state)
	time.Sleep(20 * time.Millisecond) // give an unfair loop time to overfill
	for _, f := range floods {
		// (its EventOpen, also unconsumed, is part of its share)
		if got := f.Stats().MsgsIn; got > limit {
			t.Fatalf("flood delivered %d messages to the ring with none consumed; its share is %d (%s)", got, limit, state())
		}
	}

	var echoes, aheadMax int
	var ahead int
	opened := 0
	closed := map[talaris.Conn]bool{}
	var done bool
	fn := func(c talaris.Conn, ev talaris.Event) {
		switch {
		case ev.Kind == talaris.EventOpen:
			opened++
		case c == o && ev.Kind == talaris.EventBinary:
			if seq := binary.LittleEndian.Uint64(ev.Payload); int(seq) != echoes {
				t.Errorf("echo %d carries order %d", echoes, seq)
			}
			echoes++
			aheadMax = max(aheadMax, ahead)
			done = true
		case ev.Kind == talaris.EventBinary:
			if !done { // (the pump call that delivers the echo may hand out later flood messages after it)
				ahead++
			}
			if err := chk[c].Check(ev.Payload); err != nil {
				t.Fatal(err)
			}
		case ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError:
			if c == o || ev.Kind != talaris.EventClose || chk[c].Count() != n {
				t.Errorf("%v on conn %d (%v) after %d messages", ev.Kind, c.Slot(), ev.Err, chk[c].Count())
			}
			closed[c] = true
		}
	}
	rounds := 8
	echoRounds(t, p, o, rounds, fn, &ahead, &done, func(int) int { return 2 * int(limit) }, state)
	if echoes != rounds || opened != 3 {
		t.Fatalf("%d echoes of %d orders, %d opens of 3", echoes, rounds, opened)
	}
	// The rest of both floods, complete and in order.
	pumpUntil(t, p, fn, func() bool { return closed[floods[0]] && closed[floods[1]] }, nil)
	for _, f := range floods {
		if chk[f].Count() != n {
			t.Fatalf("flood got %d of %d messages", chk[f].Count(), n)
		}
	}
	if testhook.Stats(p).FairHolds == 0 {
		t.Fatalf("no fair holds counted (%s)", state())
	}
	t.Logf("most flood messages ahead of an echo: %d (share %d); %s", aheadMax, limit, state())
}

// dialEchoFloods dials an echo connection, then two that each stream n
// 64-byte messages, with a checker per flood.
func dialEchoFloods(t *testing.T, p *talaris.Pool, srv *wstest.Server, opts *talaris.DialOptions, n int) (talaris.Conn, []talaris.Conn, map[talaris.Conn]*wstest.Checker) {
	t.Helper()
	ctx, cancel := dialCtx(t)
	defer cancel()
	o, err := p.Dial(ctx, srv.URL+"/echo", opts)
	if err != nil {
		t.Fatal(err)
	}
	floods := make([]talaris.Conn, 2)
	chk := map[talaris.Conn]*wstest.Checker{}
	for i := range floods {
		if floods[i], err = p.Dial(ctx, fmt.Sprintf("%s/stream?n=%d&size=64", srv.URL, n), opts); err != nil {
			t.Fatal(err)
		}
		chk[floods[i]] = wstest.NewChecker(64)
	}
	return o, floods, chk
}

// echoRounds sends rounds orders on o, one at a time. Each echo must
// reach the ring while nothing is pumped (the floods being held never
// stalls it); then a slow pump (a pause per batch, so the floods keep to
// their share) runs until fn sets *done on the echo, and at most limit(r)
// flood messages (fn counts them in *ahead while *done is false: the
// Pump call that delivers the echo may hand out flood messages after it)
// may pass before it.
func echoRounds(t *testing.T, p *talaris.Pool, o talaris.Conn, rounds int, fn talaris.EventFunc, ahead *int, done *bool,
	limit func(r int) int, state func() string) {
	t.Helper()
	order := make([]byte, 16)
	for r := 0; r < rounds; r++ {
		binary.LittleEndian.PutUint64(order, uint64(r))
		if err := o.SendBinary(order); err != nil {
			t.Fatalf("order %d: %v", r, err)
		}
		waitFor(t, fmt.Sprintf("echo %d delivered to the ring while nothing is pumped", r),
			func() bool { return o.Stats().MsgsIn == uint64(r+1) }, state)
		*ahead, *done = 0, false
		pumpUntil(t, p, fn, func() bool { return *done }, func() { time.Sleep(50 * time.Microsecond) })
		if *ahead > limit(r) {
			t.Fatalf("round %d: %d flood messages passed before the echo; at most %d may be ahead (%s)",
				r, *ahead, limit(r), state())
		}
	}
}

// TestFairShareLoneConn: a connection alone on its pool keeps the whole
// ring (nobody's message can wait behind it): unpumped, it goes far past
// its share and is never held.
func TestFairShareLoneConn(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	p := newTestPool(t, testhook.WithKnobs(talaris.Config{Loops: 1}, testhook.Knobs{MaxConnPendingEvents: 64, EventRingSize: 4096}), hangGuard)
	ctx, cancel := dialCtx(t)
	defer cancel()
	f, err := p.Dial(ctx, srv.URL+"/stream?n=100000&size=64", nil)
	if err != nil {
		t.Fatal(err)
	}
	state := func() string { return fmt.Sprintf("flood %+v, pool %+v", f.Stats(), testhook.Stats(p)) }
	// (Far past its share; how far depends on how many messages each
	// receive slot, held by its in-place payloads, happens to carry.)
	waitFor(t, "a lone flood passes its share", func() bool { return f.Stats().MsgsIn >= 8*64 }, state)
	if h := testhook.Stats(p).FairHolds; h != 0 {
		t.Fatalf("a lone connection was held %d times (%s)", h, state())
	}
	chk := wstest.NewChecker(64)
	final := pumpOne(t, p, f, func(ev talaris.Event) {
		if ev.Kind == talaris.EventBinary {
			if err := chk.Check(ev.Payload); err != nil {
				t.Fatal(err)
			}
		}
	})
	if final.Kind != talaris.EventClose || chk.Count() != 100000 {
		t.Fatalf("final %+v after %d messages", final, chk.Count())
	}
}

// TestFairShareCloseRace: Pool.Close and Conn.Close from other goroutines
// while two floods are held at their share (nobody pumps, or a slow pump
// runs): every call returns, the calls racing Close return nil or the
// documented errors, and nothing hangs.
func TestFairShareCloseRace(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		for i := range 4 {
			poolClose, pumping := i&1 != 0, i&2 != 0
			fairCloseRace(t, useTLS, poolClose, pumping)
		}
	})
}

func fairCloseRace(t *testing.T, useTLS, poolClose, pumping bool) {
	srv, opts := fairServer(t, useTLS)
	p := newTestPool(t, testhook.WithKnobs(talaris.Config{CloseTimeout: 500 * time.Millisecond, Loops: 1}, testhook.Knobs{MaxConnPendingEvents: 32}), hangGuard)
	ctx, cancel := dialCtx(t)
	defer cancel()
	o, err := p.Dial(ctx, srv.URL+"/echo", opts)
	if err != nil {
		t.Fatal(err)
	}
	var floods []talaris.Conn
	for range 2 {
		f, err := p.Dial(ctx, srv.URL+"/stream?n=1000000&size=64", opts)
		if err != nil {
			t.Fatal(err)
		}
		floods = append(floods, f)
	}
	waitFor(t, "floods held", func() bool { return testhook.Stats(p).FairHolds >= 2 },
		func() string { return fmt.Sprintf("%+v", testhook.Stats(p)) })
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	if pumping {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				_, err := p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) { time.Sleep(time.Microsecond) })
				if errors.Is(err, talaris.ErrPoolClosed) || errors.Is(err, talaris.ErrNoConns) {
					return
				}
				if err != nil {
					errc <- fmt.Errorf("PumpData: %w", err)
					return
				}
			}
		}()
	}
	for _, c := range append([]talaris.Conn{o}, floods...) {
		wg.Add(1)
		go func(c talaris.Conn) {
			defer wg.Done()
			if err := c.Close(talaris.CloseNormal, "bye"); err != nil && !errors.Is(err, talaris.ErrPoolClosed) && !errors.Is(err, talaris.ErrClosed) {
				errc <- fmt.Errorf("Conn.Close: %w", err)
			}
			if err := c.SendText([]byte("late")); err == nil {
				errc <- errors.New("SendText after Close returned nil")
			}
			_ = c.Stats()
			_ = c.State()
		}(c)
	}
	if poolClose {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := p.Close(); err != nil {
				errc <- fmt.Errorf("Pool.Close: %w", err)
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	// (Pool.Close also ends the held floods' close handshakes that Conn.Close
	// began: they are bounded by CloseTimeout.)
	if err := p.Close(); err != nil {
		t.Fatalf("Pool.Close: %v", err)
	}
	if _, err := p.Pump(func(talaris.Conn, talaris.Event) {}); !errors.Is(err, talaris.ErrPoolClosed) {
		t.Fatalf("Pump after Close: %v", err)
	}
	for _, c := range append([]talaris.Conn{o}, floods...) {
		if s := c.State(); s != talaris.StateClosed {
			t.Fatalf("state after Pool.Close: %v", s)
		}
	}
}

// TestFairShareBytes: the byte share (MaxConnPendingBytes). Unpumped, a
// flood of 64 KiB messages stops at 256 KiB in the ring while an echo
// beside it still gets in; a flood of 1 MiB messages, each larger than the
// share, gets one message at a time into the ring (a lone message always
// goes). Pumped, every message arrives whole and in order.
func TestFairShareBytes(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		for _, size := range []int{64 << 10, 1 << 20} {
			t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) { fairBytes(t, useTLS, size) })
		}
	})
}

func fairBytes(t *testing.T, useTLS bool, size int) {
	const share = 256 << 10
	srv, opts := fairServer(t, useTLS)
	p := newTestPool(t, testhook.WithKnobs(talaris.Config{Loops: 1}, testhook.Knobs{MaxConnPendingBytes: share}), hangGuard)
	n := 64
	if testing.Short() {
		// Still 4 shares (64 KiB) or 16 messages larger than a share (1
		// MiB): the hold comes at the first share; the rest is volume,
		// 16 s of the race run for the 1 MiB wss flood at 64.
		n = 16
	}
	ctx, cancel := dialCtx(t)
	defer cancel()
	o, err := p.Dial(ctx, srv.URL+"/echo", opts)
	if err != nil {
		t.Fatal(err)
	}
	f, err := p.Dial(ctx, fmt.Sprintf("%s/stream?n=%d&size=%d", srv.URL, n, size), opts)
	if err != nil {
		t.Fatal(err)
	}
	state := func() string {
		return fmt.Sprintf("echo %+v, flood %+v, pool %+v", o.Stats(), f.Stats(), testhook.Stats(p))
	}
	waitFor(t, "flood held at its byte share", func() bool { return testhook.Stats(p).FairHolds >= 1 }, state)
	time.Sleep(20 * time.Millisecond) // give an unfair loop time to overfill
	want := uint64(share)
	if size > share {
		want = uint64(size) // one message larger than the share goes alone
	}
	if got := f.Stats().BytesIn; got > want || got == 0 {
		t.Fatalf("flood put %d bytes in the ring with none consumed; its share is %d bytes of %d-byte messages (%s)",
			got, share, size, state())
	}
	if err := o.SendText([]byte("order")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "echo delivered to the ring beside a flood held at its byte share",
		func() bool { return o.Stats().MsgsIn == 1 }, state)
	chk := wstest.NewChecker(size)
	var echoed, closed bool
	pumpUntil(t, p, func(c talaris.Conn, ev talaris.Event) {
		switch {
		case c == o && ev.Kind == talaris.EventText:
			echoed = string(ev.Payload) == "order"
		case c == f && ev.Kind == talaris.EventBinary:
			if err := chk.Check(ev.Payload); err != nil {
				t.Fatal(err)
			}
		case c == f && (ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError):
			if ev.Kind != talaris.EventClose || chk.Count() != n {
				t.Errorf("flood ended with %v (%v) after %d of %d messages", ev.Kind, ev.Err, chk.Count(), n)
			}
			closed = true
		}
	}, func() bool { return echoed && closed }, func() { time.Sleep(50 * time.Microsecond) })
}

// TestFairShareFloodsAlone: floods are held at their share only while a
// light connection (one that is not itself flooding) could have a message
// wait behind them, or while a quarter of the ring is pending. Two floods
// beside an echo connection stop at their share (nobody pumps); once the
// echo connection closes they go on, past their shares, up to the pressure
// bound (EventRingSize/4 events pending) and no further. A new echo
// connection then has them held at their share again: after the backlog
// it found, at most two shares pass before each of its echoes. Every flood
// message arrives, complete and in order.
func TestFairShareFloodsAlone(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) { fairFloodsAlone(t, useTLS) })
}

func fairFloodsAlone(t *testing.T, useTLS bool) {
	const share, ring = 64, 4096
	const press = ring / 4
	srv, opts := fairServer(t, useTLS)
	p := newTestPool(t, testhook.WithKnobs(talaris.Config{}, testhook.Knobs{MaxConnPendingEvents: share, EventRingSize: ring}), hangGuard)
	n := scaled(100000)
	o, floods, chk := dialEchoFloods(t, p, srv, opts, n)
	inRing := func() uint64 { return floods[0].Stats().MsgsIn + floods[1].Stats().MsgsIn }
	state := func() string {
		return fmt.Sprintf("floods %+v %+v, pool %+v", floods[0].Stats(), floods[1].Stats(), testhook.Stats(p))
	}
	waitFor(t, "floods held at their share beside the echo connection", func() bool {
		return testhook.Stats(p).FairHolds >= 2 && floods[0].Stats().MsgsIn > 0 && floods[1].Stats().MsgsIn > 0
	}, state)
	time.Sleep(20 * time.Millisecond)
	if got := inRing(); got > 2*share {
		t.Fatalf("%d flood messages in the ring beside a light connection; shares are %d each (%s)", got, share, state())
	}

	// The echo connection goes: nobody is left to wait behind the floods.
	if err := o.Close(talaris.CloseNormal, "bye"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "floods past their shares once alone", func() bool { return inRing() >= 4*share }, state)
	time.Sleep(30 * time.Millisecond) // several epochs: time to overfill
	if got := inRing(); got > press+2*share {
		t.Fatalf("%d flood messages in the ring unpumped; the pressure bound is %d (+ a share each) (%s)", got, press, state())
	}

	// A light connection comes: the floods keep to their shares again.
	ctx, cancel := dialCtx(t)
	defer cancel()
	o2, err := p.Dial(ctx, srv.URL+"/echo", opts)
	if err != nil {
		t.Fatal(err)
	}
	var echoes, ahead int
	var done bool
	closed := map[talaris.Conn]bool{}
	fn := func(c talaris.Conn, ev talaris.Event) {
		switch {
		case c == o2 && ev.Kind == talaris.EventBinary:
			if seq := binary.LittleEndian.Uint64(ev.Payload); int(seq) != echoes {
				t.Errorf("echo %d carries order %d", echoes, seq)
			}
			echoes++
			done = true
		case c == o && ev.Kind == talaris.EventBinary:
			t.Errorf("a message on the closed echo connection")
		case ev.Kind == talaris.EventBinary:
			if !done { // (the pump call that delivers the echo may hand out later flood messages after it)
				ahead++
			}
			if err := chk[c].Check(ev.Payload); err != nil {
				t.Fatal(err)
			}
		case c != o && (ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError):
			if c == o2 || ev.Kind != talaris.EventClose || chk[c].Count() != n {
				t.Errorf("%v on conn %d (%v) after %d messages", ev.Kind, c.Slot(), ev.Err, chk[c].Count())
			}
			closed[c] = true
		}
	}
	echoRounds(t, p, o2, 6, fn, &ahead, &done, func(r int) int {
		if r == 0 {
			return press + 2*share // the backlog the floods built while alone
		}
		return 2 * share
	}, state)
	pumpUntil(t, p, fn, func() bool { return closed[floods[0]] && closed[floods[1]] }, nil)
	for _, f := range floods {
		if chk[f].Count() != n {
			t.Fatalf("flood got %d of %d messages", chk[f].Count(), n)
		}
	}
}

// TestStalledConnDoesNotStarveOthers: a connection flooding a pool that
// nobody pumps fills the event ring and stalls; it must not hold the whole
// shared buffer ring, so a second connection's blocking Dial still
// completes (its 101 needs a buffer slot to be read).
func TestStalledConnDoesNotStarveOthers(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	p, err := talaris.NewPool(testhook.WithKnobs(talaris.Config{BufSize: 4096, BufCount: 64}, testhook.Knobs{EventRingSize: 256}))
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
		st := testhook.Stats(p)
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
		t.Fatalf("second dial behind a stalled flood: %v (stats %+v)", err, testhook.Stats(p))
	}
	if second.State() != talaris.StateOpen || flood.State() != talaris.StateOpen {
		t.Fatalf("states: flood %v second %v", flood.State(), second.State())
	}
}
