//go:build linux && cgo

package talaris_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/talaris-go/talaris"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// Integration tests against real peers (gorilla/websocket and
// coder/websocket servers on loopback). Nothing here is timed: timeouts are
// hang guards only, generous because the machine is small and shared.

const hangGuard = 60 * time.Second

type serverKind struct {
	name string
	new  func() *wstest.Server
}

var serverKinds = []serverKind{{"gorilla", wstest.NewGorilla}, {"coder", wstest.NewCoder}}

// forEachServer runs fn as a subtest per server library.
func forEachServer(t *testing.T, fn func(t *testing.T, srv *wstest.Server)) {
	forEachServerSetup(t, nil, fn)
}

// forEachServerSetup is forEachServer with setup run on the server before
// it starts (so its fields are set before any server goroutine runs).
func forEachServerSetup(t *testing.T, setup func(srv *wstest.Server), fn func(t *testing.T, srv *wstest.Server)) {
	for _, k := range serverKinds {
		t.Run(k.name, func(t *testing.T) {
			srv := k.new()
			if setup != nil {
				setup(srv)
			}
			srv.Start(t)
			fn(t, srv)
			if errs := srv.Errors(); len(errs) > 0 {
				t.Errorf("server errors: %v", errs)
			}
		})
	}
}

// testLoops is TALARIS_TEST_LOOPS (0, the default, when unset).
var testLoops, _ = strconv.Atoi(os.Getenv("TALARIS_TEST_LOOPS"))

// scaled returns n, or n/10 under -short.
func scaled(n int) int {
	if testing.Short() {
		return max(n/10, 1)
	}
	return n
}

// newTestPool makes a pool that is closed at the end of the test, and that
// is closed early by a hang guard (so a blocked Pump returns) if the test
// runs for more than d.
//
// TALARIS_TEST_LOOPS=N gives every such pool that does not set
// Config.Loops N loop threads: the whole suite then runs sharded.
func newTestPool(t testing.TB, cfg talaris.Config, d time.Duration) *talaris.Pool {
	t.Helper()
	if cfg.Loops == 0 && !cfg.InlineLoop { // (an inline loop is one loop)
		cfg.Loops = testLoops
	}
	p, err := talaris.NewPool(cfg)
	if err != nil {
		t.Fatalf("NewPool(%+v): %v", cfg, err)
	}
	tm := time.AfterFunc(d, func() {
		t.Errorf("hang guard: test still running after %v; closing the pool (stats %+v)", d, p.Stats())
		p.Close()
	})
	t.Cleanup(func() {
		tm.Stop()
		p.Close()
	})
	return p
}

func dialCtx(t testing.TB) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 60*time.Second)
}

// finalEvent is a copy of a connection's last event.
type finalEvent struct {
	Kind   talaris.EventKind
	Code   int
	Reason string
	Err    error
}

func copyFinal(ev talaris.Event) finalEvent {
	return finalEvent{Kind: ev.Kind, Code: ev.Code, Reason: string(ev.Reason), Err: ev.Err}
}

// streamSpec is one /stream request and what to expect from it.
type streamSpec struct {
	n, size, frag int
	text, ping    bool
}

func (s streamSpec) op() ws.Opcode {
	if s.text {
		return ws.OpText
	}
	return ws.OpBinary
}

func (s streamSpec) path() string {
	op := "binary"
	if s.text {
		op = "text"
	}
	q := fmt.Sprintf("/stream?n=%d&size=%d&op=%s", s.n, s.size, op)
	if s.frag > 1 {
		q += "&frag=" + strconv.Itoa(s.frag)
	}
	if s.ping {
		q += "&ping=1"
	}
	return q
}

func (s streamSpec) String() string {
	k := "bin"
	if s.text {
		k = "text"
	}
	r := fmt.Sprintf("%s_n%d_size%d", k, s.n, s.size)
	if s.frag > 1 {
		r += fmt.Sprintf("_frag%d", s.frag)
	}
	if s.ping {
		r += "_ping"
	}
	return r
}

