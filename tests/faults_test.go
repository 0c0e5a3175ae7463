//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
	"golang.org/x/sys/unix"
)

// Fault injection at the io_uring level: a provided-buffer
// ring of 2-4 tiny slots (multishot recvs end with -ENOBUFS all the time), a
// completion queue of 4 entries (overflow with several connections
// streaming), a server that resets or closes TCP in the middle of a frame,
// and a TLS server that closes TCP in the middle of a record, each alone and
// combined with a slow consumer and small event ring and arena (stalls).
// Every run asserts that the frames sent are exactly the frames delivered,
// in order and content-checked (wstest.Checker), and then the right final
// event. Each scenario runs many times on one pool (slot reuse included).
// Nothing is timed: timeouts are hang guards only.

// faultCfg is a pool configuration the fault scenarios run under.
type faultCfg struct {
	name   string
	cfg    talaris.Config
	slow   bool // the consumer sleeps every few events
	noBufs bool // the buffer ring is tiny: -ENOBUFS must have happened
}

// smallRings makes stalls likely: 64 events, 64 KiB of arena.
func smallRings(c talaris.Config) talaris.Config {
	c = testhook.WithKnobs(c, testhook.Knobs{EventRingSize: 64})
	c.ArenaSize = 64 << 10
	c.MaxMessageSize = 32 << 10
	return c
}

var faultCfgs = []faultCfg{
	{name: "default", cfg: talaris.Config{}},
	{name: "buf256x2", cfg: talaris.Config{BufSize: 256, BufCount: 2}, noBufs: true},
	{name: "buf512x4-slow", cfg: smallRings(talaris.Config{BufSize: 512, BufCount: 4}), slow: true, noBufs: true},
	{name: "cq4", cfg: testhook.WithKnobs(talaris.Config{}, testhook.Knobs{SQEntries: 2, CQEntries: 4})},
	{name: "cq4-buf256x4-slow", cfg: smallRings(testhook.WithKnobs(talaris.Config{BufSize: 256, BufCount: 4}, testhook.Knobs{SQEntries: 2, CQEntries: 4})), slow: true, noBufs: true},
}

// faultIters is how many times each scenario repeats.
// moreFaultIters says whether iteration it of a scenario runs: the first
// faultIters() do, and with a tiny buffer ring (fc.noBufs) up to 20 more
// while the ring has not run dry yet, so the -ENOBUFS path this config is
// for is shown to have run (checkFaultStats) also when a slow pass (the
// race detector) read fast enough that it never did in the first ones.
func moreFaultIters(it int, fc faultCfg, p *talaris.Pool) bool {
	return it < faultIters() || fc.noBufs && it < faultIters()+20 && testhook.Stats(p).NoBufs == 0
}

func faultIters() int {
	if testing.Short() {
		return 4
	}
	return 20
}

// faultJob is one connection of a scenario: where to dial and what must
// arrive.
type faultJob struct {
	url  string
	opts *talaris.DialOptions
	spec streamSpec // the messages that arrive whole (n of them)
	// lost: after exactly spec.n messages the connection ends with
	// EventError, ErrConnectionLost, code 1006; else with EventClose 1000
	// "done" (a /stream).
	lost bool
}

func (j faultJob) String() string {
	if u, err := url.Parse(j.url); err == nil {
		return u.Scheme + " " + u.RequestURI()
	}
	return j.url
}

// preDialed is a connection dialed before runFaultJobs starts pumping.
type preDialed struct {
	c     talaris.Conn
	st    *streamState
	label string
}

