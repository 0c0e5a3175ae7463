//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	gobwas "github.com/gobwas/ws"
	"github.com/gorilla/websocket"
	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// BenchmarkDecode is the in-memory decode workload of the design brief:
// 100k server messages, 1/3 binary (an 8-byte little-endian u64 id) and 2/3
// text ({"id":i}), read in 4096-byte pieces, the callback summing the ids.
// ns/msg is the figure to compare:
//
//	talaris: DialMemory + Conn.Inject of 4096-byte chunks -> C parser on the
//	         loop thread -> event ring -> PumpData callback
//	gobwas:  ws.ReadHeader + io.ReadFull on a 4096-byte bufio.Reader over a
//	         bytes.Reader
//	gorilla: Conn.NextReader over an in-memory net.Conn (4096-byte reads)
//
// Run: go test -run '^$' -bench BenchmarkDecode -benchtime 20x .
func BenchmarkDecode(b *testing.B) {
	stream, want := decodeStream(decodeMsgs)
	b.Run("talaris", func(b *testing.B) { benchDecodeTalaris(b, stream, want, talaris.Config{}) })
	// Stage stamps (Config.SampleEvery): an Inject is a memory
	// connection's completion, so 1 stamps one message per 4096-byte chunk.
	b.Run("talaris-sample64", func(b *testing.B) { benchDecodeTalaris(b, stream, want, talaris.Config{SampleEvery: 64}) })
	b.Run("talaris-sample1", func(b *testing.B) { benchDecodeTalaris(b, stream, want, talaris.Config{SampleEvery: 1}) })
	b.Run("talaris-decoder", func(b *testing.B) { benchDecodeDecoder(b, stream, want) })
	b.Run("gobwas", func(b *testing.B) { benchDecodeGobwas(b, stream, want) })
	b.Run("gorilla", func(b *testing.B) { benchDecodeGorilla(b, stream, want) })
}

func reportPerMsg(b *testing.B, iters int) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(iters*decodeMsgs), "ns/msg")
}

func benchDecodeTalaris(b *testing.B, stream []byte, want uint64, cfg talaris.Config) {
	p, err := talaris.NewPool(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	c, err := p.DialMemory()
	if err != nil {
		b.Fatal(err)
	}
	var sum uint64
	var got int
	fn := func(_ talaris.Conn, op talaris.Opcode, payload []byte) {
		sum += msgID(op == talaris.OpText, payload)
		got++
	}
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	iters := 0
	cpu0 := processCPU(b)
	for b.Loop() {
		sum, got = 0, 0
		for off := 0; off < len(stream); off += decodeChunk {
			if err := c.Inject(stream[off:min(off+decodeChunk, len(stream))]); err != nil {
				b.Fatal(err)
			}
		}
		for got < decodeMsgs {
			if _, err := p.PumpData(fn); err != nil {
				b.Fatal(err)
			}
		}
		if sum != want || got != decodeMsgs {
			b.Fatalf("sum %d of %d messages, want %d of %d", sum, got, want, decodeMsgs)
		}
		iters++
	}
	reportPerMsg(b, iters)
	// CPU time of the process (loop thread and pump) per message: steadier
	// than wall time on a loaded machine, where the two threads wait for
	// a core.
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(iters*decodeMsgs), "cpu-ns/msg")
}

// processCPU returns the process's user+system CPU time in ns.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// benchDecodeDecoder is the same workload through testhook.Decoder: the C parser,
// event ring and Go callback on the calling thread, one cgo call per
// 4096-byte read.
func benchDecodeDecoder(b *testing.B, stream []byte, want uint64) {
	d, err := testhook.NewDecoder(0)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	var sum uint64
	var got int
	fn := func(_ talaris.Conn, op talaris.Opcode, payload []byte) {
		sum += msgID(op == talaris.OpText, payload)
		got++
	}
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	iters := 0
	for b.Loop() {
		sum, got = 0, 0
		for off := 0; off < len(stream); off += decodeChunk {
			if _, err := d.Decode(stream[off:min(off+decodeChunk, len(stream))], fn); err != nil {
				b.Fatal(err)
			}
		}
		if sum != want || got != decodeMsgs {
			b.Fatalf("sum %d of %d messages, want %d of %d", sum, got, want, decodeMsgs)
		}
		iters++
	}
	reportPerMsg(b, iters)
}

