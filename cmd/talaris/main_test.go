//go:build linux

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testcerts"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
	"golang.org/x/sys/unix"
)

// startTestFeed runs the feed server's plain listener in this process.
func startTestFeed(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go acceptLoop(ln)
	return ln.Addr().String()
}

// TestFeedCounts: a bounded flood of sequence-numbered frames arrives
// complete, in order and counted exactly, through talaris and through a Go
// peer (gorilla), followed by the server's close.
func TestFeedCounts(t *testing.T) {
	addr := startTestFeed(t)
	const n, size = 100000, 64
	url := fmt.Sprintf("ws://%s/flood?size=%d&n=%d", addr, size, n)

	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.Dial(ctx, url, nil); err != nil {
		t.Fatal(err)
	}
	chk := wstest.NewChecker(size)
	closed := false
	for !closed {
		if _, err := p.Pump(func(_ talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventBinary:
				if err := chk.Check(ev.Payload); err != nil {
					t.Fatal(err)
				}
			case talaris.EventClose:
				if ev.Code != 1000 {
					t.Errorf("close code %d", ev.Code)
				}
				closed = true
			case talaris.EventError:
				t.Fatal(ev.Err)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if chk.Count() != n {
		t.Fatalf("talaris: %d frames, want %d", chk.Count(), n)
	}

	for _, peer := range goPeers[:2] { // gorilla, gobwas
		pc, err := peer.dial(ctx, url, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		chk := wstest.NewChecker(size)
		pc.run(func(_ bool, pl []byte) {
			if err := chk.Check(pl); err != nil {
				t.Fatal(err)
			}
		})
		pc.close()
		if chk.Count() != n || chk.Sum() != wstest.StreamSum(ws.OpBinary, n, size) {
			t.Fatalf("%s: %d frames, want %d", peer.name, chk.Count(), n)
		}
	}
}

// TestBenchHarness runs the bench's own ingress, latency, rtt, floor and
// decode code paths briefly and checks the accounting, not the speed.
// TestBenchWindowsNeverEmpty: a latency, rtt or orders window closes
// only once it holds a sample, and the orders window opens only once S
// is stuck. A stall under load (a descheduled VM, a busy box) longer than
// the window, straddling it, is what emptied it ("talaris latency: no
// frames" in TestBenchHarness; reproduced with a 300 ms SIGSTOP of the
// process across the warm-up's end): the clock is read only between pump
// calls and round trips. A 1 ns window is the same case without the
// stall: shorter than any gap between two looks at the clock, it is
// always straddled. (The Go peers' rtt and orders loops record the round
// trip that ends their window, read with the one clock read that ends
// it, so they never close empty.)
func TestBenchWindowsNeverEmpty(t *testing.T) {
	addr := startTestFeed(t)
	b := &bench{warm: 20 * time.Millisecond, latDur: time.Nanosecond, rttDur: time.Nanosecond, loopCPU: -1, clientCPU: -1,
		feed: &feedProc{WS: addr}, ordersDur: time.Nanosecond, stallBytes: 1 << 20}
	paced, echo := "ws://"+addr+"/paced?size=64&rate=5000", "ws://"+addr+"/echo"
	for _, tc := range []struct {
		name string
		run  func() (Result, error)
	}{
		{"talaris latency", func() (Result, error) { return b.talLatency("latency", variant("block"), paced) }},
		{"talaris rtt", func() (Result, error) { return b.talLatency("rtt", variant("block"), echo) }},
		{"gorilla latency", func() (Result, error) { return b.peerLatency("latency", goPeers[0], paced) }},
		{"gorilla rtt", func() (Result, error) { return b.peerLatency("rtt", goPeers[0], echo) }},
		{"talaris orders", func() (Result, error) { return b.talOrders(variant("default")) }},
		{"gorilla orders", func() (Result, error) { return b.peerOrders(goPeers[0]) }},
	} {
		r, err := tc.run()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if r.Frames == 0 || r.Count == 0 {
			t.Fatalf("%s: %d frames, %d samples in a 1 ns window", tc.name, r.Frames, r.Count)
		}
		if tc.name == "talaris orders" && !strings.Contains(r.Note, "S accepted 1.0 MiB") {
			t.Fatalf("talaris orders: the window opened before S was stuck: %q", r.Note)
		}
	}
}

func TestBenchHarness(t *testing.T) {
	addr := startTestFeed(t)
	b := &bench{warm: 50 * time.Millisecond, dur: 200 * time.Millisecond, latDur: 200 * time.Millisecond, rttDur: 100 * time.Millisecond,
		rate: 5000, decodeN: 3000, decodeRounds: 1, loopCPU: -1, clientCPU: -1}
	flood := "ws://" + addr + "/flood?size=64"
	check := func(name string, r Result, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if r.Frames == 0 {
			t.Fatalf("%s: no frames", name)
		}
		if r.Workload == "ingress" && r.Bytes != r.Frames*64 {
			t.Fatalf("%s: %d bytes for %d frames of 64 B", name, r.Bytes, r.Frames)
		}
	}
	r, err := b.talIngress(variant("spin-then-block"), flood, 2, nil, 0)
	r.Workload = "ingress"
	check("talaris ingress", r, err)
	// Per-thread CPU: both the loop and the pump worked,
	// and the threads account for no more than the process did.
	r.finish()
	if r.LoopCPUSecs <= 0 || r.PumpCPUSecs <= 0 || r.CeilingFPS <= 0 {
		t.Fatalf("talaris ingress per-thread CPU: loop %v pump %v ceiling %v", r.LoopCPUSecs, r.PumpCPUSecs, r.CeilingFPS)
	}
	if th := r.LoopCPUSecs + r.PumpCPUSecs + r.OtherCPUSecs; th > r.CPUSecs+0.011 {
		t.Fatalf("threads %.4f s > process %.4f s", th, r.CPUSecs)
	}
	r, err = b.peerIngress(goPeers[1], flood, 2, false)
	r.Workload = "ingress"
	check("gobwas ingress", r, err)
	r, err = b.floor(addr, "/flood?size=64", 64, 1, false)
	r.Workload = "ingress"
	check("floor", r, err)
	r, err = b.talLatency("latency", variant("block"), "ws://"+addr+"/paced?size=64&rate=5000")
	check("talaris latency", r, err)
	r, err = b.talLatency("rtt", variant("block"), "ws://"+addr+"/echo")
	check("talaris rtt", r, err)
	r, err = b.peerLatency("rtt", goPeers[2], "ws://"+addr+"/echo")
	check("gws rtt", r, err)
	// orders and idle: the accounting, on the in-process feed.
	b.feed = &feedProc{WS: addr}
	b.ordersDur, b.idleDur, b.stallBytes = 200*time.Millisecond, 200*time.Millisecond, 1<<20
	r, err = b.talOrders(variant("default"))
	check("talaris orders", r, err)
	if r.Count == 0 || !strings.Contains(r.Note, "S accepted 1.0 MiB") {
		t.Fatalf("talaris orders: %d samples, note %q", r.Count, r.Note)
	}
	r, err = b.peerOrders(goPeers[0])
	check("gorilla orders", r, err)
	for _, v := range []string{"default", "spin"} {
		r, err = b.talIdle(variant(v))
		if err != nil || r.Secs < 0.19 {
			t.Fatalf("idle %s: %v, %v s", v, err, r.Secs)
		}
		t.Logf("idle %s: %.2f %% of a CPU", v, idlePct(r))
	}
	r, err = b.talDecode(0, 1)
	check("talaris decode", r, err)
	r, err = b.talDecoder(1)
	check("talaris-decoder decode", r, err)
	for _, p := range goPeers {
		r, err = b.peerDecode(p, 1)
		check(p.name+" decode", r, err)
	}
	// Interleaved rounds: each client's best, an error kept per client.
	calls := map[string]int{}
	d := &decodeRounds{n: 3, rounds: []decodeRound{
		{"a", func() (Result, error) { calls["a"]++; return Result{NsPerMsg: float64(10 - calls["a"])}, nil }},
		{"b", func() (Result, error) { calls["b"]++; return Result{}, fmt.Errorf("round %d", calls["b"]) }},
	}}
	if r, err := d.best("a"); err != nil || r.NsPerMsg != 7 || calls["a"] != 3 {
		t.Errorf("decodeRounds a: %+v, %v after %d calls; want 7 ns after 3", r, err, calls["a"])
	}
	if _, err := d.best("b"); err == nil || calls["b"] != 1 {
		t.Errorf("decodeRounds b: %v after %d calls; want the first round's error, no more calls", err, calls["b"])
	}
	// Latency rounds: interleaved, d/n each, samples and counts merged.
	var order []string
	rec := func(name string, v int64) func(time.Duration, *hdrhistogram.Histogram, *testhook.PoolStats) (Result, error) {
		return func(d time.Duration, h *hdrhistogram.Histogram, st *testhook.PoolStats) (Result, error) {
			order = append(order, name)
			if d != 100*time.Millisecond {
				t.Errorf("latRounds %s: a round of %v, want 100ms", name, d)
			}
			if name == "c" && len(order) > 2 {
				return Result{}, errors.New("c failed")
			}
			h.RecordValue(v * int64(len(order)))
			st.Batches++
			return Result{Frames: 1, Secs: 0.1, CPUSecs: 0.01, Note: fmt.Sprint(st.Batches)}, nil
		}
	}
	lr := &latRounds{n: 3, d: 300 * time.Millisecond, rounds: []latRound{{"a", rec("a", 1000)}, {"c", rec("c", 1000)}}}
	r, err = lr.result("a")
	if err != nil || r.Frames != 3 || r.Count != 3 || r.Note != "3" || r.Secs < 0.29 || r.Secs > 0.31 || r.P50 < 2.99 || r.P50 > 3.01 {
		t.Errorf("latRounds a: %+v, %v; want 3 frames and samples over 0.3 s, note 3, p50 3 us", r, err)
	}
	if _, err := lr.result("c"); err == nil || err.Error() != "c failed" {
		t.Errorf("latRounds c: %v, want its round's error", err)
	}
	if got := strings.Join(order, ""); got != "acaca" {
		t.Errorf("latRounds ran %q, want acaca (interleaved; no round for c after its error)", got)
	}
}

// TestBenchFloorTLS: the wss floor row reads crypto/tls' ciphertext raw
// and turns it into frames by the record overhead of the negotiated
// version. Against a bounded flood (n frames, then the server's close)
// read to its end, that conversion gives n frames to within what
// crypto/tls read past the 101 and the close's record, at TLS 1.3 and
// 1.2; and a timed floor run counts whole frames.
func TestBenchFloorTLS(t *testing.T) {
	root, err := testcerts.Issue(testcerts.Template{CN: "floor root", CA: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := testcerts.Issue(testcerts.Template{CN: "localhost", DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		EKU: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, root)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(root.Cert)
	for _, maxV := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		tln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{leaf.TLS()}, MaxVersion: maxV})
		if err != nil {
			t.Fatal(err)
		}
		defer tln.Close()
		go acceptLoop(tln)
		addr := tln.Addr().String()
		b := &bench{goTLS: &tls.Config{RootCAs: roots, ServerName: "localhost"}, warm: 50 * time.Millisecond, dur: 200 * time.Millisecond}

		const n, size = 40000, 256
		req := "GET /flood?size=256&n=40000 HTTP/1.1\r\nHost: " + addr + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: " +
			ws.NewKey() + "\r\nSec-WebSocket-Version: 13\r\n\r\n"
		fd, over, err := b.floorDialTLS(addr, req)
		if err != nil {
			t.Fatal(err)
		}
		wantOver := map[uint16]int{tls.VersionTLS13: 22, tls.VersionTLS12: 29}[maxV]
		if over != wantOver {
			t.Fatalf("max version %x: record overhead %d, want %d", maxV, over, wantOver)
		}
		tv := unix.NsecToTimeval((300 * time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			t.Fatal(err)
		}
		var wire uint64
		buf := make([]byte, 1<<20)
		for {
			k, err := unix.Read(fd, buf)
			if k <= 0 {
				if err == unix.EINTR {
					continue
				}
				break // EOF, or 300 ms without data: the flood and its close are in
			}
			wire += uint64(k)
		}
		unix.Close(fd)
		frameLen := uint64(len(ws.AppendFrame(nil, true, ws.OpBinary, make([]byte, size))))
		got := wire * floorRecord / uint64(floorRecord+over) / frameLen
		// crypto/tls may hold up to one 16 KiB record past the 101 (63
		// frames, fewer); the records are smaller than 16 KiB while
		// crypto/tls sizes them dynamically (its first 128 KiB), and the
		// last write's and the close's records are short: each such record
		// is counted with too little overhead (a few frames in all).
		if got > n+20 || got+80 < n {
			t.Fatalf("max version %x: %d wire bytes give %d frames, want %d (-80..+20)", maxV, wire, got, n)
		}
		t.Logf("max version %x: %d wire bytes -> %d of %d frames", maxV, wire, got, n)

		r, err := b.floor(addr, "/flood?size=256", size, 2, true)
		if err != nil {
			t.Fatal(err)
		}
		if r.Frames == 0 || r.Bytes != r.Frames*size {
			t.Fatalf("max version %x: timed floor: %d frames, %d bytes", maxV, r.Frames, r.Bytes)
		}
	}
}

// TestBenchBurst runs the burst workload briefly (6400 orders over ws://)
// for each of its clients and checks that the sink read every order, by
// its own count (sinkOrders) as well as by the report the client checks,
// and that every figure of the row was measured.
func TestBenchBurst(t *testing.T) {
	addr := startTestFeed(t)
	b := &bench{burstOrders: 6400, loopCPU: -1, clientCPU: -1, feed: &feedProc{WS: addr}}
	stream, iso := b.burstCounts()
	want := uint64(stream+iso) * burstLen
	peer := func(name string) goPeer {
		for _, p := range goPeers {
			if p.name == name {
				return p
			}
		}
		t.Fatalf("no Go peer %s", name)
		return goPeer{}
	}
	for _, tc := range []struct {
		name string
		run  func() (Result, error)
	}{
		{"talaris/SendBatch", func() (Result, error) { return b.talBurst(variant("default"), true, false) }},
		{"talaris/SendBinary", func() (Result, error) { return b.talBurst(variant("default"), false, false) }},
		{"gorilla", func() (Result, error) { return b.peerBurst(peer("gorilla"), false) }},
		{"coder", func() (Result, error) { return b.peerBurst(peer("coder"), false) }},
	} {
		before := sinkOrders.Load()
		r, err := tc.run()
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		// The sink adds its count when the client's connection ends.
		for end := time.Now().Add(5 * time.Second); sinkOrders.Load()-before < want && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
		if got := sinkOrders.Load() - before; got != want {
			t.Fatalf("%s: the sink read %d orders, want %d (%d bursts of %d and %d isolated ones)", tc.name, got, want, stream, burstLen, iso)
		}
		if r.Frames != 6400 || r.Count != int64(iso) || r.Secs <= 0 || r.FramesPerSec <= 0 || r.CPUPerM <= 0 || r.SyscallsPerFrame <= 0 ||
			r.FirstP50 <= 0 || r.FirstP99 < r.FirstP50 || r.LastP50 < r.FirstP50 || r.LastP99 < r.LastP50 ||
			r.LoadedFirstP50 <= 0 || r.LoadedLastP50 <= 0 || r.LoadedLastP99 < r.LoadedLastP50 {
			t.Fatalf("%s: a figure missing: %+v", tc.name, r)
		}
		t.Logf("%s: %.3f M frames/s, %.3f CPU-us/frame, %.3f syscalls/frame, first/last-of-64 p50 %.1f/%.1f us, loaded last p50 %.1f us; %s",
			tc.name, r.FramesPerSec/1e6, r.CPUPerM, r.SyscallsPerFrame, r.FirstP50, r.LastP50, r.LoadedLastP50, r.Note)
	}
}
