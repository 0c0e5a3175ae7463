//go:build linux && cgo

package talaris

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/talaris-go/talaris/ws"
)

// TestPoolCloseDuringDirectHandoff: Pool.Close that starts between a
// direct send's short write and its handoff (the test hook holds the
// sender there until Close has begun) finishes promptly, not after
// CloseTimeout: the rest of the started message still reaches the loop,
// which writes it before its 1001 close frame, so the peer reads every
// message whole and then the close. With a peer that resets instead, the
// loop meets the reset and Close is as prompt.
func TestPoolCloseDuringDirectHandoff(t *testing.T) {
	for _, reset := range []bool{false, true} {
		name := "peer-reads"
		if reset {
			name = "peer-resets"
		}
		t.Run(name, func(t *testing.T) { testCloseDuringHandoff(t, reset) })
	}
}

func testCloseDuringHandoff(t *testing.T, reset bool) {
	const closeTimeout = 20 * time.Second
	const msgLen = 16 << 10
	resume := make(chan struct{})
	type result struct {
		msgs  int
		close int // the close frame's code, 0 if none came
		err   error
	}
	got := make(chan result, 1)
	addr := rawServer(t, func(nc net.Conn, br *bufio.Reader) {
		<-resume // stop reading until the handoff: the socket fills
		if reset {
			nc.(*net.TCPConn).SetLinger(0)
			nc.Close()
			got <- result{}
			return
		}
		var r result
		for {
			op, pl, err := readClientFrame(br)
			if err != nil {
				r.err = err
				break
			}
			if op == ws.OpClose {
				r.close = int(binary.BigEndian.Uint16(pl))
				nc.Write(ws.AppendFrame(nil, true, ws.OpClose, pl[:2]))
				break
			}
			if op != ws.OpBinary || len(pl) != msgLen || !bytes.Equal(pl, payloadFor(r.msgs, msgLen)) {
				r.err = errors.New("a message arrived torn or out of order")
				break
			}
			r.msgs++
		}
		got <- r
	})

	p, err := NewPool(Config{CloseTimeout: closeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.Dial(ctx, "ws://"+addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	var closeStart atomic.Int64
	closed := make(chan time.Duration, 1)
	testHookHandoff = func() {
		testHookHandoff = nil // once: only the sending goroutine runs it
		go func() {
			t0 := time.Now()
			closeStart.Store(t0.UnixNano())
			p.Close()
			closed <- time.Since(t0)
		}()
		for !p.closed.Load() { // Close's first step; it never blocks before it
			runtime.Gosched()
		}
		close(resume)
	}
	defer func() { testHookHandoff = nil }()

	// The loop offers the socket once its output after the upgrade is
	// done, a moment after Dial returns: until then sends queue.
	if err := c.SendBinary(payloadFor(0, msgLen)); err != nil {
		t.Fatal(err)
	}
	for c.Stats().SendQueued != 0 {
		if ctx.Err() != nil {
			t.Fatal("the first message was never written")
		}
		time.Sleep(time.Millisecond)
	}
	sent := 1
	for closeStart.Load() == 0 {
		if err := c.SendBinary(payloadFor(sent, msgLen)); err != nil {
			if closeStart.Load() == 0 {
				t.Fatalf("send %d before the handoff: %v", sent, err)
			}
			break // the handoff's own send may report the closed pool
		}
		sent++
	}
	if st := p.direct[c.slot].handoffs.Load(); st != 1 {
		t.Fatalf("%d direct handoffs, want 1 (the socket never filled?)", st)
	}
	var d time.Duration
	select {
	case d = <-closed:
	case <-time.After(closeTimeout + 10*time.Second):
		t.Fatal("Pool.Close did not return")
	}
	t.Logf("Pool.Close took %v after a handoff at message %d", d, sent)
	if d >= closeTimeout/2 {
		t.Errorf("Pool.Close took %v: it waited for the close timeout (%v) on the handed-off rest", d, closeTimeout)
	}
	r := <-got
	if reset {
		return
	}
	if r.err != nil || r.close != 1001 || r.msgs < sent {
		t.Errorf("peer read %d whole messages (sent %d) then close %d, err %v; want all, then 1001", r.msgs, sent, r.close, r.err)
	}
}

// payloadFor is message i's bytes: each differs, so a torn or reordered
// message shows.
func payloadFor(i, n int) []byte {
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(i*31 + j)
	}
	return b
}

// rawServer accepts one WebSocket client on loopback, answers its
// handshake and hands the connection to serve.
func rawServer(t *testing.T, serve func(nc net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		// A small receive buffer fills after a few messages.
		nc.(*net.TCPConn).SetReadBuffer(64 << 10)
		br := bufio.NewReader(nc)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.WriteString(nc, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Accept: "+ws.AcceptKey(req.Header.Get("Sec-WebSocket-Key"))+"\r\n\r\n")
		serve(nc, br)
	}()
	return ln.Addr().String()
}

// readClientFrame reads one masked client frame and returns its opcode
// and unmasked payload.
func readClientFrame(br *bufio.Reader) (ws.Opcode, []byte, error) {
	hdr := make([]byte, 2, 14)
	if _, err := io.ReadFull(br, hdr); err != nil {
		return 0, nil, err
	}
	ext := map[byte]int{126: 2, 127: 8}[hdr[1]&0x7f]
	hdr = hdr[:2+ext+4]
	if _, err := io.ReadFull(br, hdr[2:]); err != nil {
		return 0, nil, err
	}
	h, _, err := ws.ParseHeader(hdr, false)
	if err != nil {
		return 0, nil, err
	}
	if !h.Fin || !h.Masked {
		return 0, nil, syscall.EPROTO
	}
	pl := make([]byte, h.Length)
	if _, err := io.ReadFull(br, pl); err != nil {
		return 0, nil, err
	}
	ws.Mask(h.Mask, pl, 0)
	return h.Op, pl, nil
}
