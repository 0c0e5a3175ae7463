//go:build linux

package main

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// The feed server is the hidden "talaris feed-server" subcommand: a fast
// raw WebSocket writer that demo and bench start in a child process (so that
// its CPU time and scheduling are not the client's). It speaks plain TCP
// and, with --cert/--key, TLS (crypto/tls) on a second port, and prints
//
//	FEED ws=127.0.0.1:P wss=127.0.0.1:Q      (wss=- without TLS)
//
// on stdout once it listens. It exits when its stdin reaches EOF (the parent
// closed the pipe or died).
//
// Endpoints (chosen by the path of the upgrade request):
//
//	/flood?size=S&op=binary|text&n=N&ms=T
//	    Pre-built S-byte frames written as fast as the socket takes them, in
//	    256 KiB writes until the client sends the text message "stop" (answered
//	    with the text message "stopped" after the last flood frame) or for T ms
//	    when ms is given, then idle until the client leaves. With n=N>0: exactly N frames of a sequence-numbered
//	    stream (wstest.Payload), then close 1000 "done".
//	/paced?size=S&rate=R&batch=B&sub=1
//	    R frames per second of S (>= 16) bytes, B frames per write; payload
//	    bytes 0..8 = sequence number, 8..16 = send time (time.Now().UnixNano(),
//	    little endian). With sub=1 nothing is sent before the client's first
//	    text message (a subscription).
//	/echo
//	    Every data message is sent back with its opcode.
//	/stall?ms=T
//	    Reads nothing after the upgrade (the client's sends fill the socket),
//	    then closes after T ms (default 60000).
//	/sink
//	    Reads every data message: the burst workload's orders (bench_burst.go),
//	    counted, with the arrival of each burst's first and last order stamped
//	    by CLOCK_MONOTONIC. A data message shorter than an order's header is
//	    answered with the record so far (sinkStats.appendReport).
//	anything else
//	    A ticker: a JSON text message {"seq":i,"ts":ns} every 1/rate s
//	    (rate default 2), and every data message echoed.
//
// Pings are answered, a close is answered with a close.
func feedServerMain(args []string) error {
	fs := flag.NewFlagSet("feed-server", flag.ContinueOnError)
	cpu := fs.Int("cpu", -1, "pin the server process to this CPU (-1: not pinned)")
	cert := fs.String("cert", "", "PEM certificate for the TLS listener (none: no TLS)")
	key := fs.String("key", "", "PEM key for the TLS listener")
	addr := fs.String("addr", "127.0.0.1:0", "plain listener address")
	tlsAddr := fs.String("tls-addr", "127.0.0.1:0", "TLS listener address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cpu >= 0 {
		if err := pinProcess(*cpu); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	go acceptLoop(ln)
	wss := "-"
	if *cert != "" {
		kp, err := tls.LoadX509KeyPair(*cert, *key)
		if err != nil {
			return fmt.Errorf("feed-server: %w", err)
		}
		tln, err := tls.Listen("tcp", *tlsAddr, &tls.Config{
			Certificates: []tls.Certificate{kp},
			NextProtos:   []string{"http/1.1"},
			MinVersion:   tls.VersionTLS12,
		})
		if err != nil {
			return err
		}
		wss = tln.Addr().String()
		go acceptLoop(tln)
	}
	fmt.Printf("FEED ws=%s wss=%s\n", ln.Addr(), wss)
	os.Stdout.Sync()
	io.Copy(io.Discard, os.Stdin)
	return nil
}

func acceptLoop(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go serveFeedConn(c)
	}
}