func (s streamSpec) checker() *wstest.Checker {
	if s.text {
		return wstest.NewTextChecker(s.size)
	}
	return wstest.NewChecker(s.size)
}

// wantPings is the number of pings the server interleaves.
func (s streamSpec) wantPings() int {
	switch {
	case !s.ping:
		return 0
	case s.frag > 1:
		return s.n * (s.frag - 1)
	}
	return s.n
}

// streamState tracks one connection's stream while pumping.
type streamState struct {
	spec    streamSpec
	chk     *wstest.Checker
	err     error // first integrity error
	opened  bool
	pings   int
	pingErr error
	final   *finalEvent
}

func newStreamState(s streamSpec) *streamState {
	return &streamState{spec: s, chk: s.checker()}
}

// on handles one event of the stream's connection.
func (st *streamState) on(ev talaris.Event) {
	switch ev.Kind {
	case talaris.EventOpen:
		if st.opened && st.err == nil {
			st.err = errors.New("second EventOpen")
		}
		st.opened = true
	case talaris.EventText, talaris.EventBinary:
		if st.err != nil {
			return
		}
		if !st.opened {
			st.err = errors.New("data before EventOpen")
			return
		}
		want := talaris.EventBinary
		if st.spec.text {
			want = talaris.EventText
		}
		if ev.Kind != want {
			st.err = fmt.Errorf("message %d: kind %v, want %v", st.chk.Count(), ev.Kind, want)
			return
		}
		st.err = st.chk.Check(ev.Payload)
	case talaris.EventPing:
		// The ping before/inside message i carries "p<i>", i being the
		// message being received (= messages checked so far).
		want := "p" + strconv.Itoa(st.chk.Count())
		if string(ev.Payload) != want && st.pingErr == nil {
			st.pingErr = fmt.Errorf("ping %d: payload %q, want %q", st.pings, ev.Payload, want)
		}
		st.pings++
	case talaris.EventClose, talaris.EventError:
		f := copyFinal(ev)
		st.final = &f
	}
}

// verify checks that the whole stream arrived and ended with close 1000.
func (st *streamState) verify(t testing.TB, label string) {
	t.Helper()
	if st.err != nil {
		t.Errorf("%s: integrity: %v", label, st.err)
	}
	if st.pingErr != nil {
		t.Errorf("%s: %v", label, st.pingErr)
	}
	if got := st.chk.Count(); got != st.spec.n {
		t.Errorf("%s: got %d messages, want %d", label, got, st.spec.n)
	} else if sum, want := st.chk.Sum(), wstest.StreamSum(st.spec.op(), st.spec.n, st.spec.size); sum != want {
		t.Errorf("%s: checksum %#x, want %#x", label, sum, want)
	}
	if st.pings != st.spec.wantPings() {
		t.Errorf("%s: got %d pings, want %d", label, st.pings, st.spec.wantPings())
	}
	switch {
	case st.final == nil:
		t.Errorf("%s: no final event", label)
	case st.final.Kind != talaris.EventClose || st.final.Code != talaris.CloseNormal || st.final.Reason != "done":
		t.Errorf("%s: final event %+v, want close 1000 \"done\"", label, *st.final)
	}
}

// pumpUntil pumps p with fn until done reports true.
func pumpUntil(t testing.TB, p *talaris.Pool, fn talaris.EventFunc, done func() bool, afterBatch func()) {
	t.Helper()
	for !done() {
		if _, err := p.Pump(fn); err != nil {
			t.Fatalf("Pump: %v", err)
		}
		if afterBatch != nil {
			afterBatch()
		}
	}
}

// runStream dials srv's /stream for spec on p and checks what arrives.
func runStream(t *testing.T, p *talaris.Pool, srv *wstest.Server, spec streamSpec, afterBatch func()) {
	t.Helper()
	ctx, cancel := dialCtx(t)
	defer cancel()
	c, err := p.Dial(ctx, srv.URL+spec.path(), nil)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	st := newStreamState(spec)
	pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
		if cc != c {
			t.Fatalf("event %v for unknown connection %#x (dialed %#x)", ev.Kind, cc.ID(), c.ID())
			return
		}
		st.on(ev)
	}, func() bool { return st.final != nil }, afterBatch)
	st.verify(t, spec.String())
	if s := c.State(); s != talaris.StateClosed {
		t.Errorf("state after the final event: %v", s)
	}
	if n := p.ConnCount(); n != 0 {
		t.Errorf("ConnCount after the final event: %d", n)
	}
}