// runFaultJobs dials every job at once (DialAsync) and pumps until each
// connection has delivered its final event, then checks each one.
func runFaultJobs(t *testing.T, p *talaris.Pool, jobs []faultJob, slow bool, pre ...preDialed) {
	t.Helper()
	states := make(map[talaris.Conn]*streamState, len(jobs)+len(pre))
	for _, d := range pre {
		states[d.c] = d.st
	}
	order := make([]talaris.Conn, len(jobs))
	for i, j := range jobs {
		c, err := p.DialAsync(j.url, j.opts)
		if err != nil {
			t.Fatalf("DialAsync %s: %v", j, err)
		}
		states[c] = newStreamState(j.spec)
		order[i] = c
	}
	finals, events := 0, 0
	for finals < len(jobs)+len(pre) {
		_, err := p.Pump(func(c talaris.Conn, ev talaris.Event) {
			st := states[c]
			if st == nil {
				t.Errorf("event %v for an unknown connection (slot %d gen %d)", ev.Kind, c.Slot(), c.ID()>>32)
				return
			}
			if st.final != nil {
				t.Errorf("event %v after the final event", ev.Kind)
			}
			st.on(ev)
			if st.final != nil {
				finals++
			}
			events++
			if slow && events%16 == 0 {
				time.Sleep(200 * time.Microsecond)
			}
		})
		if err != nil {
			var open []string
			for i, c := range order {
				if states[c].final == nil {
					open = append(open, fmt.Sprintf("%s: state %v, %d msgs, conn %+v",
						jobs[i], c.State(), states[c].chk.Count(), c.Stats()))
				}
			}
			for _, d := range pre {
				if d.st.final == nil {
					open = append(open, fmt.Sprintf("%s: state %v, %d msgs", d.label, d.c.State(), d.st.chk.Count()))
				}
			}
			t.Fatalf("Pump: %v; unfinished: %v; pool %+v", err, open, testhook.Stats(p))
		}
	}
	for _, d := range pre {
		d.st.verify(t, d.label)
	}
	for i, c := range order {
		j, st := jobs[i], states[c]
		label := j.String()
		if st.err != nil {
			t.Errorf("%s: integrity: %v", label, st.err)
		}
		if st.pingErr != nil {
			t.Errorf("%s: %v", label, st.pingErr)
		}
		if !st.opened {
			t.Errorf("%s: no EventOpen", label)
		}
		if got := st.chk.Count(); got != j.spec.n {
			t.Errorf("%s: %d messages delivered, want exactly %d (final %+v)", label, got, j.spec.n, st.final)
		} else if sum, want := st.chk.Sum(), wstest.StreamSum(j.spec.op(), j.spec.n, j.spec.size); sum != want {
			t.Errorf("%s: checksum %#x, want %#x", label, sum, want)
		}
		if st.pings != j.spec.wantPings() {
			t.Errorf("%s: %d pings, want %d", label, st.pings, j.spec.wantPings())
		}
		f := st.final
		switch {
		case j.lost:
			if f.Kind != talaris.EventError || f.Code != talaris.CloseAbnormal || !errors.Is(f.Err, talaris.ErrConnectionLost) {
				t.Errorf("%s: final %+v, want EventError 1006 ErrConnectionLost", label, *f)
			}
		case f.Kind != talaris.EventClose || f.Code != talaris.CloseNormal || f.Reason != "done":
			t.Errorf("%s: final %+v, want EventClose 1000 \"done\"", label, *f)
		}
		if s := c.State(); s != talaris.StateClosed {
			t.Errorf("%s: state %v after the final event", label, s)
		}
	}
	if n := p.ConnCount(); n != 0 {
		t.Errorf("ConnCount %d after every final event", n)
	}
}

// newFaultPool makes a pool for fc (with a hang guard).
func newFaultPool(t *testing.T, fc faultCfg) *talaris.Pool {
	t.Helper()
	return newTestPool(t, fc.cfg, hangGuard)
}

// checkFaultStats checks that the tiny buffer ring did run dry.
func checkFaultStats(t *testing.T, fc faultCfg, p *talaris.Pool) {
	t.Helper()
	st := testhook.Stats(p)
	if fc.noBufs && st.NoBufs == 0 {
		t.Errorf("%s: no -ENOBUFS with a tiny buffer ring (stats %+v)", fc.name, st)
	}
	t.Logf("%s: stats %+v", fc.name, st)
}

// ---- a raw server that ends in the middle of a frame ----