func serveFeedConn(c net.Conn) {
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
		tc.SetWriteBuffer(4 << 20)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReaderSize(c, 64<<10)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	key := req.Header.Get("Sec-WebSocket-Key")
	if key == "" || !strings.EqualFold(req.Header.Get("Upgrade"), "websocket") {
		io.WriteString(c, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	var b strings.Builder
	b.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ")
	b.WriteString(ws.AcceptKey(key))
	b.WriteString("\r\n")
	if sp := req.Header.Get("Sec-WebSocket-Protocol"); sp != "" {
		first, _, _ := strings.Cut(sp, ",")
		b.WriteString("Sec-WebSocket-Protocol: " + strings.TrimSpace(first) + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(c, b.String()); err != nil {
		return
	}
	c.SetReadDeadline(time.Time{})
	fr := &frameReader{br: br, w: c}
	q := req.URL.Query()
	qint := func(k string, def int) int {
		if v, err := strconv.Atoi(q.Get(k)); err == nil {
			return v
		}
		return def
	}
	switch req.URL.Path {
	case "/flood":
		op := ws.OpBinary
		if q.Get("op") == "text" {
			op = ws.OpText
		}
		feedFlood(c, fr, op, max(qint("size", 64), 0), qint("n", 0), time.Duration(qint("ms", 0))*time.Millisecond)
	case "/paced":
		feedPaced(c, fr, max(qint("size", 64), 16), max(qint("rate", 20000), 1), max(qint("batch", 1), 1), q.Get("sub") == "1")
	case "/stall":
		time.Sleep(time.Duration(max(qint("ms", 60000), 0)) * time.Millisecond)
	case "/sink":
		feedSink(c, fr)
	case "/echo":
		for {
			op, p, err := fr.next()
			if err != nil {
				return
			}
			if _, err := c.Write(ws.AppendFrame(nil, true, op, p)); err != nil {
				return
			}
		}
	default:
		feedTicker(c, fr, max(qint("rate", 2), 1))
	}
}

// drain reads (and discards) the client's frames until it closes, then
// closes c so that a writer blocked on it returns.
func drain(c net.Conn, fr *frameReader) {
	for {
		if _, _, err := fr.next(); err != nil {
			c.Close()
			return
		}
	}
}

// sinkOrders counts the orders every /sink connection of this process
// read, added as the connection ends (the tests count with it).
var sinkOrders atomic.Uint64

// feedSink reads the client's orders until it leaves, answering each
// report request with the record so far.
func feedSink(c net.Conn, fr *frameReader) {
	var s sinkStats
	defer func() { sinkOrders.Add(s.orders) }()
	for {
		_, p, err := fr.next()
		if err != nil {
			return
		}
		if len(p) >= orderHdr {
			s.order(p)
			continue
		}
		if _, err := c.Write(ws.AppendFrame(nil, true, ws.OpBinary, s.appendReport(nil))); err != nil {
			return
		}
	}
}

func feedFlood(c net.Conn, fr *frameReader, op ws.Opcode, size, n int, limit time.Duration) {
	done := make(chan struct{})
	var stop atomic.Bool
	go func() {
		defer close(done)
		for {
			op, p, err := fr.next()
			if err != nil {
				c.Close()
				return
			}
			if op == ws.OpText && string(p) == "stop" {
				stop.Store(true)
			}
		}
	}()
	if n <= 0 {
		payload := wstest.PayloadOp(op, 0, size)
		frame := ws.AppendFrame(nil, true, op, payload)
		buf := make([]byte, 0, 256<<10+len(frame))
		for len(buf) < 256<<10 {
			buf = append(buf, frame...)
		}
		end := time.Now().Add(limit)
		for i := 0; !stop.Load() && (limit <= 0 || i&15 != 0 || time.Now().Before(end)); i++ {
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
		if stop.Load() {
			c.Write(ws.AppendFrame(nil, true, ws.OpText, []byte("stopped")))
		}
		<-done // flood over: stay idle until the client leaves
		return
	}
	buf := make([]byte, 0, 256<<10)
	for i := 0; i < n; i++ {
		buf = wstest.AppendStreamMessage(buf, op, i, size, 1, false)
		if len(buf) >= 240<<10 || i == n-1 {
			if _, err := c.Write(buf); err != nil {
				return
			}
			buf = buf[:0]
		}
	}
	c.Write(ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(1000, "done")))
	select {
	case <-done:
	case <-time.After(5 * time.Second):
	}
}

// feedPaced sends rate frames per second, batch frames per write, each
// stamped with its send time. A dedicated OS thread with a 1 ns timer slack
// sleeps until each absolute deadline (CLOCK_MONOTONIC).
func feedPaced(c net.Conn, fr *frameReader, size, rate, batch int, sub bool) {
	if sub {
		for {
			op, _, err := fr.next()
			if err != nil {
				return
			}
			if op == ws.OpText {
				break
			}
		}
	}
	go drain(c, fr)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	frame := ws.AppendFrame(nil, true, ws.OpBinary, wstest.Payload(0, size))
	hdr := len(frame) - size
	buf := make([]byte, 0, batch*len(frame))
	for range batch {
		buf = append(buf, frame...)
	}
	interval := int64(float64(batch) / float64(rate) * 1e9)
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	next := ts.Nano()
	seq := uint64(0)
	for {
		next += interval
		dl := unix.NsecToTimespec(next)
		for {
			err := unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &dl, nil)
			if err != unix.EINTR {
				break
			}
		}
		now := time.Now().UnixNano()
		for k := range batch {
			p := buf[k*len(frame)+hdr:]
			binary.LittleEndian.PutUint64(p, seq)
			binary.LittleEndian.PutUint64(p[8:], uint64(now))
			seq++
		}
		if _, err := c.Write(buf); err != nil {
			return
		}
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
		if ts.Nano()-next > 100*interval+int64(100*time.Millisecond) {
			next = ts.Nano() // far behind (a stalled client): do not burst to catch up
		}
	}
}

func feedTicker(c net.Conn, fr *frameReader, rate int) {
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			op, p, err := fr.next()
			if err != nil {
				c.Close()
				return
			}
			mu.Lock()
			_, err = c.Write(ws.AppendFrame(nil, true, op, p))
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t := time.NewTicker(time.Second / time.Duration(rate))
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-done:
			return
		case <-t.C:
		}
		msg := fmt.Sprintf(`{"seq":%d,"ts":%d}`, i, time.Now().UnixNano())
		mu.Lock()
		_, err := c.Write(ws.AppendFrame(nil, true, ws.OpText, []byte(msg)))
		mu.Unlock()
		if err != nil {
			return
		}
	}
}

// frameReader reads a client's (masked) frames. Control frames are handled
// here: pings get a pong, a close gets a close and ends the stream (io.EOF).
type frameReader struct {
	br  *bufio.Reader
	w   net.Conn
	hdr [8]byte
	buf []byte
}

func (f *frameReader) next() (ws.Opcode, []byte, error) {
	for {
		if _, err := io.ReadFull(f.br, f.hdr[:2]); err != nil {
			return 0, nil, err
		}
		op := ws.Opcode(f.hdr[0] & 0xF)
		masked := f.hdr[1]&0x80 != 0
		n := uint64(f.hdr[1] & 0x7F)
		switch n {
		case 126:
			if _, err := io.ReadFull(f.br, f.hdr[:2]); err != nil {
				return 0, nil, err
			}
			n = uint64(binary.BigEndian.Uint16(f.hdr[:2]))
		case 127:
			if _, err := io.ReadFull(f.br, f.hdr[:8]); err != nil {
				return 0, nil, err
			}
			n = binary.BigEndian.Uint64(f.hdr[:8])
		}
		var key [4]byte
		if masked {
			if _, err := io.ReadFull(f.br, key[:]); err != nil {
				return 0, nil, err
			}
		}
		if n > 64<<20 {
			return 0, nil, errors.New("feed-server: client frame too large")
		}
		if uint64(cap(f.buf)) < n {
			f.buf = make([]byte, n)
		}
		p := f.buf[:n]
		if _, err := io.ReadFull(f.br, p); err != nil {
			return 0, nil, err
		}
		if masked {
			ws.Mask(key, p, 0)
		}
		switch op {
		case ws.OpPing:
			f.w.Write(ws.AppendFrame(nil, true, ws.OpPong, p))
			continue
		case ws.OpPong:
			continue
		case ws.OpClose:
			body := p
			if len(body) > 2 {
				body = body[:2]
			}
			f.w.Write(ws.AppendFrame(nil, true, ws.OpClose, body))
			return 0, nil, io.EOF
		}
		return op, p, nil
	}
}