// Workloads.

func seqSpec() streamSpec { return streamSpec{n: scaled(1_000_000), size: 16} }

var payloadSizes = []int{0, 1, 125, 126, 127, 65535, 65536, 1 << 20}

func sizeSpecs() []streamSpec {
	var out []streamSpec
	for _, size := range payloadSizes {
		// (Scaled under -short, the race run: the counts repeat the same
		// frames; every size and kind still streams.)
		n := scaled(2000)
		switch {
		case size >= 1<<20:
			n = 8
		case size >= 65535:
			n = scaled(100)
		}
		out = append(out, streamSpec{n: n, size: size})
		if size == 125 || size == 65536 || size == 1<<20 {
			out = append(out, streamSpec{n: n, size: size, text: true})
		}
	}
	return out
}

func fragSpecs() []streamSpec {
	return []streamSpec{
		{n: scaled(20000), size: 300, frag: 4, ping: true, text: true},
		{n: scaled(2000), size: 3, frag: 5, ping: true}, // some fragments are empty
		{n: scaled(3000), size: 40, ping: true},         // a ping before every message
		{n: 6, size: 1 << 20, frag: 7, ping: true},
		{n: scaled(200), size: 65536, frag: 3, text: true},
	}
}

func allSpecs(withSeq bool) []streamSpec {
	var specs []streamSpec
	if withSeq {
		specs = append(specs, seqSpec())
	}
	specs = append(specs, sizeSpecs()...)
	return append(specs, fragSpecs()...)
}

