//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// Reconnect tests (DialOptions.Reconnect, DialOptions.Subscribe): real
// servers on loopback, one of them a separate process that is killed with
// SIGKILL and restarted on the same port. Intervals are measured at the
// server, with generous bounds: the machine is small and shared.

// ---- event recording ----

// rcLog records one connection's non-data events (copied) and counts its
// data messages.
type rcLog struct {
	kinds  []talaris.EventKind
	evs    []talaris.Event
	ticks  int
	final  *talaris.Event
	others int // events of other handles
}

func (r *rcLog) fn(c talaris.Conn) talaris.EventFunc {
	return func(cc talaris.Conn, ev talaris.Event) {
		if cc != c {
			r.others++
			return
		}
		switch ev.Kind {
		case talaris.EventText, talaris.EventBinary:
			r.ticks++
			return
		case talaris.EventPing, talaris.EventPong:
			return
		}
		cp := ev
		cp.Payload = append([]byte(nil), ev.Payload...)
		cp.Reason = append([]byte(nil), ev.Reason...)
		r.kinds = append(r.kinds, ev.Kind)
		r.evs = append(r.evs, cp)
		if ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError {
			r.final = &cp
		}
	}
}

func (r *rcLog) count(k talaris.EventKind) int {
	n := 0
	for _, x := range r.kinds {
		if x == k {
			n++
		}
	}
	return n
}

func (r *rcLog) first(k talaris.EventKind) *talaris.Event {
	for i := range r.evs {
		if r.evs[i].Kind == k {
			return &r.evs[i]
		}
	}
	return nil
}

func (r *rcLog) last(k talaris.EventKind) *talaris.Event {
	for i := len(r.evs) - 1; i >= 0; i-- {
		if r.evs[i].Kind == k {
			return &r.evs[i]
		}
	}
	return nil
}

// ---- kill -9 and restart ----

// TestReconnectKillRestart: the server process is killed with SIGKILL and
// restarted on the same port; the handle reconnects by itself, the new
// server receives Subscribe again (before the application's own message),
// and the application sees EventReconnecting then EventOpen{Reconnects:
// 1}, with no final event in between, through Pump and through PumpData
// with Config.OnEvent. Sends in the gap return ErrReconnecting (not
// ErrWouldBlock), SendContext included; the application resends after
// EventOpen. ws:// and
// wss:// (run the package with and without -tags talaris_openssl for the
// two TLS backends). The loops2 rows reconnect a handle on the second of
// two loop threads (a memory connection holds the first).
func TestReconnectKillRestart(t *testing.T) {
	for _, tlsOn := range []bool{false, true} {
		name := "ws"
		if tlsOn {
			name = "wss-" + talaris.TLSBackend()
		}
		for _, data := range []bool{false, true} {
			pump := "/Pump"
			if data {
				pump = "/PumpData+OnEvent"
			}
			t.Run(name+pump, func(t *testing.T) { testKillRestart(t, tlsOn, data, talaris.Config{}) })
		}
		t.Run(name+"/Pump/loops2", func(t *testing.T) { testKillRestart(t, tlsOn, false, talaris.Config{Loops: 2}) })
		t.Run(name+"/Pump/nobundle", func(t *testing.T) {
			testKillRestart(t, tlsOn, false, testhook.WithKnobs(talaris.Config{}, testhook.Knobs{NoRecvBundle: true}))
		})
	}
}