// cutServer serves /cut?n=N&size=S&op=text|binary&frag=K&ping=1&cut=hdr|payload|frag&end=fin|rst|close:
// it writes N stream messages (as /stream would) and then part of message
// N: one header byte (cut=hdr), a header and half the payload (payload),
// or a whole first fragment and half of the second (frag). Then it waits
// until the client's kernel has acknowledged every byte (SIOCOUTQ == 0, so
// that a reset cannot destroy data in flight) and ends TCP with a FIN
// (waiting for the client to close), a reset, or a FIN and a close that
// does not wait (so the client's later pongs are answered by a reset).
func cutServer(t *testing.T) *wstest.RawServer {
	var errs atomic.Value
	srv := wstest.NewRaw(func(c *wstest.RawConn) {
		if err := serveCut(c); err != nil {
			errs.Store(err)
		}
	}).Start(t)
	t.Cleanup(func() {
		if err, ok := errs.Load().(error); ok {
			t.Errorf("cut server: %v", err)
		}
	})
	return srv
}

func serveCut(c *wstest.RawConn) error {
	q := c.Request.URL.Query()
	num := func(k string, def int) int {
		if v, err := strconv.Atoi(q.Get(k)); err == nil {
			return v
		}
		return def
	}
	n, size, frag := num("n", 1), num("size", 64), num("frag", 1)
	op, ping := ws.OpBinary, q.Get("ping") == "1"
	if q.Get("op") == "text" {
		op = ws.OpText
	}
	var buf []byte
	for i := range n {
		buf = wstest.AppendStreamMessage(buf, op, i, size, frag, ping)
	}
	switch q.Get("cut") {
	case "hdr":
		buf = append(buf, wstest.AppendStreamMessage(nil, op, n, size, 1, false)[:1]...)
	case "frag":
		m := wstest.AppendStreamMessage(nil, op, n, size, 2, false)
		first := len(ws.AppendFrame(nil, false, op, make([]byte, size/2)))
		buf = append(buf, m[:first+(len(m)-first)/2]...)
	default: // payload
		m := wstest.AppendStreamMessage(nil, op, n, size, 1, false)
		buf = append(buf, m[:len(m)/2+1]...)
	}
	c.Conn.SetDeadline(time.Now().Add(hangGuard))
	if err := c.Write(buf); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if err := waitAcked(c.Conn); err != nil {
		return err
	}
	switch q.Get("end") {
	case "rst":
		return c.Reset()
	case "close":
		// FIN and gone: pongs the client still sends for the pings it
		// parses meet a reset, and its sends fail while frames are still
		// queued on its side.
		return c.Close()
	}
	c.Conn.(*net.TCPConn).CloseWrite()
	// Read (pongs for the pings it is still parsing) until the client
	// closes: closing with unread bytes would make our kernel reset.
	for {
		h, _, err := c.ReadFrame()
		if err != nil {
			return nil
		}
		if h.Op != ws.OpPong {
			return fmt.Errorf("client sent %v after our FIN", h.Op)
		}
	}
}

// waitAcked waits until nc's send queue is empty: every byte written has
// been acknowledged by the peer's kernel.
func waitAcked(nc net.Conn) error {
	rc, err := nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(hangGuard)
	for {
		var outq int
		var ierr error
		if err := rc.Control(func(fd uintptr) { outq, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }); err != nil {
			return err
		}
		if ierr != nil {
			return fmt.Errorf("SIOCOUTQ: %w", ierr)
		}
		if outq == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("send queue still holds %d bytes after %v", outq, hangGuard)
		}
		time.Sleep(time.Millisecond)
	}
}

func cutJob(base string, spec streamSpec, cut, end string) faultJob {
	op := "binary"
	if spec.text {
		op = "text"
	}
	u := fmt.Sprintf("%s/cut?n=%d&size=%d&op=%s&frag=%d&cut=%s&end=%s", base, spec.n, spec.size, op, max(spec.frag, 1), cut, end)
	if spec.ping {
		u += "&ping=1"
	}
	return faultJob{url: u, spec: spec, lost: true}
}