// TestIntegrity streams sequence-numbered, checksummed messages from real
// servers through several pool configurations and checks that every
// message arrives complete and in order (zero loss).
func TestIntegrity(t *testing.T) {
	type poolCase struct {
		name  string
		cfg   talaris.Config
		specs []streamSpec
		slow  time.Duration // consumer sleep per batch
		check func(t *testing.T, s talaris.PoolStats)
	}
	cases := []poolCase{
		{name: "default", cfg: talaris.Config{}, specs: allSpecs(true)},
		{
			// 4 slots of 4 KiB: a bundle empties the ring and ends, and
			// the recv must be re-armed.
			name: "tinybufs", cfg: talaris.Config{BufSize: 4096, BufCount: 4}, specs: allSpecs(true),
			check: func(t *testing.T, s talaris.PoolStats) {
				if s.Rearms == 0 {
					t.Errorf("tiny buffer ring with bundles: Rearms=0, want > 0")
				}
			},
		},
		{
			// A CQ of 8 entries overflows as soon as the kernel has more
			// than 8 completions for the loop.
			name: "tinycq", cfg: talaris.Config{SQEntries: 4, CQEntries: 8}, specs: allSpecs(true),
			check: func(t *testing.T, s talaris.PoolStats) {
				// With plenty of buffers, a multishot recv ends with data
				// and without -ENOBUFS only when the CQ overflowed.
				if s.Rearms <= s.NoBufs {
					t.Errorf("tiny CQ: Rearms=%d NoBufs=%d, want re-arms after CQ overflow", s.Rearms, s.NoBufs)
				}
			},
		},
		{
			name: "tinyall", cfg: talaris.Config{SQEntries: 4, CQEntries: 8, BufSize: 4096, BufCount: 4,
				EventRingSize: 64, ArenaSize: 4 << 20, MaxMessageSize: 2 << 20},
			specs: allSpecs(false),
			check: func(t *testing.T, s talaris.PoolStats) {
				if s.Stalls == 0 {
					t.Errorf("Stalls=0, want > 0")
				}
			},
		},
		// Recv bundles are the default (one completion over several
		// slots, unpacked in ring order); these rows receive without them
		// (Config.NoRecvBundle): one completion per slot, with 4 slots the
		// ring empties and the recv is re-armed, with a CQ of 8 completions
		// overflow.
		{name: "nobundle", cfg: talaris.Config{NoRecvBundle: true}, specs: allSpecs(true)},
		{
			name: "nobundle-tinybufs", cfg: talaris.Config{NoRecvBundle: true, BufSize: 4096, BufCount: 4}, specs: allSpecs(true),
			check: func(t *testing.T, s talaris.PoolStats) {
				if s.NoBufs == 0 || s.Rearms == 0 {
					t.Errorf("tiny buffer ring without bundles: NoBufs=%d Rearms=%d, want both > 0", s.NoBufs, s.Rearms)
				}
			},
		},
		{
			name: "nobundle-tinyall", cfg: talaris.Config{NoRecvBundle: true, SQEntries: 4, CQEntries: 8, BufSize: 4096, BufCount: 4,
				EventRingSize: 64, ArenaSize: 4 << 20, MaxMessageSize: 2 << 20},
			specs: allSpecs(false),
			check: func(t *testing.T, s talaris.PoolStats) {
				if s.NoBufs == 0 || s.Stalls == 0 {
					t.Errorf("NoBufs=%d Stalls=%d, want both > 0", s.NoBufs, s.Stalls)
				}
			},
		},
		{
			// A consumer that sleeps 1 ms per batch, with a 64-event ring
			// and a 4 MiB arena: the loop must hold input back (stall),
			// not drop it.
			name: "slowconsumer",
			cfg:  talaris.Config{EventRingSize: 64, ArenaSize: 4 << 20, MaxMessageSize: 2 << 20},
			specs: []streamSpec{
				{n: scaled(20000), size: 16},
				{n: 20, size: 1 << 20},
				{n: scaled(500), size: 65536, text: true},
				{n: scaled(2000), size: 100, frag: 3, ping: true},
			},
			slow: time.Millisecond,
			check: func(t *testing.T, s talaris.PoolStats) {
				if s.Stalls == 0 {
					t.Errorf("slow consumer: Stalls=0, want > 0")
				}
			},
		},
	}
	for _, pc := range cases {
		t.Run(pc.name, func(t *testing.T) {
			forEachServer(t, func(t *testing.T, srv *wstest.Server) {
				p := newTestPool(t, pc.cfg, 3*hangGuard)
				var after func()
				if pc.slow > 0 {
					after = func() { time.Sleep(pc.slow) }
				}
				for _, spec := range pc.specs {
					runStream(t, p, srv, spec, after)
					if t.Failed() {
						t.Logf("stats %+v", p.Stats())
						return
					}
				}
				s := p.Stats()
				t.Logf("stats %+v", s)
				if pc.check != nil {
					pc.check(t, s)
				}
			})
		})
	}
}

// TestManyConnections runs 64 streams at once through one pool: every
// connection gets its own payload size and kind, so anything crossing
// between connections fails a Checker.
func TestManyConnections(t *testing.T) {
	const conns = 64
	forEachServer(t, func(t *testing.T, srv *wstest.Server) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		specs := make([]streamSpec, conns)
		byConn := map[talaris.Conn]*streamState{}
		bySlot := make([]*streamState, 1024)
		for i := range conns {
			// (Volume kept modest: the test servers give up on the close
			// handshake after 5 s and then reset connections with unread
			// pongs, which -race on 2 cores could otherwise run into.)
			spec := streamSpec{n: scaled(2000), size: 8 + 3*i, text: i%2 == 1}
			if i%8 == 3 {
				spec.frag, spec.ping = 3, true
			}
			specs[i] = spec
			c, err := p.DialAsync(srv.URL+spec.path(), nil)
			if err != nil {
				t.Fatalf("DialAsync %d: %v", i, err)
			}
			st := newStreamState(spec)
			if bySlot[c.Slot()] != nil {
				t.Fatalf("slot %d used twice", c.Slot())
			}
			byConn[c] = st
			bySlot[c.Slot()] = st
		}
		finals := 0
		pumpUntil(t, p, func(c talaris.Conn, ev talaris.Event) {
			st := bySlot[c.Slot()]
			if st == nil || byConn[c] != st {
				t.Errorf("event %v for unknown connection slot %d id %#x", ev.Kind, c.Slot(), c.ID())
				return
			}
			st.on(ev)
			if st.final != nil && (ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError) {
				finals++
			}
		}, func() bool { return finals == conns }, nil)
		for c, st := range byConn {
			st.verify(t, fmt.Sprintf("conn slot %d %v", c.Slot(), st.spec))
		}
		if n := p.ConnCount(); n != 0 {
			t.Errorf("ConnCount = %d after all finals", n)
		}
	})
}

