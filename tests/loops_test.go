//go:build linux && cgo

package talaris_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"golang.org/x/sys/unix"
)

// Config.Loops > 1: connections sharded across several loop threads, one
// pump draining them all. (The whole suite also runs sharded with
// TALARIS_TEST_LOOPS=2; TestHandoffCgoCalls, TestPumpAllocs,
// TestPoolCloseRace (Pool.Close racing Dial, sends, Close, Abort, Ping,
// Stats and the pump on connections of every loop) and
// TestSendStuckBesideHealthy have Loops entries.)

// TestLoopsSpread: with Loops 2 and 3, over ws and wss, connections made
// by Dial and DialAsync spread evenly over the loops and each keeps its
// order and content (a /stream checked per connection, pings answered);
// one memory connection per loop delivers what Inject fed it in order;
// OnEvent, Stats, Metrics (with sampling) and the Prometheus output count
// every loop's traffic; once every connection ended, PumpData returns
// ErrNoConns.
func TestLoopsSpread(t *testing.T) {
	plain := wstest.NewGorilla().Start(t)
	secure := wstest.NewGorilla().StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
	for _, loops := range []int{2, 3} {
		for _, tc := range []struct {
			name, base string
			opts       *talaris.DialOptions
		}{{"ws", plain.URL, nil}, {"wss", secure.URL, tlsOpts}} {
			t.Run(fmt.Sprintf("%s-loops%d", tc.name, loops), func(t *testing.T) {
				testLoopsSpread(t, loops, tc.base, tc.opts)
			})
		}
	}
}

func testLoopsSpread(t *testing.T, loops int, base string, opts *talaris.DialOptions) {
	const perLoop = 3
	var opens, finalsOnEvent int
	cfg := talaris.Config{Name: "shard", Loops: loops, MaxConns: 32, SampleEvery: 8, OnEvent: func(_ talaris.Conn, ev talaris.Event) {
		switch ev.Kind {
		case talaris.EventOpen:
			opens++
		case talaris.EventClose, talaris.EventError:
			finalsOnEvent++
		}
	}}
	p := newTestPool(t, cfg, hangGuard)
	states := map[talaris.Conn]*streamState{}
	onLoop := make([]int, loops)
	var wantMsgs uint64
	for i := range perLoop * loops {
		spec := streamSpec{n: scaled(20000), size: 8 + 5*i, text: i%2 == 1}
		if i%3 == 2 {
			spec.frag, spec.ping = 3, true
		}
		var c talaris.Conn
		var err error
		if i%2 == 0 {
			ctx, cancel := dialCtx(t)
			c, err = p.Dial(ctx, base+spec.path(), opts)
			cancel()
		} else {
			c, err = p.DialAsync(base+spec.path(), opts)
		}
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		onLoop[testhook.ConnLoop(p, c.Slot())]++
		states[c] = newStreamState(spec)
		wantMsgs += uint64(spec.n)
	}
	for l, n := range onLoop {
		if n != perLoop {
			t.Fatalf("connections per loop %v: want %d on each (loop %d has %d)", onLoop, perLoop, l, n)
		}
	}
	// One memory connection per loop (the loops are equally loaded, so
	// each DialMemory lands on the next one), fed frames in order.
	const memN = 300
	frames, wantSum := memFrames(memN)
	mems := map[talaris.Conn]*memState{}
	memLoops := map[int]bool{}
	for range loops {
		m, err := p.DialMemory()
		if err != nil {
			t.Fatal(err)
		}
		memLoops[testhook.ConnLoop(p, m.Slot())] = true
		mems[m] = &memState{}
		if err := m.Inject(frames); err != nil {
			t.Fatalf("Inject: %v", err)
		}
		wantMsgs += memN
	}
	if len(memLoops) != loops {
		t.Fatalf("memory connections on loops %v, want one on each of %d", memLoops, loops)
	}

	finals := 0
	memDone := 0
	pumpUntil(t, p, func(c talaris.Conn, ev talaris.Event) {
		if m := mems[c]; m != nil {
			if m.on(t, ev) && m.n == memN {
				memDone++
				if m.sum != wantSum {
					t.Errorf("memory connection: id sum %d, want %d", m.sum, wantSum)
				}
				if err := c.Abort(); err != nil {
					t.Errorf("Abort of a memory connection: %v", err)
				}
			}
			if ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError {
				finals++
			}
			return
		}
		st := states[c]
		if st == nil {
			t.Errorf("event %v for unknown connection slot %d", ev.Kind, c.Slot())
			return
		}
		st.on(ev)
		if st.final != nil && (ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError) {
			finals++
		}
	}, func() bool { return finals == len(states)+len(mems) }, nil)
	for c, st := range states {
		st.verify(t, fmt.Sprintf("slot %d on loop %d %v", c.Slot(), testhook.ConnLoop(p, c.Slot()), st.spec))
	}
	if memDone != loops {
		t.Errorf("%d memory connections delivered all %d messages, want %d", memDone, memN, loops)
	}
	if opens != 0 || finalsOnEvent != 0 {
		t.Errorf("OnEvent called %d/%d times while Pump had a callback", opens, finalsOnEvent)
	}

	m := p.Metrics()
	s := testhook.Stats(p)
	t.Logf("stats %+v; metrics messages %d samples %d", s, m.Messages, m.Sampled)
	if m.Messages != wantMsgs {
		t.Errorf("Metrics.Messages %d, want %d (every loop's)", m.Messages, wantMsgs)
	}
	if s.Events < wantMsgs {
		t.Errorf("Stats.Events %d, fewer than the %d messages", s.Events, wantMsgs)
	}
	if m.Sampled == 0 {
		t.Errorf("no sampled message recorded (SampleEvery 8)")
	}
	var prom bytes.Buffer
	if err := p.WritePrometheus(&prom); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("talaris_messages_total{pool=\"shard\"} %d", wantMsgs); !strings.Contains(prom.String(), want) {
		t.Errorf("Prometheus output lacks %q:\n%s", want, prom.String())
	}

	// Every connection ended: PumpData says so instead of sleeping, also
	// with several loops' rings to look at.
	if _, err := p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {}); !errors.Is(err, talaris.ErrNoConns) {
		t.Errorf("PumpData after every final event: %v, want ErrNoConns", err)
	}
}