// ---- the scenarios ----

// TestFaultCQMinimum: the kernel accepts the 4-entry completion queue the
// overflow scenarios use (else the test reports the smallest it takes).
func TestFaultCQMinimum(t *testing.T) {
	for cq := uint32(4); cq <= 64; cq *= 2 {
		p, err := talaris.NewPool(testhook.WithKnobs(talaris.Config{}, testhook.Knobs{SQEntries: 2, CQEntries: cq}))
		if err == nil {
			p.Close()
			if cq != 4 {
				t.Errorf("a 4-entry CQ is refused; the smallest accepted is %d", cq)
			}
			return
		}
		t.Logf("CQEntries %d: %v", cq, err)
	}
	t.Fatal("no CQ size up to 64 accepted with SQEntries 2")
}

// TestFaultStreams: whole /stream runs (plain and TLS, sizes from 1 byte
// to several buffer slots, fragmented with pings) end with EventClose 1000
// after every message, under each fault configuration. Several
// connections stream at once, so the 4-entry CQ overflows.
func TestFaultStreams(t *testing.T) {
	plain := wstest.NewGorilla().Start(t)
	tlsSrv := wstest.NewCoder().StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
	specs := []streamSpec{
		{n: 400, size: 100},
		{n: 300, size: 1, text: true},
		{n: 30, size: 3000, frag: 3, ping: true, text: true},
		{n: 60, size: 700, ping: true},
	}
	for _, fc := range faultCfgs {
		t.Run(fc.name, func(t *testing.T) {
			p := newFaultPool(t, fc)
			for it := 0; moreFaultIters(it, fc, p); it++ {
				var jobs []faultJob
				for k, s := range specs {
					if k == 1 && it%2 == 1 {
						continue // vary the number of concurrent connections
					}
					jobs = append(jobs, faultJob{url: plain.URL + s.path(), spec: s})
				}
				s := specs[it%len(specs)]
				jobs = append(jobs, faultJob{url: tlsSrv.URL + s.path(), opts: tlsOpts, spec: s})
				runFaultJobs(t, p, jobs, fc.slow)
				if t.Failed() {
					t.Fatalf("iteration %d failed", it)
				}
			}
			checkFaultStats(t, fc, p)
		})
	}
	for _, srv := range []*wstest.Server{plain, tlsSrv} {
		if errs := srv.Errors(); len(errs) > 0 {
			t.Errorf("server errors: %v", errs)
		}
	}
}

// TestFaultCutMidFrame: the server sends N whole messages and part of the
// next (a lone header byte, half a payload, or one fragment of two), then
// a FIN or a reset (or a FIN and then a reset provoked by the client's
// pongs). The client delivers exactly N messages, then EventError with
// ErrConnectionLost and code 1006, every time.
func TestFaultCutMidFrame(t *testing.T) {
	srv := cutServer(t)
	type cut struct {
		spec streamSpec
		cut  string
	}
	cuts := []cut{
		{streamSpec{n: 300, size: 100}, "payload"},
		{streamSpec{n: 200, size: 50, text: true, ping: true}, "hdr"},
		{streamSpec{n: 40, size: 2000, frag: 3, ping: true}, "frag"},
		{streamSpec{n: 0, size: 5000}, "payload"}, // nothing whole at all
	}
	for _, fc := range faultCfgs {
		t.Run(fc.name, func(t *testing.T) {
			p := newFaultPool(t, fc)
			for it := 0; moreFaultIters(it, fc, p); it++ {
				var jobs []faultJob
				for k, c := range cuts {
					end := []string{"fin", "rst", "close"}[(it+k)%3]
					jobs = append(jobs, cutJob(srv.URL, c.spec, c.cut, end))
				}
				runFaultJobs(t, p, jobs, fc.slow)
				if t.Failed() {
					t.Fatalf("iteration %d failed", it)
				}
			}
			checkFaultStats(t, fc, p)
		})
	}
	if errs := srv.HandshakeErrors(); len(errs) > 0 {
		t.Errorf("handshake errors: %v", errs)
	}
}