// testKillRestart runs the kill -9 and restart with a pool built from cfg.
func testKillRestart(t *testing.T, tlsOn, data bool, cfg talaris.Config) {
	addr := freePort(t)
	a := startSrvProc(t, addr, tlsOn)
	var log rcLog
	var c talaris.Conn
	loops := cfg.Loops
	if data {
		cfg.OnEvent = func(cc talaris.Conn, ev talaris.Event) { log.fn(c)(cc, ev) }
	}
	p := newTestPool(t, cfg, hangGuard)
	if loops > 1 {
		if _, err := p.DialMemory(); err != nil { // takes loop 0
			t.Fatal(err)
		}
	}
	// pumpUntil: Pump with the log's EventFunc, or PumpData counting the
	// data while OnEvent logs the rest.
	pumpUntil := func(t *testing.T, p *talaris.Pool, fn talaris.EventFunc, done func() bool, _ func()) {
		t.Helper()
		for !done() {
			var err error
			if data {
				_, err = p.PumpData(func(cc talaris.Conn, _ talaris.Opcode, _ []byte) {
					if cc == c {
						log.ticks++
					} else {
						log.others++
					}
				})
			} else {
				_, err = p.Pump(fn)
			}
			if err != nil {
				t.Fatalf("pump: %v", err)
			}
		}
	}
	url := "ws://" + addr + "/feed"
	opts := &talaris.DialOptions{
		Reconnect: &talaris.ReconnectPolicy{MinDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond},
		Subscribe: [][]byte{[]byte(`{"op":"subscribe","ch":"trades"}`), []byte("second")},
	}
	if tlsOn {
		url = "wss://" + addr + "/feed"
		opts.TLS = talaris.TLSOptions{RootCAFile: testCAFile}
	}
	ctx, cancel := dialCtx(t)
	defer cancel()
	var err error
	c, err = p.Dial(ctx, url, opts)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	if l := testhook.ConnLoop(p, c.Slot()); loops > 1 && l != 1 {
		t.Fatalf("the handle is on loop %d, want 1", l)
	}
	// Subscribe goes first, then what the application sends.
	if err := c.SendText([]byte("app-1")); err != nil {
		t.Fatal(err)
	}
	a.waitLine("MSG 1 app-1")
	_, before := a.waitLine("MSG 1 app-1")
	wantSubs(t, "first server", before, 1)

	pumpUntil(t, p, log.fn(c), func() bool { return log.count(talaris.EventOpen) == 1 && log.ticks >= 3 }, nil)
	if ev := log.last(talaris.EventOpen); ev.Reconnects != 0 {
		t.Errorf("first EventOpen: Reconnects = %d, want 0", ev.Reconnects)
	}

	a.kill()
	pumpUntil(t, p, log.fn(c), func() bool { return log.count(talaris.EventReconnecting) >= 1 }, nil)
	rev := log.first(talaris.EventReconnecting) // (refused attempts may follow in the same batch)
	if !errors.Is(rev.Err, talaris.ErrConnectionLost) && !errors.Is(rev.Err, talaris.ErrClosed) {
		t.Errorf("EventReconnecting after SIGKILL: Err = %v, want ErrConnectionLost", rev.Err)
	}
	if rev.Delay < 20*time.Millisecond || rev.Delay > 200*time.Millisecond {
		t.Errorf("EventReconnecting Delay = %v, want within [20ms, 200ms]", rev.Delay)
	}
	// The server is gone: every send in the gap is refused, nothing queued.
	for name, send := range map[string]func() error{
		"SendText":  func() error { return c.SendText([]byte("in-the-gap")) },
		"SendBatch": func() error { return c.SendBatch(talaris.OpText, [][]byte{[]byte("in-the-gap")}) },
		"Ping":      func() error { return c.Ping(nil) },
		"SendContext": func() error {
			return c.SendContext(context.Background(), talaris.OpText, []byte("in-the-gap"))
		},
	} {
		if err := send(); !errors.Is(err, talaris.ErrReconnecting) || errors.Is(err, talaris.ErrWouldBlock) {
			t.Errorf("%s in the gap: %v, want ErrReconnecting (not ErrWouldBlock)", name, err)
		}
	}
	if st := c.State(); st >= talaris.StateOpen {
		t.Errorf("State in the gap = %v, want one before open", st)
	}
	if n := c.Stats().SendQueueFull; n != 0 {
		t.Errorf("SendQueueFull = %d: the gap's refusals counted as a full queue", n)
	}

	b := startSrvProc(t, addr, tlsOn)
	ticksBefore := log.ticks
	pumpUntil(t, p, log.fn(c), func() bool {
		return log.count(talaris.EventOpen) == 2 && log.ticks >= ticksBefore+3
	}, nil)
	if log.final != nil {
		t.Fatalf("final event %+v before the reconnect", *log.final)
	}
	// Order: Open, then one or more Reconnecting (the drop, then refused
	// attempts while no server listened), then Open{Reconnects: 1}.
	if log.kinds[0] != talaris.EventOpen || log.kinds[len(log.kinds)-1] != talaris.EventOpen {
		t.Fatalf("event order %v", log.kinds)
	}
	for _, k := range log.kinds[1 : len(log.kinds)-1] {
		if k != talaris.EventReconnecting {
			t.Fatalf("event order %v: want Open, Reconnecting..., Open", log.kinds)
		}
	}
	if ev := log.last(talaris.EventOpen); ev.Reconnects != 1 {
		t.Errorf("second EventOpen: Reconnects = %d, want 1", ev.Reconnects)
	}
	// After EventOpen the application decides what to resend.
	if err := c.SendText([]byte("after-gap")); err != nil {
		t.Fatalf("SendText after EventOpen: %v", err)
	}
	if err := c.SendText([]byte("app-2")); err != nil {
		t.Fatalf("SendText after the reconnect: %v", err)
	}
	_, glines := b.waitLine("MSG 1 after-gap")
	wantSubs(t, "restarted server", glines, 1)
	_, blines := b.waitLine("MSG 1 app-2")
	// The dropped socket's output was retired: admission starts empty.
	if q := waitSendQueuedDrained(t, c).SendQueued; q != 0 {
		t.Errorf("SendQueued after the reconnect and delivery = %d, want 0", q)
	}
	for _, l := range blines {
		if strings.Contains(l, "in-the-gap") {
			t.Errorf("a message refused in the gap reached the server: %q", l)
		}
	}
	if st := c.Stats(); st.Reconnects != 1 || st.MsgsOut != 7 {
		t.Errorf("ConnStats Reconnects %d, MsgsOut %d; want 1 and 7 (Subscribe twice, app-1, after-gap, app-2; not the refused send)", st.Reconnects, st.MsgsOut)
	}
	if ps, m := testhook.Stats(p), p.Metrics(); ps.Reconnects != 1 || m.Reconnects != 1 {
		t.Errorf("PoolStats.Reconnects = %d, Metrics.Reconnects = %d, want 1", ps.Reconnects, m.Reconnects)
	}
	if c.State() != talaris.StateOpen {
		t.Errorf("State after the reconnect = %v", c.State())
	}

	// Close stops the policy: the handle ends with EventClose, no new
	// connection reaches the server.
	if err := c.Close(talaris.CloseNormal, "bye"); err != nil {
		t.Fatal(err)
	}
	pumpUntil(t, p, log.fn(c), func() bool { return log.final != nil }, nil)
	if log.final.Kind != talaris.EventClose || log.final.Code != talaris.CloseNormal {
		t.Errorf("final event %+v, want EventClose 1000", *log.final)
	}
	if wantOthers := min(loops/2, 1); log.others != wantOthers { // (the memory connection's EventOpen)
		t.Errorf("%d events for other handles, want %d", log.others, wantOthers)
	}
	b.mu.Lock()
	for _, l := range b.lines {
		if strings.HasPrefix(l, "OPEN 2") {
			t.Errorf("a connection after Close reached the server")
		}
	}
	b.mu.Unlock()
}