// memState follows a memory connection fed memFrames.
type memState struct {
	n   int
	sum uint64
}

// on counts a data event of memFrames (in order: message i carries id i)
// and reports whether it was one.
func (m *memState) on(t *testing.T, ev talaris.Event) bool {
	var id uint64
	switch ev.Kind {
	case talaris.EventBinary:
		for k := range min(8, len(ev.Payload)) {
			id |= uint64(ev.Payload[k]) << (8 * k)
		}
	case talaris.EventText:
		if _, err := fmt.Sscanf(string(ev.Payload), `{"id":%d}`, &id); err != nil {
			t.Errorf("memory connection: text %q: %v", ev.Payload, err)
		}
	default:
		return false
	}
	if id != uint64(m.n) {
		t.Errorf("memory connection: message %d carries id %d (out of order)", m.n, id)
	}
	m.n++
	m.sum += id
	return true
}

// TestLoopsCloseInCallback: Pool.Close called inside a callback while
// other loops still have events pending: the pump returns ErrPoolClosed
// at once, without handing out the other loops' events.
func TestLoopsCloseInCallback(t *testing.T) {
	p := newTestPool(t, talaris.Config{Loops: 3, MaxConns: 16}, hangGuard)
	frames, _ := memFrames(50)
	var conns []talaris.Conn
	for range 3 {
		c, err := p.DialMemory()
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		if err := c.Inject(frames); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(20 * time.Millisecond) // let every loop publish
	calls := 0
	_, err := p.Pump(func(talaris.Conn, talaris.Event) {
		calls++
		if calls == 10 {
			if err := p.Close(); err != nil {
				t.Errorf("Close in a callback: %v", err)
			}
		}
	})
	if !errors.Is(err, talaris.ErrPoolClosed) {
		t.Errorf("Pump whose callback closed the pool: %v, want ErrPoolClosed", err)
	}
	if _, err := p.Pump(func(talaris.Conn, talaris.Event) {}); !errors.Is(err, talaris.ErrPoolClosed) {
		t.Errorf("Pump after Close: %v", err)
	}
	if calls >= 2*51 {
		t.Errorf("%d callbacks after Close in the 10th: the pump went on to the other loops", calls)
	}
}

// TestLoopsConfig: Loops and LoopCPUs are checked.
func TestLoopsConfig(t *testing.T) {
	for _, cfg := range []talaris.Config{
		{Loops: -1}, {Loops: 65}, {Loops: 3, MaxConns: 2}, {Loops: 2, LoopCPUs: []int{0, 0, 0}},
	} {
		if p, err := talaris.NewPool(cfg); !errors.Is(err, talaris.ErrInvalidConfig) {
			if err == nil {
				p.Close()
			}
			t.Errorf("NewPool(Loops %d, MaxConns %d, LoopCPUs %v): %v, want ErrInvalidConfig",
				cfg.Loops, cfg.MaxConns, cfg.LoopCPUs, err)
		}
	}
	p, err := talaris.NewPool(talaris.Config{Loops: 2, LoopCPUs: []int{0, -1}, MaxConns: 4})
	if err != nil {
		t.Fatalf("NewPool with LoopCPUs: %v", err)
	}
	defer p.Close()
	// MaxConns holds across loops: 4 connections, then ErrTooManyConns.
	for i := range 5 {
		_, err := p.DialMemory()
		if i < 4 && err != nil {
			t.Fatalf("DialMemory %d: %v", i, err)
		}
		if i == 4 && !errors.Is(err, talaris.ErrTooManyConns) {
			t.Errorf("DialMemory past MaxConns: %v, want ErrTooManyConns", err)
		}
	}
}

// TestLoopsFairAcrossLoops: a flood alone on its loop is never held there
// (the loop's holds count only its own connections), so unpumped it fills
// far past its share; an order echoed on another loop still waits behind
// at most one share of it (testhook.Knobs.MaxConnPendingEvents), because the pump
// takes at most a share from each loop per pass. The flood ends complete
// and in order.
func TestLoopsFairAcrossLoops(t *testing.T) {
	forEachTransport(t, func(t *testing.T, useTLS bool) {
		const share = 64
		srv, opts := fairServer(t, useTLS)
		p := newTestPool(t, testhook.WithKnobs(talaris.Config{Loops: 2}, testhook.Knobs{MaxConnPendingEvents: share}), hangGuard)
		n := scaled(100000)
		ctx, cancel := dialCtx(t)
		defer cancel()
		// The flood first: loop 0, which the pump passes over first.
		f, err := p.Dial(ctx, fmt.Sprintf("%s/stream?n=%d&size=64", srv.URL, n), opts)
		if err != nil {
			t.Fatal(err)
		}
		o, err := p.Dial(ctx, srv.URL+"/echo", opts)
		if err != nil {
			t.Fatal(err)
		}
		if lf, lo := testhook.ConnLoop(p, f.Slot()), testhook.ConnLoop(p, o.Slot()); lf == lo {
			t.Fatalf("flood and echo both on loop %d", lf)
		}
		state := func() string {
			return fmt.Sprintf("flood %+v, echo %+v, pool %+v", f.Stats(), o.Stats(), testhook.Stats(p))
		}
		waitFor(t, "a flood alone on its loop passes its share", func() bool { return f.Stats().MsgsIn >= 8*share }, state)
		chk := wstest.NewChecker(64)
		order := make([]byte, 16)
		var ahead, echoes int
		var done, closed bool
		fn := func(c talaris.Conn, ev talaris.Event) {
			switch {
			case c == o && ev.Kind == talaris.EventBinary:
				if seq := binary.LittleEndian.Uint64(ev.Payload); int(seq) != echoes {
					t.Errorf("echo %d carries order %d", echoes, seq)
				}
				echoes++
				done = true
			case c == f && ev.Kind == talaris.EventBinary:
				if !done { // (the pump call that delivers the echo may hand out later flood messages after it)
					ahead++
				}
				if err := chk.Check(ev.Payload); err != nil {
					t.Fatal(err)
				}
			case c == f && (ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError):
				if ev.Kind != talaris.EventClose || chk.Count() != n {
					t.Errorf("flood %v (%v) after %d of %d messages", ev.Kind, ev.Err, chk.Count(), n)
				}
				closed = true
			}
		}
		for r := range 4 {
			binary.LittleEndian.PutUint64(order, uint64(r))
			if err := o.SendBinary(order); err != nil {
				t.Fatalf("order %d: %v", r, err)
			}
			waitFor(t, fmt.Sprintf("echo %d delivered to its loop's ring", r),
				func() bool { return o.Stats().MsgsIn == uint64(r+1) }, state)
			ahead, done = 0, false
			pumpUntil(t, p, fn, func() bool { return done }, nil)
			// (+2: the two EventOpens in the first pass)
			if ahead > share+2 {
				t.Fatalf("round %d: %d flood messages from the other loop passed before the echo; at most one share (%d) may (%s)",
					r, ahead, share, state())
			}
		}
		pumpUntil(t, p, fn, func() bool { return closed }, nil)
		t.Logf("%s", state())
	})
}

// TestLoopsPinning: LoopCPUs pins loop i to LoopCPUs[i] (-1 and loops past
// its end unpinned); with LoopCPUs empty, LoopCPU pins loop 0 only. Read
// back with sched_getaffinity on the new talaris-loop threads.
func TestLoopsPinning(t *testing.T) {
	if runtime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs")
	}
	for _, tc := range []struct {
		cfg  talaris.Config
		want []string // the new loop threads' CPU sets, sorted
	}{
		{talaris.Config{Loops: 3, LoopCPUs: []int{1, 0}}, []string{"[0]", "[1]", "all"}},
		{talaris.Config{Loops: 3, LoopCPUs: []int{-1, 1}}, []string{"[1]", "all", "all"}},
		{talaris.Config{Loops: 2, LoopCPUs: []int{1}}, []string{"[1]", "all"}},
		{talaris.Config{Loops: 2}, []string{"all", "all"}},
	} {
		before := loopTids(t)
		p, err := talaris.NewPool(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for tid := range loopTids(t) {
			if before[tid] {
				continue
			}
			var set unix.CPUSet
			if err := unix.SchedGetaffinity(tid, &set); err != nil {
				t.Fatal(err)
			}
			var cpus []int
			for c := range runtime.NumCPU() {
				if set.IsSet(c) {
					cpus = append(cpus, c)
				}
			}
			s := fmt.Sprint(cpus)
			if len(cpus) == runtime.NumCPU() {
				s = "all"
			}
			got = append(got, s)
		}
		p.Close()
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("Loops %d LoopCPUs %v: new loop threads pinned %v, want %v",
				tc.cfg.Loops, tc.cfg.LoopCPUs, got, tc.want)
		}
	}
}