func benchDecodeGobwas(b *testing.B, stream []byte, want uint64) {
	src := bytes.NewReader(stream)
	r := bufio.NewReaderSize(src, decodeChunk)
	buf := make([]byte, 64)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	iters := 0
	for b.Loop() {
		src.Reset(stream)
		r.Reset(src)
		var sum uint64
		for range decodeMsgs {
			h, err := gobwas.ReadHeader(r)
			if err != nil {
				b.Fatal(err)
			}
			pl := buf[:h.Length]
			if _, err := io.ReadFull(r, pl); err != nil {
				b.Fatal(err)
			}
			switch h.OpCode {
			case gobwas.OpText:
				sum += msgID(true, pl)
			case gobwas.OpBinary:
				sum += msgID(false, pl)
			}
		}
		if sum != want {
			b.Fatalf("sum %d, want %d", sum, want)
		}
		iters++
	}
	reportPerMsg(b, iters)
}

func benchDecodeGorilla(b *testing.B, stream []byte, want uint64) {
	mc := &memConn{stream: stream}
	d := websocket.Dialer{
		NetDialContext:  func(context.Context, string, string) (net.Conn, error) { return mc, nil },
		ReadBufferSize:  decodeChunk,
		WriteBufferSize: decodeChunk,
	}
	conn, _, err := d.Dial("ws://bench.invalid/", nil)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 64)
	b.SetBytes(int64(len(stream)))
	b.ReportAllocs()
	iters := 0
	for b.Loop() {
		var sum uint64
		for range decodeMsgs {
			mt, r, err := conn.NextReader()
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for {
				k, err := r.Read(buf[n:])
				n += k
				if err == io.EOF {
					break
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			sum += msgID(mt == websocket.TextMessage, buf[:n])
		}
		if sum != want {
			b.Fatalf("sum %d, want %d", sum, want)
		}
		iters++
	}
	reportPerMsg(b, iters)
}

// memConn is a net.Conn for gorilla's client: it answers the upgrade
// request, then serves stream over and over, at most decodeChunk bytes per
// Read.
type memConn struct {
	mu     sync.Mutex
	req    []byte
	resp   []byte
	stream []byte
	pos    int
	open   bool
}

func (m *memConn) Write(p []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.open {
		m.req = append(m.req, p...)
	}
	return len(p), nil
}

func (m *memConn) Read(p []byte) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(p) > decodeChunk {
		p = p[:decodeChunk]
	}
	if !m.open {
		if m.resp == nil {
			key := ""
			for _, line := range bytes.Split(m.req, []byte("\r\n")) {
				if k, v, ok := bytes.Cut(line, []byte(": ")); ok && bytes.EqualFold(k, []byte("Sec-WebSocket-Key")) {
					key = string(v)
				}
			}
			if key == "" {
				return 0, errors.New("memConn: no Sec-WebSocket-Key in the request")
			}
			m.resp = []byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
				"Sec-WebSocket-Accept: " + ws.AcceptKey(key) + "\r\n\r\n")
		}
		n := copy(p, m.resp)
		m.resp = m.resp[n:]
		if len(m.resp) == 0 {
			m.open = true
		}
		return n, nil
	}
	n := copy(p, m.stream[m.pos:])
	m.pos += n
	if m.pos == len(m.stream) {
		m.pos = 0
	}
	return n, nil
}

func (m *memConn) Close() error { return nil }

func (m *memConn) LocalAddr() net.Addr { return &net.TCPAddr{} }

func (m *memConn) RemoteAddr() net.Addr { return &net.TCPAddr{} }

func (m *memConn) SetDeadline(time.Time) error { return nil }

func (m *memConn) SetReadDeadline(time.Time) error { return nil }

