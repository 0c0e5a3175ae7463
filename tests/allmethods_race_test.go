//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// TestAllMethodsRace: every exported method of Pool and Conn (talaris.go)
// called at once from goroutines of their own while other goroutines end
// connections with Conn.Close and Abort and two of them close the Pool,
// against a peer that (a) stops reading (it keeps writing), (b) stops
// answering (upgrades, then never writes or reads), (c) resets mid-stream
// (SO_LINGER 0) or (d) closes mid-frame (half a header or half a payload,
// then FIN); over ws:// and wss://, with the loop thread and with the
// inline loop (Config.Tuning.InlineLoop: the test goroutine made the pool,
// only it may pump; other goroutines' pumps must say ErrNotLoopThread, or
// ErrConcurrentPump while it pumps, or deliver what is already published).
//
// What it asserts: no panic; no hang (every goroutine returns once the
// pool is closed: a hang guard of hangGuard, far above the second or so a
// combination takes, turns a hang into a failure); every error a method
// returns is in that method's documented set (amAllowed); no event of a
// Conn after its final one, every EventError's cause one this test can
// produce (amEnds); a handle whose final event was delivered answers as a
// dead one (ErrClosed, StateClosed, zero Stats); State never goes back and
// Stats is zero once State said closed; ID, Slot and Pool never change;
// Pump and PumpNowait return the callbacks they made; the pool's counters
// never go back; and after Pool.Close every method returns its documented
// post-close value (amAfterClose).
//
// What is left to other tests: TestHostileAPIRaces (the send and fairness
// paths' invariants against these peers, loop thread only), TestPoolCloseRace
// (Pool.Close racing dials on an echo server, many rounds),
// TestSendRacingClose (senders against a reading or stopped sink), the
// inline tests (inline_test.go: each inline path on its own).
func TestAllMethodsRace(t *testing.T) {
	iters := 5                          // (a combination's iteration: 0.1 to 1 s)
	if testing.Short() || raceEnabled { // (the race passes: every call costs several times more)
		iters = 2
	}
	for _, loop := range []string{"thread", "inline"} {
		for pi, peer := range amPeers {
			t.Run(loop+"/"+peer, func(t *testing.T) {
				forEachTransport(t, func(t *testing.T, useTLS bool) {
					for it := range iters {
						allMethodsOnce(t, useTLS, loop == "inline", peer, pi, it)
						if t.Failed() {
							t.Fatalf("iteration %d failed", it)
						}
					}
				})
			})
		}
	}
}

// The peers: after the upgrade each writes binary frames (but the silent
// one) and, after a delay (the reset and the cut), ends.
var amPeers = []string{"stops-reading", "silent", "resets", "closes-mid-frame"}

// amEnds are the causes a connection of this test may end with (its
// EventError's Err; Flush's error once it ended): a close or abort by
// the client (ErrClosed; ErrAborted matches it), the pool's shutdown
// (ErrPoolClosed), the reset or the cut (ErrConnectionLost), a peer that
// never answers the close frame (ErrCloseTimeout).
var amEnds = []error{talaris.ErrClosed, talaris.ErrPoolClosed, talaris.ErrConnectionLost, talaris.ErrCloseTimeout}

