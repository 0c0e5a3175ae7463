//go:build linux && cgo

package conformance

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/ws"
)

// fuzzMax is the message size limit both parsers run with.
const fuzzMax = 1 << 16

var fuzzPool struct {
	once sync.Once
	p    *talaris.Pool
	err  error
}

func sharedPool(t *testing.T) *talaris.Pool {
	fuzzPool.once.Do(func() {
		fuzzPool.p, fuzzPool.err = talaris.NewPool(testhook.WithKnobs(talaris.Config{MaxMessageSize: fuzzMax, ArenaSize: 1 << 20, MaxConns: 4}, testhook.Knobs{EventRingSize: 1024}))
	})
	if fuzzPool.err != nil {
		t.Fatal(fuzzPool.err)
	}
	return fuzzPool.p
}

// outcome is what a parser made of a byte stream: the data messages and
// control frames it delivered, then how the stream ended.
type outcome struct {
	frames []Frame // data messages and ping/pong frames, in order
	code   int     // failure close code, or the close frame's code, or 1000 (input ran out)
	reason string  // close reason when the stream ended with a close frame
	failed bool
}

func (o outcome) String() string {
	var b bytes.Buffer
	for _, f := range o.frames {
		fmt.Fprintf(&b, "%s(%d) ", f.Op, len(f.Payload))
	}
	fmt.Fprintf(&b, "failed=%v code=%d reason=%q", o.failed, o.code, o.reason)
	return b.String()
}

// runC feeds data to the C parser through a memory connection, then closes
// it with 1000 and collects its events up to the final one.
func runC(t *testing.T, p *talaris.Pool, data []byte) outcome {
	c, err := p.DialMemory()
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > 0 {
		if err := c.Inject(data); err != nil {
			t.Fatal(err)
		}
	}
	c.Close(1000, "") // after the injected bytes: commands run in order
	guard := time.AfterFunc(10*time.Second, func() { p.Close() })
	defer guard.Stop()
	var o outcome
	done := false
	for !done {
		_, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
			if cc != c {
				return
			}
			switch ev.Kind {
			case talaris.EventText:
				o.frames = append(o.frames, Frame{ws.OpText, bytes.Clone(ev.Payload)})
			case talaris.EventBinary:
				o.frames = append(o.frames, Frame{ws.OpBinary, bytes.Clone(ev.Payload)})
			case talaris.EventPing:
				o.frames = append(o.frames, Frame{ws.OpPing, bytes.Clone(ev.Payload)})
			case talaris.EventPong:
				o.frames = append(o.frames, Frame{ws.OpPong, bytes.Clone(ev.Payload)})
			case talaris.EventClose:
				o.code, o.reason, done = ev.Code, string(ev.Reason), true
			case talaris.EventError:
				o.code, o.failed, done = ev.Code, true, true
			}
		})
		if err != nil {
			t.Fatalf("pump: %v (the C side never delivered a final event)", err)
		}
	}
	return o
}

// runRef feeds data to ws.Parser the same way.
func runRef(data []byte) outcome {
	var o outcome
	ps := ws.Parser{MaxMessageSize: fuzzMax}
	err := ps.Feed(data, func(op ws.Opcode, p []byte) {
		o.frames = append(o.frames, Frame{op, bytes.Clone(p)})
	}, func(op ws.Opcode, p []byte) {
		if op == ws.OpClose {
			code, reason, _ := ws.ParseClosePayload(p)
			o.code, o.reason = code, string(reason)
			return
		}
		o.frames = append(o.frames, Frame{op, bytes.Clone(p)})
	})
	switch {
	case err != nil:
		o.code, o.failed = ws.CloseCode(err), true
	case !ps.Closed():
		o.code = 1000 // the client's own close after the input ran out
	}
	return o
}