// wantSubs checks that the server's lines for connection n start with the
// two Subscribe messages, in order.
func wantSubs(t *testing.T, who string, lines []string, n int) {
	t.Helper()
	var msgs []string
	pre := fmt.Sprintf("MSG %d ", n)
	for _, l := range lines {
		if strings.HasPrefix(l, pre) {
			msgs = append(msgs, strings.TrimPrefix(l, pre))
		}
	}
	want := []string{`{"op":"subscribe","ch":"trades"}`, "second"}
	if len(msgs) != 2 || msgs[0] != want[0] || msgs[1] != want[1] {
		t.Errorf("%s received %q before the application's message, want %q", who, msgs, want)
	}
}

// TestReconnectCycles: 1,000 drop/reconnect cycles (100 under -short)
// against a server that upgrades, sends one message and closes. File
// descriptors, threads and RSS do not grow.
func TestReconnectCycles(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 100
	}
	srv := wstest.NewRaw(func(c *wstest.RawConn) {
		c.WriteFrame(true, ws.OpText, []byte("hello"))
	}).Start(t)
	p := newTestPool(t, talaris.Config{}, hangGuard)
	c, err := p.DialAsync(srv.URL, &talaris.DialOptions{
		Reconnect: &talaris.ReconnectPolicy{MinDelay: time.Millisecond, MaxDelay: time.Millisecond},
		Subscribe: [][]byte{[]byte("sub")}})
	if err != nil {
		t.Fatal(err)
	}
	var log rcLog
	total := 0 // EventOpen seen
	pump := func(k int) {
		for log.final == nil {
			before := log.count(talaris.EventOpen)
			if _, err := p.Pump(log.fn(c)); err != nil {
				t.Fatalf("Pump: %v", err)
			}
			total += log.count(talaris.EventOpen) - before
			log.kinds, log.evs = nil, nil // keep the log small over many cycles
			if total >= k {
				return
			}
		}
	}
	pump(50) // warm up: buffers, TLS-free paths, Go runtime threads
	runtime.GC()
	fd0, th0, rss0 := procCounts(t)
	pump(50 + n)
	if log.final != nil {
		t.Fatalf("final event %+v after %d opens", *log.final, total)
	}
	runtime.GC()
	fd1, th1, rss1 := procCounts(t)
	t.Logf("%d cycles: fds %d -> %d, threads %d -> %d, RSS %d -> %d KiB", total-50, fd0, fd1, th0, th1, rss0, rss1)
	if fd1 > fd0+8 {
		t.Errorf("fds grew from %d to %d over %d reconnects", fd0, fd1, n)
	}
	if th1 > th0+4 {
		t.Errorf("threads grew from %d to %d over %d reconnects", th0, th1, n)
	}
	if rss1 > rss0+32<<10 {
		t.Errorf("RSS grew from %d to %d KiB over %d reconnects", rss0, rss1, n)
	}
	if got := c.Stats().Reconnects; got < uint64(n) {
		t.Errorf("ConnStats.Reconnects = %d, want >= %d", got, n)
	}
	if err := c.Close(talaris.CloseNormal, ""); err != nil && !errors.Is(err, talaris.ErrClosed) {
		t.Fatal(err)
	}
	pumpUntil(t, p, log.fn(c), func() bool { return log.final != nil }, nil)
}

