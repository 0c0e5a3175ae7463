//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// Helpers shared by the test files of this package, one file per concern:
// here pools, dials and pumps (newTestPool, dial, dialCtx, pumpUntil) and
// the in-process servers (forEachServer); the stream specs and checkers in
// streams_helpers_test.go; the sink, forEachTransport and the send races
// in sink_helpers_test.go; TLS peers in tls_helpers_test.go; probes of
// the process (descriptors, threads, freezes) in process_helpers_test.go.

// dialOpts opens a pool of cfg (hang-guarded) and dials url on it with opts.
func dialOpts(t *testing.T, cfg talaris.Config, url string, opts *talaris.DialOptions) (*talaris.Pool, talaris.Conn) {
	t.Helper()
	p := newTestPool(t, cfg, hangGuard)
	ctx, cancel := dialCtx(t)
	defer cancel()
	c, err := p.Dial(ctx, url, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p, c
}

// bgPump pumps p on its own goroutine until the pool closes or stop is
// called, and records c's final event.
type bgPump struct {
	done  chan struct{}
	mu    sync.Mutex
	final *finalEvent
	pongs int
}

func startPump(t *testing.T, p *talaris.Pool, c talaris.Conn) *bgPump {
	b := &bgPump{done: make(chan struct{})}
	go func() {
		defer close(b.done)
		for {
			_, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
				b.mu.Lock()
				defer b.mu.Unlock()
				switch ev.Kind {
				case talaris.EventPong:
					b.pongs++
				case talaris.EventClose, talaris.EventError:
					if cc == c {
						f := copyFinal(ev)
						b.final = &f
					}
				}
			})
			if err != nil {
				return
			}
			b.mu.Lock()
			end := b.final != nil
			b.mu.Unlock()
			if end {
				return
			}
		}
	}()
	return b
}

// wait waits for the pump to return (the final event, or the pool closed).
func (b *bgPump) wait(t *testing.T) *finalEvent {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(hangGuard):
		t.Fatal("pump did not return")
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.final
}

// memFrames returns n server frames (a mix of small text and binary
// messages) and the sum of the ids they carry.
func memFrames(n int) ([]byte, uint64) {
	var b []byte
	var sum uint64
	for i := range n {
		if i%3 == 0 {
			var p [8]byte
			for k := range 8 {
				p[k] = byte(uint64(i) >> (8 * k))
			}
			b = ws.AppendFrame(b, true, ws.OpBinary, p[:])
		} else {
			b = ws.AppendFrame(b, true, ws.OpText, []byte(fmt.Sprintf(`{"id":%d}`, i)))
		}
		sum += uint64(i)
	}
	return b, sum
}

// pumpFinal pumps until c's final event and returns it with the time the
// pump saw it; fn (if set) sees c's other events.
func pumpFinal(t testing.TB, p *talaris.Pool, c talaris.Conn, fn func(ev talaris.Event)) (finalEvent, time.Time) {
	t.Helper()
	var final *finalEvent
	var at time.Time
	for final == nil {
		if _, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
			if cc != c {
				return
			}
			if ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError {
				f := copyFinal(ev)
				final, at = &f, time.Now()
			} else if fn != nil {
				fn(ev)
			}
		}); err != nil {
			t.Fatalf("pump: %v", err)
		}
	}
	return *final, at
}

