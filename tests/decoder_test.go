//go:build linux && cgo

package talaris_test

import (
	"bytes"
	"errors"
	. "github.com/talaris-go/talaris"
	"testing"

	"github.com/talaris-go/talaris/ws"
)

// TestDecoder feeds the brief's workload to Decoder split at every chunk
// size from 1 to 64 bytes and checks every message, then the error cases.
func TestDecoder(t *testing.T) {
	stream, want := decodeStream(2000)
	for chunk := 1; chunk <= 64; chunk++ {
		d, err := NewDecoder(1 << 16)
		if err != nil {
			t.Fatal(err)
		}
		var sum uint64
		got := 0
		for off := 0; off < len(stream); off += chunk {
			if _, err := d.Decode(stream[off:min(off+chunk, len(stream))], func(_ Conn, op Opcode, p []byte) {
				sum += msgID(op == OpText, p)
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
		{"reserved opcode", []byte{0x83, 0}, ErrProtocol, 1002},
		{"invalid utf8", ws.AppendFrame(nil, true, ws.OpText, []byte{0xed, 0xa0, 0x80}), ErrInvalidUTF8, 1007},
		{"too big", []byte{0x82, 127, 0, 0, 0, 0, 0x10, 0, 0, 0}, ErrMessageTooBig, 1009},
		{"close", ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(1000, "bye")), ErrClosed, 1000},
	}
	for _, c := range cases {
		d, _ := NewDecoder(1 << 20)
		wire := append(ws.AppendFrame(nil, true, ws.OpText, []byte("ok")), c.wire...)
		var msgs [][]byte
		_, err := d.Decode(wire, func(_ Conn, _ Opcode, p []byte) { msgs = append(msgs, bytes.Clone(p)) })
		var ce *ConnError
		if !errors.Is(err, c.want) || !errors.As(err, &ce) || ce.Code != c.code {
			t.Errorf("%s: err %v, want %v with code %d", c.name, err, c.want, c.code)
		}
		if len(msgs) != 1 || string(msgs[0]) != "ok" {
			t.Errorf("%s: messages before the failure: %q", c.name, msgs)
		}
		if _, err2 := d.Decode([]byte{0x81, 0}, func(Conn, Opcode, []byte) { t.Errorf("%s: message after failure", c.name) }); err2 == nil {
			t.Errorf("%s: no error after failure", c.name)
		}
		d.Close()
	}
}