var statusRe = regexp.MustCompile(`(?m)^(Threads|VmRSS):\s+(\d+)`)

// procCounts returns the process's open fds, threads and RSS (KiB).
func procCounts(t *testing.T) (fds, threads, rssKiB int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range statusRe.FindAllStringSubmatch(string(st), -1) {
		v, _ := strconv.Atoi(m[2])
		if m[1] == "Threads" {
			threads = v
		} else {
			rssKiB = v
		}
	}
	return len(ents), threads, rssKiB
}

// TestReconnectServerClose: a close frame from the server (a venue's
// maintenance close) is not final under a policy: EventReconnecting
// carries the server's code and reason (Err wraps ErrClosed), then the
// handle re-opens.
func TestReconnectServerClose(t *testing.T) {
	t.Run("default", func(t *testing.T) { reconnectServerClose(t, talaris.Config{}) })
	// The inline loop (Config.Tuning.InlineLoop) runs the backoff's timer and the
	// new dial from the pump's own calls.
	t.Run("inline", func(t *testing.T) { reconnectServerClose(t, talaris.Config{Tuning: talaris.Tuning{InlineLoop: true}}) })
}

func reconnectServerClose(t *testing.T, cfg talaris.Config) {
	var mu sync.Mutex
	n := 0
	srv := wstest.NewRaw(func(c *wstest.RawConn) {
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		if i == 1 {
			c.WriteClose(talaris.CloseServiceRestart, "maintenance")
			c.ExpectClose()
			return
		}
		if code, _, err := c.ExpectClose(); err == nil {
			c.WriteClose(code, "")
		}
	}).Start(t)
	p := newTestPool(t, cfg, hangGuard)
	ctx, cancel := dialCtx(t)
	defer cancel()
	c, err := p.Dial(ctx, srv.URL, &talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MinDelay: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	var log rcLog
	pumpUntil(t, p, log.fn(c), func() bool { return log.count(talaris.EventOpen) == 2 || log.final != nil }, nil)
	if len(log.kinds) != 3 || log.kinds[1] != talaris.EventReconnecting {
		t.Fatalf("events %v, want open, reconnecting, open", log.kinds)
	}
	ev := log.evs[1]
	if !errors.Is(ev.Err, talaris.ErrClosed) || ev.Code != talaris.CloseServiceRestart || string(ev.Reason) != "maintenance" ||
		ev.Delay != 10*time.Millisecond {
		t.Errorf("EventReconnecting %+v (reason %q), want ErrClosed, code 1012, reason \"maintenance\", Delay 10ms", ev, ev.Reason)
	}
	if log.evs[2].Reconnects != 1 {
		t.Errorf("EventOpen.Reconnects = %d, want 1", log.evs[2].Reconnects)
	}
	c.Close(talaris.CloseNormal, "")
	pumpUntil(t, p, log.fn(c), func() bool { return log.final != nil }, nil)
	if log.final.Kind != talaris.EventClose {
		t.Errorf("final %+v, want EventClose", *log.final)
	}
}

// TestReconnectRingFull: the drop happens while the event ring is full
// (a server sends about a ring's worth of messages and closes TCP, nobody
// pumps): EventReconnecting waits for room like any event, and the order
// holds - every message, then EventReconnecting, then
// EventOpen{Reconnects: 1}.
func TestReconnectRingFull(t *testing.T) {
	const ring = 256
	for _, msgs := range []int{ring - 2, ring - 1, ring} {
		t.Run(strconv.Itoa(msgs), func(t *testing.T) {
			var burst []byte
			for i := 0; i < msgs; i++ {
				burst = ws.AppendFrame(burst, true, ws.OpText, []byte(strconv.Itoa(i)))
			}
			srv := wstest.NewRaw(func(c *wstest.RawConn) { c.Write(burst) }).Start(t)
			p := newTestPool(t, testhook.WithKnobs(talaris.Config{}, testhook.Knobs{EventRingSize: ring}), hangGuard)
			c, err := p.DialAsync(srv.URL, &talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MinDelay: 5 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond) // not pumping: let the ring fill (no assertion on time)
			var seq []string
			opens := 0
			pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
				switch ev.Kind {
				case talaris.EventText:
					if opens == 1 {
						seq = append(seq, string(ev.Payload))
					}
				case talaris.EventOpen:
					opens++
					if opens == 2 && ev.Reconnects != 1 {
						t.Errorf("second open: Reconnects %d", ev.Reconnects)
					}
				case talaris.EventReconnecting:
					if opens == 1 {
						seq = append(seq, "R")
					}
				case talaris.EventClose, talaris.EventError:
					t.Fatalf("final event %v: %v", ev.Kind, ev.Err)
				}
			}, func() bool { return opens == 2 }, nil)
			if len(seq) != msgs+1 || seq[msgs] != "R" {
				t.Fatalf("first connection delivered %d events ending %q, want %d messages then EventReconnecting", len(seq), seq[max(0, len(seq)-2):], msgs)
			}
			for i := 0; i < msgs; i++ {
				if seq[i] != strconv.Itoa(i) {
					t.Fatalf("message %d is %q", i, seq[i])
				}
			}
			c.Close(talaris.CloseNormal, "")
		})
	}
}

