//go:build linux && cgo

package talaris_test

import (
	"bytes"
	"errors"
	"testing"
	"unsafe"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/ws"
)

// TestDecoder feeds the decode workload to testhook.Decoder split at every chunk
// size from 1 to 64 bytes and checks every message, then the error cases.
func TestDecoder(t *testing.T) {
	stream, want := decodeStream(2000)
	for chunk := 1; chunk <= 64; chunk++ {
		d, err := testhook.NewDecoder(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		var sum uint64
		got := 0
		for off := 0; off < len(stream); off += chunk {
			if _, err := d.Decode(stream[off:min(off+chunk, len(stream))], func(_ talaris.Conn, op talaris.Opcode, p []byte) {
				sum += msgID(op == talaris.OpText, p)
				got++
			}); err != nil {
				t.Fatalf("chunk %d: %v", chunk, err)
			}
		}
		d.Close()
		if sum != want || got != 2000 {
			t.Fatalf("chunk %d: sum %d of %d messages, want %d of 2000", chunk, sum, got, want)
		}
	}
	cases := []struct {
		name string
		wire []byte
		want error
		code int
	}{
		{"reserved opcode", []byte{0x83, 0}, talaris.ErrProtocol, 1002},
		{"invalid utf8", ws.AppendFrame(nil, true, ws.OpText, []byte{0xed, 0xa0, 0x80}), talaris.ErrInvalidUTF8, 1007},
		{"too big", []byte{0x82, 127, 0, 0, 0, 0, 0x10, 0, 0, 0}, talaris.ErrMessageTooBig, 1009},
		{"close", ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(1000, "bye")), talaris.ErrClosed, 1000},
	}
	for _, c := range cases {
		d, _ := testhook.NewDecoder(1 << 20)
		wire := append(ws.AppendFrame(nil, true, ws.OpText, []byte("ok")), c.wire...)
		var msgs [][]byte
		_, err := d.Decode(wire, func(_ talaris.Conn, _ talaris.Opcode, p []byte) { msgs = append(msgs, bytes.Clone(p)) })
		var ce *talaris.ConnError
		if !errors.Is(err, c.want) || !errors.As(err, &ce) || ce.Code != c.code {
			t.Errorf("%s: err %v, want %v with code %d", c.name, err, c.want, c.code)
		}
		if len(msgs) != 1 || string(msgs[0]) != "ok" {
			t.Errorf("%s: messages before the failure: %q", c.name, msgs)
		}
		if _, err2 := d.Decode([]byte{0x81, 0}, func(talaris.Conn, talaris.Opcode, []byte) { t.Errorf("%s: message after failure", c.name) }); err2 == nil {
			t.Errorf("%s: no error after failure", c.name)
		}
		d.Close()
	}
}