const hangGuard = 60 * time.Second

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
	if cfg.Loops == 0 && !cfg.Tuning.InlineLoop { // (an inline loop is one loop)
		cfg.Loops = testLoops
	}
	p, err := talaris.NewPool(cfg)
	if err != nil {
		t.Fatalf("NewPool(%+v): %v", cfg, err)
	}
	tm := time.AfterFunc(d, func() {
		t.Errorf("hang guard: test still running after %v; closing the pool (stats %+v)", d, testhook.Stats(p))
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
	Kind        talaris.EventKind
	Code        int
	Reason      string
	Err         error
	SendDropped uint64
}

func copyFinal(ev talaris.Event) finalEvent {
	return finalEvent{Kind: ev.Kind, Code: ev.Code, Reason: string(ev.Reason), Err: ev.Err, SendDropped: ev.SendDropped}
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

// recorded is one event as OnEvent or a DataFunc saw it, copied.
type recorded struct {
	c    talaris.Conn
	kind talaris.EventKind
	data string
	code int
	err  error
}

// smallPool is a Config cheap enough to create a thousand times.
func smallPool() talaris.Config {
	return testhook.WithKnobs(talaris.Config{ArenaSize: 1 << 20, MaxMessageSize: 1 << 18, BufCount: 64, MaxConns: 64, CloseTimeout: time.Second}, testhook.Knobs{EventRingSize: 1024, CmdRingSize: 1 << 16})
}

// refusedAddr returns a loopback address where connects are refused: a
// socket bound there without listening keeps anyone else off the port.
func refusedAddr(t *testing.T) string {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// freePort returns a loopback address nobody listens on right now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

const (
	bellEcho     bellPeer = iota // keep echoing
	bellStopRead                 // stop reading (and echoing), keep the connection
	bellReset                    // reset the connection (RST)
)

// delayedEcho starts a gorilla echo server that answers each message after
// delay, behaving as mode says once it has echoed after messages.
func delayedEcho(t *testing.T, delay time.Duration, mode bellPeer, after int) string {
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for i := 0; ; i++ {
			if i == after && mode != bellEcho {
				if mode == bellReset {
					if tc, ok := c.UnderlyingConn().(*net.TCPConn); ok {
						tc.SetLinger(0)
					}
					return
				}
				time.Sleep(hangGuard)
				return
			}
			op, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			time.Sleep(delay)
			if c.WriteMessage(op, msg) != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// bellDial opens a pool of cfg (hang-guarded) and dials url on it.
func bellDial(t *testing.T, cfg talaris.Config, url string) (*talaris.Pool, talaris.Conn) {
	t.Helper()
	return dialOpts(t, cfg, url, nil)
}

const (
	decodeMsgs  = 100_000
	decodeChunk = 4096
)

// decodeStream builds the server frames of the workload and the id sum.
func decodeStream(n int) ([]byte, uint64) {
	var out []byte
	var sum uint64
	var p []byte
	for i := range n {
		if i%3 == 0 {
			p = binary.LittleEndian.AppendUint64(p[:0], uint64(i))
			out = ws.AppendFrame(out, true, ws.OpBinary, p)
		} else {
			p = append(p[:0], `{"id":`...)
			p = strconv.AppendInt(p, int64(i), 10)
			p = append(p, '}')
			out = ws.AppendFrame(out, true, ws.OpText, p)
		}
		sum += uint64(i)
	}
	return out, sum
}

// msgID extracts the id of a workload message: a binary u64, or the
// digits after `{"id":` in a text message (parsed by hand).
func msgID(text bool, p []byte) uint64 {
	if !text {
		return binary.LittleEndian.Uint64(p)
	}
	var v uint64
	for _, c := range p[6:] {
		if c < '0' || c > '9' {
			break
		}
		v = v*10 + uint64(c-'0')
	}
	return v
}

// answerRequests accepts on ln until it is closed and, on a goroutine per
// connection, reads the upgrade request and runs answer, then closes the
// connection.
func answerRequests(ln net.Listener, answer func(nc net.Conn)) {
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				if _, err := http.ReadRequest(bufio.NewReader(nc)); err != nil {
					return
				}
				answer(nc)
			}()
		}
	}()
}

// fairServer starts a gorilla server over ws:// or wss:// and returns it
// with the DialOptions that trust it.
func fairServer(t *testing.T, useTLS bool) (*wstest.Server, *talaris.DialOptions) {
	t.Helper()
	srv := wstest.NewGorilla()
	return srv, startWS(t, useTLS, srv.Start, srv.StartTLS)
}

// schemes returns the subtests' URL schemes with the dial options each needs.
func schemes() []struct {
	name string
	opts talaris.DialOptions
} {
	return []struct {
		name string
		opts talaris.DialOptions
	}{{"ws", talaris.DialOptions{}}, {"wss", *tlsOpts}}
}

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