// pumpOne pumps until c's final event and returns it, passing every event
// of c to fn (which may be nil).
func pumpOne(t testing.TB, p *talaris.Pool, c talaris.Conn, fn func(ev talaris.Event)) finalEvent {
	t.Helper()
	var final *finalEvent
	pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
		if cc != c {
			t.Errorf("event %v for unknown connection", ev.Kind)
			return
		}
		if fn != nil {
			fn(ev)
		}
		if ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError {
			f := copyFinal(ev)
			final = &f
		}
	}, func() bool { return final != nil }, nil)
	return *final
}

func dial(t testing.TB, p *talaris.Pool, url string) talaris.Conn {
	t.Helper()
	ctx, cancel := dialCtx(t)
	defer cancel()
	c, err := p.Dial(ctx, url, nil)
	if err != nil {
		t.Fatalf("Dial %s: %v", url, err)
	}
	return c
}

// TestCloseByClient: Close(4001, "bye") reaches the server, which answers
// with the same code; the handshake ends with EventClose.
func TestCloseByClient(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv *wstest.Server) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		c := dial(t, p, srv.URL+"/echo")
		if err := c.SendText([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		echoed := false
		closed := false
		f := pumpOne(t, p, c, func(ev talaris.Event) {
			if ev.Kind == talaris.EventText && string(ev.Payload) == "hello" && !closed {
				echoed = true
				closed = true
				if err := c.Close(4001, "bye"); err != nil {
					t.Errorf("Close: %v", err)
				}
			}
		})
		if !echoed {
			t.Errorf("echo did not arrive")
		}
		if f.Kind != talaris.EventClose || f.Code != 4001 {
			t.Errorf("final %+v, want EventClose 4001 (the server echoes the client's code)", f)
		}
		if err := c.SendText([]byte("x")); !errors.Is(err, talaris.ErrClosed) {
			t.Errorf("SendText after close: %v, want ErrClosed", err)
		}
	})
	t.Run("raw", func(t *testing.T) {
		type got struct {
			code   int
			reason string
			err    error
		}
		ch := make(chan got, 1)
		srv := wstest.NewRaw(func(rc *wstest.RawConn) {
			rc.SetDeadline(30 * time.Second)
			code, reason, err := rc.ExpectClose()
			ch <- got{code, reason, err}
			if err == nil {
				rc.WriteClose(code, "ack "+reason)
			}
			rc.Close()
		}).Start(t)
		p := newTestPool(t, talaris.Config{}, hangGuard)
		c := dial(t, p, srv.URL+"/")
		if err := c.Close(4001, "bye"); err != nil {
			t.Fatal(err)
		}
		f := pumpOne(t, p, c, nil)
		g := <-ch
		if g.err != nil || g.code != 4001 || g.reason != "bye" {
			t.Errorf("server saw close %d %q (err %v), want 4001 \"bye\"", g.code, g.reason, g.err)
		}
		if f.Kind != talaris.EventClose || f.Code != 4001 || f.Reason != "ack bye" {
			t.Errorf("final %+v, want EventClose 4001 \"ack bye\"", f)
		}
	})
}