// TestDecoderInPlace checks that a testhook.Decoder delivers a whole frame inside
// the buffer given to Decode in place (its payload points into that buffer,
// no copy) and a frame split across two calls reassembled (its payload is
// elsewhere), with the right bytes either way; and that one Decode over
// many more messages than the event ring holds (the ring refilled within
// the call) still delivers every message in order, in place.
func TestDecoderInPlace(t *testing.T) {
	within := func(p, b []byte) bool {
		if len(p) == 0 || len(b) == 0 {
			return false
		}
		s, e := uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&b[0]))+uintptr(len(b))
		q := uintptr(unsafe.Pointer(&p[0]))
		return q >= s && q+uintptr(len(p)) <= e
	}
	d, err := testhook.NewDecoder(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	whole := ws.AppendFrame(nil, true, ws.OpText, []byte(`{"id":7}`))
	split := ws.AppendFrame(nil, true, ws.OpBinary, []byte("0123456789abcdef"))
	// chunk 1: a whole frame, then the first half of the split one
	c1 := append(append([]byte(nil), whole...), split[:9]...)
	c2 := append([]byte(nil), split[9:]...)
	var got []string
	var inplace []bool
	for _, c := range [][]byte{c1, c2} {
		if _, err := d.Decode(c, func(_ talaris.Conn, _ talaris.Opcode, p []byte) {
			got = append(got, string(p))
			inplace = append(inplace, within(p, c))
		}); err != nil {
			t.Fatal(err)
		}
	}
	if len(got) != 2 || got[0] != `{"id":7}` || got[1] != "0123456789abcdef" {
		t.Fatalf("messages %q", got)
	}
	if !inplace[0] || inplace[1] {
		t.Fatalf("in place: whole frame %v (want true), split frame %v (want false)", inplace[0], inplace[1])
	}

	// Ten times the decoder's event ring (4096) in one call.
	const n = 40000
	stream, want := decodeStream(n)
	var sum uint64
	count, out := 0, 0
	if _, err := d.Decode(stream, func(_ talaris.Conn, op talaris.Opcode, p []byte) {
		if id := msgID(op == talaris.OpText, p); id != uint64(count) {
			t.Fatalf("message %d has id %d", count, id)
		}
		sum += msgID(op == talaris.OpText, p)
		if !within(p, stream) {
			out++
		}
		count++
	}); err != nil {
		t.Fatal(err)
	}
	if count != n || sum != want || out != 0 {
		t.Fatalf("%d messages (want %d), id sum %d (want %d), %d not in place", count, n, sum, want, out)
	}

	// Pinning the caller's buffer for the call allocates nothing once
	// warm (the race detector's instrumentation aside).
	if !raceEnabled {
		small, _ := decodeStream(300) // whole frames; cut at 2000 inside one
		got := 0
		fn := func(talaris.Conn, talaris.Opcode, []byte) { got++ }
		if a := testing.AllocsPerRun(50, func() {
			for _, b := range [][]byte{small[:2000], small[2000:], nil} {
				if _, err := d.Decode(b, fn); err != nil {
					t.Fatal(err)
				}
			}
		}); a != 0 {
			t.Fatalf("%v allocations per Decode", a)
		}
		if got != 51*300 {
			t.Fatalf("%d messages, want %d", got, 51*300)
		}
	}
}

// TestDecoderCloseInCallback: a callback that closes its decoder (the
// event ring it is read from goes when Decode returns, not under it), one
// that calls Decode again (refused), and Close after the stream ended
// with a close frame.
func TestDecoderCloseInCallback(t *testing.T) {
	stream, _ := decodeStream(5000)
	d, err := testhook.NewDecoder(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	var inner error
	_, err = d.Decode(stream, func(_ talaris.Conn, _ talaris.Opcode, p []byte) {
		got++
		if got == 1 {
			_, inner = d.Decode(stream[:10], func(talaris.Conn, talaris.Opcode, []byte) { t.Error("message from a nested Decode") })
		}
		if got == 10 {
			d.Close()
		}
	})
	if !errors.Is(err, talaris.ErrClosed) || got < 10 || got == 5000 {
		t.Fatalf("Decode returned %v after %d messages; want ErrClosed after 10 and before the end", err, got)
	}
	if inner == nil {
		t.Fatal("Decode from its own callback was accepted")
	}
	if _, err := d.Decode(stream, func(talaris.Conn, talaris.Opcode, []byte) { t.Error("message after Close") }); !errors.Is(err, talaris.ErrClosed) {
		t.Fatalf("Decode after Close: %v", err)
	}
	d.Close() // again: nothing left to free

	d, _ = testhook.NewDecoder(1 << 16)
	wire := ws.AppendFrame(ws.AppendFrame(nil, true, ws.OpText, []byte("a")), true, ws.OpClose, ws.ClosePayload(1000, ""))
	if _, err := d.Decode(wire, func(talaris.Conn, talaris.Opcode, []byte) {}); !errors.Is(err, talaris.ErrClosed) {
		t.Fatalf("after a close frame: %v", err)
	}
	d.Close()
	if _, err := d.Decode(wire, func(talaris.Conn, talaris.Opcode, []byte) { t.Error("message after Close") }); !errors.Is(err, talaris.ErrClosed) {
		t.Fatalf("Decode after Close: %v", err)
	}
}
