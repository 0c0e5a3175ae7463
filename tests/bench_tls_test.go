//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	gobwas "github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/ws"
)

// BenchmarkTLSIngress measures loopback wss:// ingress of 256-byte binary
// frames (TLS 1.3, AES-128-GCM) from a crypto/tls feed server running in
// another process (this test binary re-executed with tlsFeedEnv set): the
// server writes pre-built frames in 256 KiB batches (16 KiB records).
// Each client checks the sequence number in every payload. Clients:
// talaris (the TLS backend linked into this binary: run once per build tag)
// and gobwas/ws over crypto/tls. The metric to read is frames/s.
//
//	go test -run '^$' -bench TLSIngress -benchtime 3000000x ./
//	go test -tags talaris_openssl -run '^$' -bench TLSIngress -benchtime 3000000x ./

const (
	tlsFeedEnv   = "TALARIS_BENCH_TLS_FEED"
	tlsFeedFrame = 256
	tlsFeedBatch = 1024 // frames per write: 1024 * 260 bytes
)

func init() {
	if os.Getenv(tlsFeedEnv) == "1" {
		os.Exit(runTLSFeed())
	}
}

// runTLSFeed is the feed server process: it prints "LISTEN addr" and serves
// until stdin closes. A client asks for /?n=N, sends one text message when
// it is ready, gets N frames and a close 1000.
func runTLSFeed() int {
	cert, err := tls.LoadX509KeyPair(testCertFile, testKeyFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13,
		NextProtos: []string{"http/1.1"}}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("LISTEN %s\n", ln.Addr())
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	for {
		nc, err := ln.Accept()
		if err != nil {
			return 1
		}
		go feedConn(tls.Server(nc, cfg))
	}
}

func feedConn(tc *tls.Conn) {
	defer tc.Close()
	br := bufio.NewReader(tc)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	n, _ := strconv.Atoi(req.URL.Query().Get("n"))
	resp := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
		ws.AcceptKey(req.Header.Get("Sec-WebSocket-Key")) + "\r\n\r\n"
	if _, err := io.WriteString(tc, resp); err != nil {
		return
	}
	// Wait for the client's "ready" message (any frame).
	if _, _, err := wsutil.ReadClientData(struct {
		io.Reader
		io.Writer
	}{br, tc}); err != nil {
		return
	}
	payload := make([]byte, tlsFeedFrame)
	for j := range payload {
		payload[j] = byte(j * 7)
	}
	frame := ws.AppendFrame(nil, true, ws.OpBinary, payload)
	fl := len(frame)
	batch := make([]byte, 0, tlsFeedBatch*fl)
	for range tlsFeedBatch {
		batch = append(batch, frame...)
	}
	hl := fl - tlsFeedFrame
	for seq := 0; seq < n; {
		k := min(tlsFeedBatch, n-seq)
		for i := range k {
			binary.LittleEndian.PutUint64(batch[i*fl+hl:], uint64(seq+i))
		}
		if _, err := tc.Write(batch[:k*fl]); err != nil {
			return
		}
		seq += k
	}
	tc.Write(ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(1000, "done")))
	tc.SetReadDeadline(time.Now().Add(5 * time.Second))
	io.Copy(io.Discard, br)
}

// startTLSFeed starts the feed server process and returns its address.
func startTLSFeed(b *testing.B) string {
	b.Helper()
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), tlsFeedEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "LISTEN ") {
		b.Fatalf("feed server: %q %v", line, err)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, "LISTEN "))
}

func BenchmarkTLSIngress(b *testing.B) {
	addr := startTLSFeed(b)
	for _, v := range waitVariants {
		b.Run("talaris-"+talaris.TLSBackend()+"-"+v.name, func(b *testing.B) { benchTalarisTLS(b, addr, v.cfg) })
	}
	b.Run("gobwas-cryptotls", func(b *testing.B) { benchGobwasTLS(b, addr) })
}

// waitVariants are the talaris wait strategies benchmarked side by side.
var waitVariants = []struct {
	name string
	cfg  talaris.Config
}{
	{"default", talaris.Config{}},
	{"block", talaris.Config{Wait: talaris.WaitBlock}},
	{"spin", talaris.Config{Wait: talaris.WaitSpin}},
}

func benchTalarisTLS(b *testing.B, addr string, cfg talaris.Config) {
	p, err := talaris.NewPool(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := p.Dial(ctx, fmt.Sprintf("wss://%s/?n=%d", addr, b.N), tlsOpts)
	if err != nil {
		b.Fatal(err)
	}
	// Drain EventOpen so the timed loop sees data only.
	p.PumpNowait(func(talaris.Conn, talaris.Event) {})
	var next uint64
	bad := false
	fn := func(_ talaris.Conn, _ talaris.Opcode, pl []byte) {
		if len(pl) != tlsFeedFrame || binary.LittleEndian.Uint64(pl) != next {
			bad = true
		}
		next++
	}
	b.SetBytes(tlsFeedFrame)
	b.ResetTimer()
	if err := c.SendText([]byte("go")); err != nil {
		b.Fatal(err)
	}
	for next < uint64(b.N) {
		if _, err := p.PumpData(fn); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if bad {
		b.Fatal("sequence or size mismatch")
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
	c.Close(1000, "")
}

func benchGobwasTLS(b *testing.B, addr string) {
	ca, err := os.ReadFile(testCAFile)
	if err != nil {
		b.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca)
	d := gobwas.Dialer{TLSConfig: &tls.Config{RootCAs: roots, NextProtos: []string{"http/1.1"}}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, br, _, err := d.Dial(ctx, fmt.Sprintf("wss://%s/?n=%d", addr, b.N))
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	var r io.Reader = nc
	if br != nil {
		r = io.MultiReader(br, nc)
	}
	rd := bufio.NewReaderSize(r, 64<<10)
	buf := make([]byte, 64<<10)
	b.SetBytes(tlsFeedFrame)
	b.ResetTimer()
	if err := wsutil.WriteClientText(nc, []byte("go")); err != nil {
		b.Fatal(err)
	}
	var next uint64
	for next < uint64(b.N) {
		h, err := gobwas.ReadHeader(rd)
		if err != nil {
			b.Fatal(err)
		}
		if h.Length > int64(len(buf)) {
			b.Fatalf("frame of %d bytes", h.Length)
		}
		pl := buf[:h.Length]
		if _, err := io.ReadFull(rd, pl); err != nil {
			b.Fatal(err)
		}
		if h.OpCode != gobwas.OpBinary {
			continue
		}
		if len(pl) != tlsFeedFrame || binary.LittleEndian.Uint64(pl) != next {
			b.Fatalf("frame %d: sequence or size mismatch", next)
		}
		next++
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "frames/s")
}