// amAllowed is each method's documented set of errors (talaris.go, errors.go)
// for the calls this test makes: valid arguments (no ErrInvalidUTF8,
// ErrInvalidOpcode, ErrControlTooLong, ErrInvalidCloseCode) and no
// ReconnectPolicy (no ErrReconnecting). Contexts given to Dial, Run,
// SendContext and Flush expire (context.DeadlineExceeded; Dial's is
// ErrTimeout). With the inline loop the pumps (and Run) may also say
// ErrNotLoopThread (amInlinePump).
var amAllowed = map[string][]error{
	"Pool.Close":      nil,
	"Dial":            {talaris.ErrPoolClosed, talaris.ErrTooManyConns, talaris.ErrTimeout},
	"DialAsync":       {talaris.ErrPoolClosed, talaris.ErrTooManyConns},
	"DialMemory":      {talaris.ErrPoolClosed, talaris.ErrTooManyConns},
	"Pump":            {talaris.ErrPoolClosed, talaris.ErrNoConns, talaris.ErrConcurrentPump},
	"PumpData":        {talaris.ErrPoolClosed, talaris.ErrNoConns, talaris.ErrConcurrentPump},
	"PumpStamped":     {talaris.ErrPoolClosed, talaris.ErrNoConns, talaris.ErrConcurrentPump},
	"PumpNowait":      {talaris.ErrPoolClosed, talaris.ErrConcurrentPump},
	"PumpDataNowait":  {talaris.ErrPoolClosed, talaris.ErrConcurrentPump},
	"Run":             {talaris.ErrConcurrentPump, context.DeadlineExceeded}, // nil once the pool is closed
	"RunData":         {talaris.ErrConcurrentPump, context.DeadlineExceeded},
	"WritePrometheus": nil,
	"SendText":        {talaris.ErrWouldBlock, talaris.ErrClosed, talaris.ErrPoolClosed},
	"SendBinary":      {talaris.ErrWouldBlock, talaris.ErrClosed, talaris.ErrPoolClosed},
	"SendBatch":       {talaris.ErrWouldBlock, talaris.ErrClosed, talaris.ErrPoolClosed},
	"SendContext":     {talaris.ErrClosed, talaris.ErrPoolClosed, context.DeadlineExceeded},
	"Flush":           append([]error{context.DeadlineExceeded}, amEnds...),
	"Ping":            {talaris.ErrWouldBlock, talaris.ErrClosed, talaris.ErrPoolClosed}, // ErrWouldBlock also before the open
	"Pong":            {talaris.ErrWouldBlock, talaris.ErrClosed, talaris.ErrPoolClosed},
	"Close":           {talaris.ErrClosed, talaris.ErrPoolClosed},
	"Abort":           {talaris.ErrClosed, talaris.ErrPoolClosed},
	"Inject":          {talaris.ErrClosed, talaris.ErrPoolClosed},
}

// amInlinePump: what a pump of an inline pool may say besides amAllowed's.
var amInlinePump = []error{talaris.ErrNotLoopThread}

// amDead: a call on a handle whose final event was delivered (before the
// call began) returns one of these.
var amDead = []error{talaris.ErrClosed, talaris.ErrPoolClosed}

// amPumps are the pump methods, each as one call with the callbacks of env.
var amPumps = []string{"Pump", "PumpData", "PumpStamped", "PumpNowait", "PumpDataNowait", "Run", "RunData"}

// amEnv is one combination's pool, handles and bookkeeping.
type amEnv struct {
	t      *testing.T
	p      *talaris.Pool
	inline bool
	url    string
	opts   *talaris.DialOptions
	closed chan struct{} // closed once a Pool.Close has returned

	mu      sync.Mutex
	handles []talaris.Conn
	mem     []talaris.Conn // the DialMemory ones
	ids     map[talaris.Conn][2]uint64

	finals  sync.Map // talaris.Conn -> struct{}: its final event was delivered
	seen    sync.Map // "method: answer" -> *atomic.Int64 (logged with -v: what the run reached)
	events  atomic.Int64
	calls   atomic.Int64
	nerrs   atomic.Int64
	maxMsgs atomic.Uint64 // Metrics().Messages seen so far
}

const amMaxConns = 24

// bad reports a failure from any goroutine (the first 20 of them).
func (e *amEnv) bad(format string, a ...any) {
	if e.nerrs.Add(1) <= 20 {
		e.t.Errorf(format, a...)
	}
}

// check fails unless err is nil or in method's allowed set (plus extra).
func (e *amEnv) check(method string, err error, extra ...error) {
	e.calls.Add(1)
	e.tally(method, err)
	if err == nil || amIs(err, amAllowed[method]) || amIs(err, extra) {
		return
	}
	e.bad("%s: %v (allowed: nil, %s)", method, err, amNames(append(amAllowed[method], extra...)))
}