// TestSubscribeOnce: without a policy, Subscribe is sent once, right after
// the upgrade and before the application's first message; a drop is then
// final.
func TestSubscribeOnce(t *testing.T) {
	got := make(chan []string, 1)
	srv := wstest.NewRaw(func(c *wstest.RawConn) {
		var msgs []string
		for len(msgs) < 3 {
			_, b, err := c.ReadMessage()
			if err != nil {
				break
			}
			msgs = append(msgs, string(b))
		}
		got <- msgs
		// Return: the connection drops without a close frame.
	}).Start(t)
	p := newTestPool(t, talaris.Config{}, hangGuard)
	ctx, cancel := dialCtx(t)
	defer cancel()
	c, err := p.Dial(ctx, srv.URL, &talaris.DialOptions{Subscribe: [][]byte{[]byte("s1"), []byte("s2")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SendText([]byte("app")); err != nil {
		t.Fatal(err)
	}
	msgs := <-got
	if strings.Join(msgs, ",") != "s1,s2,app" {
		t.Errorf("server received %q, want s1, s2, app", msgs)
	}
	var log rcLog
	pumpUntil(t, p, log.fn(c), func() bool { return log.final != nil }, nil)
	if log.count(talaris.EventReconnecting) != 0 || log.final.Kind != talaris.EventError || !errors.Is(log.final.Err, talaris.ErrConnectionLost) {
		t.Errorf("events %v, final %+v: want one open and a final ErrConnectionLost", log.kinds, *log.final)
	}
	if log.evs[0].Kind != talaris.EventOpen || log.evs[0].Reconnects != 0 {
		t.Errorf("first event %+v, want EventOpen with Reconnects 0", log.evs[0])
	}
}

// TestReconnectLogged: Config.Logger gets a Warn "talaris: reconnecting"
// record per EventReconnecting (delay, attempt since the last open, error
// class), written by the pump (PumpData here: the records do not depend
// on the pump taking an EventFunc), and the re-open is logged as open.
func TestReconnectLogged(t *testing.T) {
	var out syncBuffer
	logger := slog.New(slog.NewJSONHandler(&out, nil))
	srv := startAcceptLog(t, func(i int, nc net.Conn) {
		key, err := readRequest(nc)
		if err != nil || i == 1 {
			return // the second attempt fails: connection lost during the upgrade
		}
		upgrade(nc, key)
		if i == 0 {
			return // the first connection drops once open
		}
		nc.Write(ws.AppendFrame(nil, true, ws.OpText, []byte("back")))
		io.Copy(io.Discard, nc)
	})
	p := newTestPool(t, talaris.Config{Logger: logger, Name: "rc"}, hangGuard)
	c, err := p.DialAsync(srv.url(), &talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MinDelay: 20 * time.Millisecond, MaxDelay: 20 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	got := ""
	for got == "" {
		if _, err := p.PumpData(func(cc talaris.Conn, _ talaris.Opcode, b []byte) {
			if cc == c {
				got = string(b)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if got != "back" {
		t.Fatalf("message %q", got)
	}
	var recs []map[string]any
	for _, r := range out.records(t) {
		if r["msg"] == "talaris: reconnecting" {
			recs = append(recs, r)
		}
	}
	if len(recs) != 2 {
		t.Fatalf("%d reconnecting records, want 2: %v", len(recs), recs)
	}
	for i, r := range recs {
		if r["level"] != "WARN" || r["pool"] != "rc" || r["class"] != "connection_lost" ||
			r["attempt"] != float64(i+1) || r["delay"] != float64(20*time.Millisecond) {
			t.Errorf("reconnecting record %d: %v; want WARN, pool rc, class connection_lost, attempt %d, delay 20ms", i, r, i+1)
		}
	}
	c.Close(talaris.CloseNormal, "")
}

// TestReconnectAbort: Conn.Abort stops the reconnecting like Close: during
// a 30 s backoff wait it ends the handle at once, and on an open handle
// the final event is EventError wrapping ErrAborted with no new attempt.
func TestReconnectAbort(t *testing.T) {
	p := newTestPool(t, talaris.Config{}, hangGuard)
	pol := &talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MinDelay: 30 * time.Second}}
	c, err := p.DialAsync("ws://"+freePort(t)+"/", pol)
	if err != nil {
		t.Fatal(err)
	}
	var log rcLog
	pumpUntil(t, p, log.fn(c), func() bool { return log.count(talaris.EventReconnecting) == 1 }, nil)
	start := time.Now()
	if err := c.Abort(); err != nil {
		t.Fatal(err)
	}
	pumpUntil(t, p, log.fn(c), func() bool { return log.final != nil }, nil)
	if el := time.Since(start); el > 5*time.Second || log.final.Kind != talaris.EventError || !errors.Is(log.final.Err, talaris.ErrAborted) {
		t.Errorf("Abort in the backoff wait: final %+v after %v, want EventError wrapping ErrAborted at once", *log.final, el)
	}

	srv := startAcceptLog(t, func(_ int, nc net.Conn) {
		if key, err := readRequest(nc); err == nil {
			upgrade(nc, key)
			io.Copy(io.Discard, nc)
		}
	})
	ctx, cancel := dialCtx(t)
	defer cancel()
	c2, err := p.Dial(ctx, srv.url(), &talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MinDelay: time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	var log2 rcLog
	if err := c2.Abort(); err != nil {
		t.Fatal(err)
	}
	pumpUntil(t, p, log2.fn(c2), func() bool { return log2.final != nil }, nil)
	if log2.count(talaris.EventReconnecting) != 0 || log2.final.Kind != talaris.EventError || !errors.Is(log2.final.Err, talaris.ErrAborted) {
		t.Errorf("Abort of an open handle: events %v, final %+v; want no reconnect, ErrAborted", log2.kinds, *log2.final)
	}
	if n := len(srv.accepted()); n != 1 {
		t.Errorf("%d connections reached the server, want 1 (no reconnect after Abort)", n)
	}
}

// TestReconnectReadTimeout: the heartbeat and the policy together. The
// server process is stopped (SIGSTOP: TCP stays up, nothing flows), the
// read timeout fails the connection, the handle reconnects by itself
// (EventReconnecting wrapping ErrReadTimeout) and, once the server runs
// again (SIGCONT), opens again with Reconnects 1 and Subscribe re-sent.
func TestReconnectReadTimeout(t *testing.T) {
	addr := freePort(t)
	srv := startSrvProc(t, addr, false)
	p := newTestPool(t, talaris.Config{}, hangGuard)
	ctx, cancel := dialCtx(t)
	defer cancel()
	c, err := p.Dial(ctx, "ws://"+addr+"/", &talaris.DialOptions{
		PingInterval: 100 * time.Millisecond, ReadTimeout: 300 * time.Millisecond, HandshakeTimeout: time.Second,
		Reconnect: &talaris.ReconnectPolicy{MinDelay: 50 * time.Millisecond, MaxDelay: 200 * time.Millisecond},
		Subscribe: [][]byte{[]byte("sub")}})
	if err != nil {
		t.Fatal(err)
	}
	srv.waitLine("MSG 1 sub")
	var log rcLog
	pumpUntil(t, p, log.fn(c), func() bool { return log.ticks >= 3 }, nil)
	if err := srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			srv.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	pumpUntil(t, p, log.fn(c), func() bool { return log.count(talaris.EventReconnecting) >= 1 || log.final != nil }, nil)
	if ev := log.first(talaris.EventReconnecting); ev == nil || !errors.Is(ev.Err, talaris.ErrReadTimeout) {
		t.Fatalf("events %v: want EventReconnecting wrapping ErrReadTimeout", log.kinds)
	}
	srv.cmd.Process.Signal(syscall.SIGCONT)
	resumed = true
	pumpUntil(t, p, log.fn(c), func() bool { return log.count(talaris.EventOpen) == 2 || log.final != nil }, nil)
	if log.final != nil {
		t.Fatalf("final event %+v; events %v", *log.final, log.kinds)
	}
	if ev := log.last(talaris.EventOpen); ev.Reconnects != 1 {
		t.Errorf("EventOpen.Reconnects = %d, want 1", ev.Reconnects)
	}
	// The server may have accepted attempts that timed out while it was
	// stopped: find the connection the application's message arrived on
	// and check that Subscribe came first there.
	if err := c.SendText([]byte("after")); err != nil {
		t.Fatal(err)
	}
	line, before := srv.waitMatch("MSG n after", func(l string) bool {
		return strings.HasPrefix(l, "MSG ") && strings.HasSuffix(l, " after")
	})
	n := strings.Fields(line)[1]
	if n == "1" {
		t.Fatalf("the message after the reconnect arrived on the first connection")
	}
	found := false
	for _, l := range before {
		found = found || l == "MSG "+n+" sub"
	}
	if !found {
		t.Errorf("connection %s: Subscribe not received before the application's message; lines %q", n, before)
	}
	c.Close(talaris.CloseNormal, "")
	pumpUntil(t, p, log.fn(c), func() bool { return log.final != nil }, nil)
}