func (m *memConn) SetWriteDeadline(time.Time) error { return nil }

// BenchmarkSampleCost isolates the cost of one stamped message: every
// Inject carries one 16-byte frame, so with SampleEvery 1 every message is
// sampled (the worst case: one message per completion). The difference
// between the two rows' cpu-ns/msg is the whole per-sample cost (three
// clock reads in C, the stamp table, the pump's clock read and the
// histogram fold).
//
// Run: go test -run '^$' -bench BenchmarkSampleCost -count 5 .
func BenchmarkSampleCost(b *testing.B) {
	frame := ws.AppendFrame(nil, true, ws.OpBinary, make([]byte, 16))
	for _, every := range []uint32{0, 1} {
		b.Run("every"+strconv.Itoa(int(every)), func(b *testing.B) {
			p, err := talaris.NewPool(talaris.Config{SampleEvery: every})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			c, err := p.DialMemory()
			if err != nil {
				b.Fatal(err)
			}
			const burst = 256
			got := 0
			fn := func(talaris.Conn, talaris.Opcode, []byte) { got++ }
			b.ReportAllocs()
			iters := 0
			cpu0 := processCPU(b)
			for b.Loop() {
				for range burst {
					if err := c.Inject(frame); err != nil {
						b.Fatal(err)
					}
				}
				for want := got + burst; got < want; {
					if _, err := p.PumpData(fn); err != nil {
						b.Fatal(err)
					}
				}
				iters++
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(iters*burst), "cpu-ns/msg")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(iters*burst), "ns/msg")
			if every != 0 && p.Metrics().Sampled == 0 {
				b.Fatal("nothing sampled")
			}
		})
	}
}

// BenchmarkSendTextValidate measures what SendText's UTF-8 check costs per
// KiB: the message is valid text up to a bad last byte, so the whole of
// it is validated and then refused (nothing reaches the ring).
func BenchmarkSendTextValidate(b *testing.B) {
	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	c, err := p.DialMemory()
	if err != nil {
		b.Fatal(err)
	}
	for _, k := range []struct {
		name string
		unit string
	}{{"ascii", "a"}, {"2-byte", "é"}, {"3-byte", "€"}, {"mixed", "price €1.5 ok "}} {
		msg := bytes.Repeat([]byte(k.unit), 1024/len(k.unit)+1)[:1023]
		msg = append(msg[:len(msg):len(msg)], 0xff)
		b.Run(k.name, func(b *testing.B) {
			b.SetBytes(int64(len(msg)))
			for b.Loop() {
				if err := c.SendText(msg); !errors.Is(err, talaris.ErrInvalidUTF8) {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSendThroughput: 16 KiB messages with SendContext to a sink on
// loopback that reads and checks everything, by MaxSendQueue (the sink's
// checking is part of every figure).
func BenchmarkSendThroughput(b *testing.B) {
	for _, q := range []uint64{64 << 10, 1 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("queue=%dKiB", q>>10), func(b *testing.B) {
			s := &sink{gate: make(chan struct{}), stop: make(chan struct{}), progress: make(chan struct{}, 1)}
			close(s.gate)
			s.srv = wstest.NewRaw(s.handle).Start(b)
			defer close(s.stop)
			p, err := talaris.NewPool(talaris.Config{MaxSendQueue: q})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			ctx := context.Background()
			c, err := p.Dial(ctx, s.srv.URL, nil)
			if err != nil {
				b.Fatal(err)
			}
			const size = 16 << 10
			buf := make([]byte, size)
			b.SetBytes(size)
			b.ResetTimer()
			for i := range b.N {
				if err := c.SendContext(ctx, talaris.OpBinary, seqMsg(buf, i)); err != nil {
					b.Fatal(err)
				}
			}
			for {
				n, _, err := s.state()
				if err != nil {
					b.Fatal(err)
				}
				if n >= b.N {
					break
				}
				<-s.progress
			}
			b.StopTimer()
			b.ReportMetric(float64(c.Stats().SendQueueFull)/float64(b.N), "full/op")
		})
	}
}