// TestCloseByServer: the server's close code and reason reach the client.
func TestCloseByServer(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv *wstest.Server) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		for _, tc := range []struct {
			code   int
			reason string
		}{{4002, "x"}, {1000, ""}, {1001, "going away"}, {3999, "ünïcödé"}} {
			c := dial(t, p, srv.URL+"/close?code="+strconv.Itoa(tc.code)+"&reason="+urlQueryEscape(tc.reason))
			f := pumpOne(t, p, c, nil)
			if f.Kind != talaris.EventClose || f.Code != tc.code || f.Reason != tc.reason {
				t.Errorf("final %+v, want EventClose %d %q", f, tc.code, tc.reason)
			}
		}
		// A close frame without a body reports 1005.
		c := dial(t, p, srv.URL+"/close?code=0")
		if f := pumpOne(t, p, c, nil); f.Kind != talaris.EventClose || f.Code != talaris.CloseNoStatus {
			t.Errorf("empty close: final %+v, want EventClose 1005", f)
		}
	})
}

func urlQueryEscape(s string) string {
	var b bytes.Buffer
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// TestServerDrop: TCP closed (FIN or reset) without a close frame ends the
// connection with EventError, code 1006 and ErrConnectionLost, after every
// message sent before the drop.
func TestServerDrop(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv *wstest.Server) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		for _, rst := range []bool{false, true} {
			spec := streamSpec{n: 1000, size: 100}
			path := spec.path()
			path = "/drop" + path[len("/stream"):]
			if rst {
				path += "&rst=1"
			}
			c := dial(t, p, srv.URL+path)
			st := newStreamState(spec)
			st.opened = true // EventOpen is checked by the other tests
			f := pumpOne(t, p, c, func(ev talaris.Event) {
				if ev.Kind != talaris.EventOpen {
					st.on(ev)
				}
			})
			if st.err != nil {
				t.Errorf("rst=%v: %v", rst, st.err)
			}
			// A reset may destroy data the kernel had not yet delivered;
			// with FIN every message must arrive.
			if !rst && st.chk.Count() != spec.n {
				t.Errorf("got %d messages before the drop, want %d", st.chk.Count(), spec.n)
			}
			if f.Kind != talaris.EventError || f.Code != talaris.CloseAbnormal || !errors.Is(f.Err, talaris.ErrConnectionLost) {
				t.Errorf("rst=%v: final %+v, want EventError 1006 ErrConnectionLost", rst, f)
			}
			var ce *talaris.ConnError
			if !errors.As(f.Err, &ce) || ce.Code != talaris.CloseAbnormal {
				t.Errorf("rst=%v: Err %v is not a *ConnError with Code 1006", rst, f.Err)
			}
		}
	})
}

// TestConcurrentSends: several goroutines send at once on one connection;
// the server receives every message intact and, per goroutine, in order.
func TestConcurrentSends(t *testing.T) {
	runConcurrentSenders(t, 8, talaris.Config{CmdRingSize: 1 << 16}, func(c talaris.Conn, _ context.Context, op talaris.Opcode, b []byte) error {
		if op == talaris.OpText {
			return c.SendText(b)
		}
		return c.SendBinary(b)
	})
}

// sendPayload is message i of sender g: its size varies from 12 bytes to
// well over the 16 KiB command-record limit of a 64 KiB command ring, so
// big messages go out as several fragments while other senders wait.
func sendPayload(g, i int) (ws.Opcode, []byte) {
	size := 12 + (i*7919+g*104729)%3000
	if i%97 == 5 {
		size = 40000 + g*1000
	}
	op := ws.OpBinary
	if (i+g)%3 == 0 {
		op = ws.OpText
	}
	b := wstest.AppendPayload(make([]byte, 0, size), op, i*senderStride+g, size)
	return op, b
}

const senderStride = 16

func parseSendPayload(op ws.Opcode, b []byte) (g, seq int, ok bool) {
	if len(b) < 12 {
		return 0, 0, false
	}
	var id int
	if op == ws.OpText {
		v, err := strconv.ParseUint(string(b[:8]), 16, 32)
		if err != nil {
			return 0, 0, false
		}
		id = int(v)
	} else {
		id = int(binary.LittleEndian.Uint64(b))
	}
	g, seq = id%senderStride, id/senderStride
	wop, want := sendPayload(g, seq)
	if wop != op || !bytes.Equal(want, b) {
		return 0, 0, false
	}
	return g, seq, true
}