// TestLoopsCloseStuckInParallel: Pool.Close with a stuck connection (its
// peer stopped reading, its queue full, so its close handshake runs to
// CloseTimeout) on each of three loops returns in about one CloseTimeout,
// not three: the loops stop at once. (A bound on the behaviour, generous:
// in turn it would take at least 3 x CloseTimeout.)
func TestLoopsCloseStuckInParallel(t *testing.T) {
	const closeTimeout = 2 * time.Second
	p := newTestPool(t, talaris.Config{Loops: 3, MaxSendQueue: 1 << 20, CloseTimeout: closeTimeout}, hangGuard)
	loops := map[int]bool{}
	for range 3 {
		c := dialSink(t, p, newSink(t, false, false, 0))
		loops[testhook.ConnLoop(p, c.Slot())] = true
		next := 0
		saturate(t, c, &next, 16<<10)
	}
	if len(loops) != 3 {
		t.Fatalf("stuck connections on loops %v, want one on each of 3", loops)
	}
	fw := watchFreezes(t)
	t0 := time.Now()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	el := time.Since(t0)
	t.Logf("Pool.Close with a stuck connection on each of 3 loops: %v (CloseTimeout %v)", el, closeTimeout)
	if fw.Running(el) >= 3*closeTimeout-200*time.Millisecond { // (a freeze of the test process is not the loops')
		t.Errorf("Pool.Close took %v: the loops stopped in turn (CloseTimeout %v each)", el, closeTimeout)
	}
}