// tally counts method's answer by the sentinel it matches.
func (e *amEnv) tally(method string, err error) {
	key := method + ": nil"
	if err != nil {
		key = method + ": " + err.Error()
		for _, s := range append(append([]error{talaris.ErrNotLoopThread, talaris.ErrConcurrentPump}, amEnds...),
			talaris.ErrWouldBlock, talaris.ErrNoConns, talaris.ErrTooManyConns, talaris.ErrTimeout, context.DeadlineExceeded) {
			if errors.Is(err, s) {
				key = method + ": " + s.Error()
				break
			}
		}
	}
	v, _ := e.seen.LoadOrStore(key, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func amIs(err error, set []error) bool {
	for _, s := range set {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

func amNames(set []error) string {
	var s []string
	for _, e := range set {
		s = append(s, e.Error())
	}
	return strings.Join(s, " | ")
}

func (e *amEnv) add(c talaris.Conn, memory bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.handles = append(e.handles, c)
	if memory {
		e.mem = append(e.mem, c)
	}
	e.ids[c] = [2]uint64{c.ID(), uint64(c.Slot())}
}

// handle returns the i-th handle (round robin) and whether its final
// event was delivered before this call.
func (e *amEnv) handle(i int) (talaris.Conn, bool) {
	e.mu.Lock()
	c := e.handles[i%len(e.handles)]
	e.mu.Unlock()
	_, dead := e.finals.Load(c)
	return c, dead
}

func (e *amEnv) memHandle(i int) (talaris.Conn, bool, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.mem) == 0 {
		return talaris.Conn{}, false, false
	}
	c := e.mem[i%len(e.mem)]
	_, dead := e.finals.Load(c)
	return c, dead, true
}

func (e *amEnv) all() []talaris.Conn {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]talaris.Conn(nil), e.handles...)
}

// checkDead: a call on a handle that was dead before it began must say so.
func (e *amEnv) checkDead(method string, dead bool, err error) {
	if dead && !amIs(err, amDead) {
		e.bad("%s on a handle whose final event was delivered: %v, want ErrClosed or ErrPoolClosed", method, err)
	}
}

// event is every callback's bookkeeping: the Conn is the pool's, nothing
// follows a final event, an EventError's cause is one of amEnds.
func (e *amEnv) event(c talaris.Conn, kind talaris.EventKind, err error) {
	e.events.Add(1)
	if c.Pool() != e.p {
		e.bad("event %v for a Conn of another pool", kind)
	}
	if _, dead := e.finals.Load(c); dead {
		e.bad("event %v after the final event of conn %d", kind, c.ID())
	}
	switch kind {
	case talaris.EventError:
		e.tally("EventError", err)
		if !amIs(err, amEnds) {
			e.bad("EventError %v: not a cause this test can produce (%s)", err, amNames(amEnds))
		}
		e.finals.Store(c, struct{}{})
	case talaris.EventClose:
		e.finals.Store(c, struct{}{})
	}
}

func (e *amEnv) onEvent(c talaris.Conn, ev talaris.Event) { e.event(c, ev.Kind, ev.Err) }

// pump makes one call of pump method m (ctx bounds Run and RunData) and
// checks its answer; owner says whether the caller may pump an inline
// pool. It returns the error.
func (e *amEnv) pump(m string, ctx context.Context, owner bool) error {
	var extra []error
	if e.inline && !owner {
		extra = amInlinePump
	}
	cbs := 0
	fe := func(c talaris.Conn, ev talaris.Event) {
		cbs++
		e.event(c, ev.Kind, ev.Err)
		if cbs%64 == 1 { // a call from inside a callback
			e.check("SendBinary", c.SendBinary([]byte("from a callback")))
			_ = e.p.ConnCount()
		}
	}
	fd := func(c talaris.Conn, op talaris.Opcode, _ []byte) {
		cbs++
		e.event(c, talaris.EventKind(op-talaris.OpText)+talaris.EventText, nil)
	}
	fs := func(c talaris.Conn, op talaris.Opcode, b []byte, _ talaris.Stamps) { fd(c, op, b) }
	var n int
	var err error
	switch m {
	case "Pump":
		n, err = e.p.Pump(fe)
	case "PumpData":
		n, err = e.p.PumpData(fd)
	case "PumpStamped":
		n, err = e.p.PumpStamped(fs)
	case "PumpNowait":
		n, err = e.p.PumpNowait(fe)
	case "PumpDataNowait":
		n, err = e.p.PumpDataNowait(fd)
	case "Run":
		err = e.p.Run(ctx, fe)
	case "RunData":
		err = e.p.RunData(ctx, fd)
	}
	e.check(m, err, extra...)
	switch {
	case m == "Run" || m == "RunData": // (no count)
	case n < 0:
		e.bad("%s returned n = %d", m, n)
	case (m == "Pump" || m == "PumpNowait") && n != cbs:
		e.bad("%s returned n = %d after %d callbacks", m, n, cbs)
	case n < cbs: // (the data pumps count Config.OnEvent's callbacks too)
		e.bad("%s returned n = %d after %d data callbacks", m, n, cbs)
	case err == nil && n == 0 && (m == "Pump" || m == "PumpData" || m == "PumpStamped"):
		e.bad("%s returned 0 events and no error: a blocking pump delivers at least one", m)
	}
	return err
}

// amPeer is the server side of one connection (see amPeers); after is
// when the reset and the cut happen, stop ends the silent peer's wait.
func amPeer(kind string, after time.Duration, cutHeader bool, stop <-chan struct{}) func(rc *wstest.RawConn) {
	return func(rc *wstest.RawConn) {
		if kind == "silent" {
			<-stop // never writes, never reads: the client's bytes stay in the kernel
			return
		}
		fstop, fdone := make(chan struct{}), make(chan struct{})
		go func() { // frames in bursts of 16, a burst every 200 us
			defer close(fdone)
			var burst []byte
			for i := range 16 {
				burst = ws.AppendFrame(burst, true, ws.OpBinary, make([]byte, 32+i))
			}
			for {
				select {
				case <-fstop:
					return
				case <-stop:
					return
				default:
				}
				if rc.Write(burst) != nil {
					return
				}
				time.Sleep(200 * time.Microsecond)
			}
		}()
		var once sync.Once
		stopFlood := func() { once.Do(func() { close(fstop) }); <-fdone }
		defer stopFlood()
		if kind == "stops-reading" {
			select { // until the client's end makes a write fail
			case <-fdone:
			case <-stop:
			}
			return
		}
		// Read (and drop) the client's frames until after, then end.
		rc.Conn.SetReadDeadline(time.Now().Add(after))
		for {
			if _, _, err := rc.ReadFrame(); err != nil {
				break
			}
		}
		if kind == "resets" {
			rc.Reset() // mid-stream: the flood is still writing
			return
		}
		stopFlood()
		if cutHeader { // a 16-bit length with one of its two bytes
			rc.Write([]byte{0x82, 126, 0x01})
		} else { // a 1000-byte frame of which 10 bytes come
			rc.WriteFrameLen(ws.Header{Fin: true, Op: ws.OpBinary, Length: 1000}, 2, make([]byte, 10))
		}
		rc.Close()
	}
}

// allMethodsOnce is one combination's run: the peer, the pool (made on
// this goroutine, the inline loop's owner), the callers, the closers,
// this goroutine's pumping, then the checks after the end.
func allMethodsOnce(t *testing.T, useTLS, inline bool, peer string, pi, it int) {
	ms := time.Millisecond
	// When the peer resets or cuts, when the pool is closed, and whether
	// the inline loop's own goroutine closes it: varied over the
	// iterations and the peers, so each order happens.
	after := []time.Duration{5 * ms, 20 * ms, 50 * ms}[(2*it+pi)%3]
	closeAfter := []time.Duration{25 * ms, 60 * ms, 150 * ms}[(it+pi+1)%3]
	ownerCloses := inline && (it+pi)%2 == 1
	stop := make(chan struct{})
	srv := wstest.NewRaw(amPeer(peer, after, it%2 == 0, stop))
	opts := startWS(t, useTLS, srv.Start, srv.StartTLS)
	var stopOnce sync.Once
	endPeer := func() { stopOnce.Do(func() { close(stop) }) }
	t.Cleanup(endPeer) // (before the server's Close: cleanups run last first)
	defer func() { endPeer(); srv.Close() }()

	e := &amEnv{t: t, inline: inline, url: srv.URL + "/", opts: opts, closed: make(chan struct{}), ids: map[talaris.Conn][2]uint64{}}
	cfg := talaris.Config{MaxConns: amMaxConns, MaxSendQueue: 64 << 10, CloseTimeout: 200 * time.Millisecond,
		SampleEvery: 16, OnEvent: e.onEvent, Tuning: talaris.Tuning{InlineLoop: inline}}
	p := newTestPool(t, cfg, hangGuard)
	e.p = p
	ctx, cancel := dialCtx(t)
	defer cancel()
	first, err := p.Dial(ctx, e.url, opts)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	e.add(first, false)
	mc, err := p.DialMemory()
	if err != nil {
		t.Fatalf("DialMemory: %v", err)
	}
	e.add(mc, true)

	start := time.Now()
	var wg sync.WaitGroup
	caller := func(name string, fn func(i int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if r := recover(); r != nil {
					e.bad("%s panicked: %v", name, r)
				}
			}()
			for i := 0; ; i++ {
				select {
				case <-e.closed:
					return
				default:
				}
				fn(i)
				time.Sleep(time.Duration(20+(i%5)*20) * time.Microsecond)
			}
		}()
	}
	short := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 3*time.Millisecond)
	}
	nDials := 3
	if testing.Short() {
		nDials = 2
	}

	// Pool: dials, counts, metrics.
	caller("Dial", func(i int) {
		if i >= nDials {
			if n := p.ConnCount(); n < 0 || n > amMaxConns {
				e.bad("ConnCount %d", n)
			}
			return
		}
		dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := p.Dial(dctx, e.url, opts)
		dcancel()
		e.check("Dial", err)
		if err == nil {
			if st := c.State(); st < talaris.StateOpen {
				e.bad("Dial returned a Conn in state %v", st)
			}
			e.add(c, false)
		}
	})
	caller("DialAsync+DialMemory", func(i int) {
		if i >= 2*nDials {
			return
		}
		var c talaris.Conn
		var err error
		memory := i%2 == 1
		if memory {
			c, err = p.DialMemory()
			e.check("DialMemory", err)
		} else {
			c, err = p.DialAsync(e.url, opts)
			e.check("DialAsync", err)
		}
		if err == nil {
			if st := c.State(); st == talaris.StateIdle {
				e.bad("a new handle in state idle")
			}
			e.add(c, memory)
		}
	})
	caller("Metrics", func(i int) {
		var m talaris.Metrics
		switch i % 3 {
		case 0:
			m = p.Metrics()
		case 1:
			m = p.MetricsInterval()
		default:
			e.check("WritePrometheus", p.WritePrometheus(io.Discard))
			m = p.Metrics()
		}
		for {
			old := e.maxMsgs.Load()
			if m.Messages < old {
				e.bad("Metrics.Messages went back from %d to %d", old, m.Messages)
			}
			if m.Messages <= old || e.maxMsgs.CompareAndSwap(old, m.Messages) {
				break
			}
		}
	})

	// Conn: sends, controls, flushes, injects, readers.
	text, bin := []byte(`{"op":"subscribe"}`), make([]byte, 9000)
	batch := [][]byte{[]byte("a"), []byte("bb"), make([]byte, 3000)}
	caller("SendText", func(i int) {
		c, dead := e.handle(i)
		err := c.SendText(text)
		e.check("SendText", err)
		e.checkDead("SendText", dead, err)
	})
	big := make([]byte, 32<<10)
	caller("SendBinary", func(i int) {
		// Back to back until the queue is full (the kernel's buffers take
		// a few MiB of a peer that does not read first), then one by one.
		c, dead := e.handle(i)
		for k := 0; k < 256; k++ {
			err := c.SendBinary(big[:len(big)-k])
			e.check("SendBinary", err)
			e.checkDead("SendBinary", dead, err)
			if err != nil {
				break
			}
		}
	})
	caller("SendBatch", func(i int) {
		c, dead := e.handle(i)
		var err error
		switch i % 4 {
		case 0:
			err = c.SendBatch(talaris.OpText, [][]byte{text, text})
		case 3:
			err = c.SendBatch(talaris.OpBinary, nil) // whether the connection takes sends
		default:
			err = c.SendBatch(talaris.OpBinary, batch)
		}
		e.check("SendBatch", err)
		e.checkDead("SendBatch", dead, err)
	})
	// (A dead handle answers at once: no context that may have ended
	// before the call, which would be the answer then.)
	ctxFor := func(dead bool) (context.Context, context.CancelFunc) {
		if dead {
			return context.WithCancel(context.Background())
		}
		return short()
	}
	caller("SendContext", func(i int) {
		c, dead := e.handle(i)
		sctx, scancel := ctxFor(dead)
		op, b := talaris.OpBinary, bin
		if i%2 == 0 {
			op, b = talaris.OpText, text
		}
		err := c.SendContext(sctx, op, b)
		scancel()
		e.check("SendContext", err)
		e.checkDead("SendContext", dead, err)
	})
	caller("Flush", func(i int) {
		c, dead := e.handle(i)
		fctx, fcancel := ctxFor(dead)
		err := c.Flush(fctx)
		fcancel()
		e.check("Flush", err)
		if dead && (err == nil || errors.Is(err, context.DeadlineExceeded)) {
			e.bad("Flush on a handle whose final event was delivered: %v, want the connection's end", err)
		}
	})
	caller("Ping+Pong", func(i int) {
		c, dead := e.handle(i)
		var err error
		m := "Ping"
		if i%2 == 0 {
			err = c.Ping([]byte("hb"))
		} else {
			m, err = "Pong", c.Pong([]byte("unsolicited"))
		}
		e.check(m, err)
		e.checkDead(m, dead, err)
	})
	frames := ws.AppendFrame(ws.AppendFrame(nil, true, ws.OpText, text), true, ws.OpBinary, make([]byte, 200))
	caller("Inject", func(i int) {
		c, dead, ok := e.memHandle(i)
		if !ok {
			return
		}
		err := c.Inject(frames)
		e.check("Inject", err)
		e.checkDead("Inject", dead, err)
	})
	last := map[talaris.Conn]talaris.State{} // (the readers goroutine's)
	caller("readers", func(i int) {
		for _, c := range e.all() {
			_, dead := e.finals.Load(c)
			st := c.State()
			stats := c.Stats()
			e.mu.Lock()
			ids := e.ids[c]
			e.mu.Unlock()
			switch {
			case c.Pool() != p:
				e.bad("Conn.Pool is not the pool")
			case c.ID() != ids[0] || uint64(c.Slot()) != ids[1] || c.ID()&0xffffffff != uint64(c.Slot()):
				e.bad("ID %#x / Slot %d changed from %#x / %d", c.ID(), c.Slot(), ids[0], ids[1])
			case c.Slot() < 0 || c.Slot() >= amMaxConns:
				e.bad("Slot %d out of [0, %d)", c.Slot(), amMaxConns)
			case st == talaris.StateIdle || st > talaris.StateClosed:
				e.bad("State %v of a dialed handle", st)
			case st < last[c]:
				e.bad("State went back from %v to %v", last[c], st)
			case dead && st != talaris.StateClosed:
				e.bad("State %v after the final event", st)
			case st == talaris.StateClosed && stats != (talaris.ConnStats{}):
				e.bad("Stats %+v after State said closed", stats)
			case c.Subprotocol() != "":
				e.bad("Subprotocol %q: none was offered", c.Subprotocol())
			}
			last[c] = st
		}
	})

	// Enders: Conn.Close and Abort now and then; two Pool.Closes at once
	// (the inline loop's goroutine is one of them when ownerCloses).
	caller("Close+Abort", func(i int) {
		if i%8 != 7 || time.Since(start) < after/2 {
			return
		}
		c, dead := e.handle(i / 8)
		var err error
		m := "Close"
		if (i/8)%3 == 2 {
			m, err = "Abort", c.Abort()
		} else {
			err = c.Close(talaris.CloseNormal, "bye")
		}
		e.check(m, err)
		e.checkDead(m, dead, err)
	})
	var closeOnce sync.Once
	poolClose := func(who string) {
		if err := p.Close(); err != nil {
			e.bad("Pool.Close (%s): %v, want nil", who, err)
		}
		closeOnce.Do(func() { close(e.closed) })
	}
	closers := []string{"closer 1", "closer 2"}
	if ownerCloses {
		closers = closers[1:]
	}
	for _, who := range closers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(closeAfter)
			poolClose(who)
		}()
	}

	// Pumps: on the loop thread one goroutine per pump method besides
	// this one; with the inline loop two other goroutines, which may not
	// pump it.
	others := amPumps
	if inline {
		others = []string{"any", "any"}
	}
	for k, m := range others {
		caller("pump "+m, func(i int) {
			which := m
			if which == "any" {
				which = amPumps[(i+k)%len(amPumps)]
			}
			rctx, rcancel := short()
			err := e.pump(which, rctx, false)
			rcancel()
			if errors.Is(err, talaris.ErrNoConns) || errors.Is(err, talaris.ErrConcurrentPump) || errors.Is(err, talaris.ErrNotLoopThread) {
				time.Sleep(100 * time.Microsecond)
			}
		})
	}
	// This goroutine (the inline loop's owner) pumps with every method in
	// turn until the pool is closed, calling Close itself when it is the
	// closer, and from time to time a call that runs an inline loop while
	// it waits (SendContext, Flush, Dial).
	for i := 0; ; i++ {
		if ownerCloses && time.Since(start) >= closeAfter {
			poolClose("the loop's goroutine")
		}
		select {
		case <-e.closed:
		default:
			m := amPumps[i%len(amPumps)]
			rctx, rcancel := short()
			err := e.pump(m, rctx, true)
			rcancel()
			if errors.Is(err, talaris.ErrNoConns) || errors.Is(err, talaris.ErrConcurrentPump) || errors.Is(err, talaris.ErrPoolClosed) {
				time.Sleep(100 * time.Microsecond)
			}
			if i%16 == 5 {
				c, _ := e.handle(i)
				sctx, scancel := short()
				e.check("SendContext", c.SendContext(sctx, talaris.OpBinary, bin))
				e.check("Flush", c.Flush(sctx))
				scancel()
			}
			if i == 9 && inline {
				dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
				c, err := p.Dial(dctx, e.url, opts)
				dcancel()
				e.check("Dial", err)
				if err == nil {
					e.add(c, false)
				}
			}
			continue
		}
		break
	}
	// The hang guard: every caller returns once the pool is closed; a
	// wait of hangGuard (a minute; a combination takes about a second)
	// only tells a hang from a slow machine.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Fatalf("callers did not return within %v of Pool.Close (peer %s)", hangGuard, peer)
	}
	amAfterClose(t, e)
	if testing.Verbose() {
		var lines []string
		e.seen.Range(func(k, v any) bool {
			lines = append(lines, fmt.Sprintf("%6d  %s", v.(*atomic.Int64).Load(), k))
			return true
		})
		sort.Strings(lines)
		t.Logf("answers (count, method: answer):\n%s", strings.Join(lines, "\n"))
	}
	t.Logf("%d calls, %d events, %d handles in %v", e.calls.Load(), e.events.Load(), len(e.all()), time.Since(start).Round(time.Millisecond))
}