// TestFaultTLSCutMidRecord: over TLS, the server sends N messages and then
// closes TCP without close_notify in the middle of a record (wstest /drop
// with trunc=1&partial=1), or right after a record (trunc=1). The client
// delivers exactly N, then EventError with ErrConnectionLost and 1006.
// Run it with both backends: go test ./ and go test -tags talaris_openssl ./.
func TestFaultTLSCutMidRecord(t *testing.T) {
	t.Logf("TLS backend %s", talaris.TLSBackend())
	cfg := serverTLS(t, testCertFile, testKeyFile, 0, 0)
	gor := wstest.NewGorilla().StartTLS(t, cfg)
	cod := wstest.NewCoder().StartTLS(t, cfg)
	specs := []streamSpec{{n: 500, size: 100}, {n: 20, size: 20000, text: true}, {n: 1, size: 1}}
	for _, fc := range faultCfgs {
		t.Run(fc.name, func(t *testing.T) {
			p := newFaultPool(t, fc)
			for it := 0; moreFaultIters(it, fc, p); it++ {
				var jobs []faultJob
				for k, s := range specs {
					srv := gor
					if (it+k)%2 == 1 {
						srv = cod
					}
					q := "&trunc=1&partial=1"
					if k == 2 && it%2 == 0 {
						q = "&trunc=1"
					}
					path := "/drop" + strings.TrimPrefix(s.path(), "/stream") + q
					jobs = append(jobs, faultJob{url: srv.URL + path, opts: tlsOpts, spec: s, lost: true})
				}
				runFaultJobs(t, p, jobs, fc.slow)
				if t.Failed() {
					t.Fatalf("iteration %d failed", it)
				}
			}
			checkFaultStats(t, fc, p)
		})
	}
	for _, srv := range []*wstest.Server{gor, cod} {
		if errs := srv.Errors(); len(errs) > 0 {
			t.Errorf("server errors: %v", errs)
		}
	}
}

// TestFaultMixed: everything at once on one pool with a 4-entry CQ, a
// 4-slot buffer ring and a slow consumer: clean streams, plain cuts (FIN
// and reset) and TLS cuts side by side, with synchronous Dials made while
// nobody pumps.
func TestFaultMixed(t *testing.T) {
	plain := wstest.NewGorilla().Start(t)
	tlsSrv := wstest.NewGorilla().StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
	cut := cutServer(t)
	fc := faultCfgs[len(faultCfgs)-1]
	p := newFaultPool(t, fc)
	for it := range faultIters() {
		s1 := streamSpec{n: 200, size: 64, ping: true}
		s2 := streamSpec{n: 100, size: 300, text: true}
		s3 := streamSpec{n: 300, size: 64}
		jobs := []faultJob{
			{url: plain.URL + s1.path(), spec: s1},
			{url: tlsSrv.URL + s2.path(), opts: tlsOpts, spec: s2},
			// No pings on a /drop: that server never reads the pongs, and
			// closing a socket with unread bytes resets it, destroying
			// frames still in flight.
			{url: tlsSrv.URL + "/drop" + strings.TrimPrefix(s3.path(), "/stream") + "&trunc=1&partial=1", opts: tlsOpts, spec: s3, lost: true},
			cutJob(cut.URL, s2, "payload", "fin"),
			cutJob(cut.URL, s1, "hdr", "rst"),
			cutJob(cut.URL, s1, "frag", "close"),
		}
		// A blocking Dial first, while nothing pumps: its events wait in
		// the ring.
		ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
		c, err := p.Dial(ctx, plain.URL+s2.path(), nil)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		st := newStreamState(s2)
		runFaultJobs(t, p, jobs, fc.slow, preDialed{c, st, "blocking dial " + s2.String()})
		if t.Failed() {
			t.Fatalf("iteration %d failed", it)
		}
	}
	checkFaultStats(t, fc, p)
}