// incompleteTail reports whether data ends inside a frame (after frames
// that all parse).
func incompleteTail(data []byte) bool {
	for len(data) > 0 {
		h, n, err := ws.ParseHeader(data, true)
		if err != nil {
			return false
		}
		if n == 0 || uint64(len(data)-n) < h.Length {
			return true
		}
		data = data[n+int(h.Length):]
	}
	return false
}

func sameFrames(a, b []Frame) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Op != b[i].Op || !bytes.Equal(a[i].Payload, b[i].Payload) {
			return false
		}
	}
	return true
}

// FuzzDifferential feeds the same bytes to the C frame parser (through
// Pool.DialMemory, Conn.Inject and Pump) and to ws.Parser, the reference,
// and requires the same messages, control frames and failure close code.
//
// One difference is allowed: when the input ends inside a text frame whose
// received part is already invalid UTF-8, the C parser fails it at once
// with 1007 (fail fast) while ws.Parser waits for the whole frame.
func FuzzDifferential(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p := sharedPool(t)
		got := runC(t, p, data)
		want := runRef(data)
		if got.failed && got.code == 1007 && !want.failed && want.code == 1000 && incompleteTail(data) {
			want.failed, want.code = true, 1007 // fail-fast on a partial frame
		}
		if !sameFrames(got.frames, want.frames) || got.failed != want.failed || got.code != want.code || got.reason != want.reason {
			t.Fatalf("C and ws.Parser disagree on %x\n\tC:  %v\n\tws: %v", data, got, want)
		}
	})
}

func fuzzSeeds() [][]byte {
	fr := func(fin bool, op ws.Opcode, p string) []byte { return ws.AppendFrame(nil, fin, op, []byte(p)) }
	l64 := func(op ws.Opcode, n uint64, p string) []byte {
		return append(ws.AppendHeaderLen(nil, ws.Header{Fin: true, Op: op, Length: n}, 8), p...)
	}
	closeCode := func(code int, reason string) []byte {
		return fr(true, ws.OpClose, string(binary.BigEndian.AppendUint16(nil, uint16(code)))+reason)
	}
	big := string(bytes.Repeat([]byte("x"), 300))
	return [][]byte{
		nil,
		fr(true, ws.OpText, "hello"),
		fr(true, ws.OpBinary, big),
		cat(fr(false, ws.OpText, "frag"), fr(true, ws.OpPing, "p"), fr(true, ws.OpContinuation, "ment")),
		cat(fr(true, ws.OpText, "a"), fr(true, ws.OpPong, "x"), closeCode(1000, "bye"), fr(true, ws.OpText, "after")),
		closeCode(1005, ""), closeCode(3000, "ok"), closeCode(1000, "\xed\xa0\x80"), fr(true, ws.OpClose, "\x03"),
		fr(true, ws.OpText, "\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80"),
		cat(fr(false, ws.OpText, "\xe2\x82"), fr(true, ws.OpContinuation, "\xac")),
		cat(fr(false, ws.OpText, "ok"), fr(true, ws.OpContinuation, "\xe2\x82")),
		fr(true, ws.OpText, "partial \xff")[:8],
		fr(true, ws.OpContinuation, "stray"),
		cat(fr(false, ws.OpBinary, "a"), fr(true, ws.OpBinary, "b")),
		rsv(4, ws.OpText, []byte("x")), fr(true, 3, "r"), fr(true, 0xB, ""), fr(false, ws.OpPing, "f"),
		ws.AppendMaskedFrame(nil, true, ws.OpText, [4]byte{1, 2, 3, 4}, []byte("m")),
		l64(ws.OpBinary, 1<<63|5, "abcde"), l64(ws.OpBinary, 1<<62, ""), l64(ws.OpText, 5, "Hello"),
		l64(ws.OpBinary, fuzzMax+1, ""), withLen(ws.OpPing, 2, 3, []byte("abc")),
		fr(true, ws.OpPing, big[:126]),
		fr(true, ws.OpText, "split")[:1],
	}
}