// amAfterClose checks what every method returns once Pool.Close has
// returned (talaris.go): ErrPoolClosed from every call that needs the
// loop (Abort: ErrClosed or ErrPoolClosed), nil from Close again and from
// Run and RunData, ConnCount 0, StateClosed and zero Stats, the counters
// as they were when the loop stopped.
func amAfterClose(t *testing.T, e *amEnv) {
	p := e.p
	want := func(what string, err error, ok ...error) {
		t.Helper()
		if !amIs(err, ok) {
			t.Errorf("after Pool.Close: %s = %v, want %s", what, err, amNames(ok))
		}
	}
	pc := []error{talaris.ErrPoolClosed}
	if err := p.Close(); err != nil {
		t.Errorf("after Pool.Close: Close = %v, want nil", err)
	}
	if n := p.ConnCount(); n != 0 {
		t.Errorf("after Pool.Close: ConnCount = %d", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := p.Dial(ctx, e.url, e.opts)
	want("Dial", err, pc...)
	_, err = p.DialAsync(e.url, e.opts)
	want("DialAsync", err, pc...)
	_, err = p.DialMemory()
	want("DialMemory", err, pc...)
	for _, m := range amPumps {
		err := e.pump(m, ctx, true)
		if m == "Run" || m == "RunData" {
			if err != nil {
				t.Errorf("after Pool.Close: %s = %v, want nil", m, err)
			}
			continue
		}
		want(m, err, pc...)
	}
	m1 := p.Metrics()
	_ = p.MetricsInterval()
	m2 := p.Metrics()
	if m1.Messages != m2.Messages || m1.WireBytes != m2.WireBytes || m2.Messages < e.maxMsgs.Load() {
		t.Errorf("after Pool.Close: Metrics moved (%d, %d bytes; then %d, %d bytes; seen before %d)",
			m1.Messages, m1.WireBytes, m2.Messages, m2.WireBytes, e.maxMsgs.Load())
	}
	if err := p.WritePrometheus(io.Discard); err != nil {
		t.Errorf("after Pool.Close: WritePrometheus = %v", err)
	}
	for _, c := range e.all() {
		e.mu.Lock()
		ids := e.ids[c]
		e.mu.Unlock()
		id := fmt.Sprintf("conn %#x", c.ID())
		want(id+" SendText", c.SendText([]byte("late")), pc...)
		want(id+" SendBinary", c.SendBinary([]byte("late")), pc...)
		want(id+" SendBatch", c.SendBatch(talaris.OpBinary, [][]byte{[]byte("late")}), pc...)
		want(id+" SendContext", c.SendContext(ctx, talaris.OpText, []byte("late")), pc...)
		want(id+" Flush", c.Flush(ctx), pc...)
		want(id+" Ping", c.Ping(nil), pc...)
		want(id+" Pong", c.Pong(nil), pc...)
		want(id+" Inject", c.Inject([]byte{0x81, 0}), pc...)
		want(id+" Close", c.Close(talaris.CloseNormal, ""), pc...)
		want(id+" Abort", c.Abort(), talaris.ErrClosed, talaris.ErrPoolClosed)
		if st := c.State(); st != talaris.StateClosed {
			t.Errorf("after Pool.Close: %s State = %v, want closed", id, st)
		}
		if s := c.Stats(); s != (talaris.ConnStats{}) {
			t.Errorf("after Pool.Close: %s Stats = %+v, want zero", id, s)
		}
		if c.Subprotocol() != "" || c.Pool() != p || c.ID() != ids[0] || uint64(c.Slot()) != ids[1] {
			t.Errorf("after Pool.Close: %s Subprotocol %q, Pool %p (want %p), ID %#x, Slot %d", id, c.Subprotocol(), c.Pool(), p, c.ID(), c.Slot())
		}
	}
}
