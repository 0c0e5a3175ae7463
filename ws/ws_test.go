package ws

import (
	"bytes"
	"encoding/base64"
	"errors"
	"testing"
	"unicode/utf8"
)

func TestOpcode(t *testing.T) {
	for op := Opcode(0); op < 16; op++ {
		known := op <= 2 || (op >= 8 && op <= 10)
		if op.IsReserved() == known {
			t.Errorf("%v.IsReserved() = %v", op, op.IsReserved())
		}
		if op.IsControl() != (op >= 8) {
			t.Errorf("%v.IsControl() = %v", op, op.IsControl())
		}
		if op.IsData() == op.IsControl() {
			t.Errorf("%v: IsData and IsControl agree", op)
		}
	}
	if !Opcode(16).IsReserved() {
		t.Error("Opcode(16) not reserved")
	}
	if OpText.String() != "text" || Opcode(3).String() != "Opcode(0x3)" {
		t.Errorf("String: %q %q", OpText, Opcode(3))
	}
}

func TestValidReceivedCloseCode(t *testing.T) {
	valid := func(c int) bool {
		return (c >= 1000 && c <= 1003) || (c >= 1007 && c <= 1014) || (c >= 3000 && c <= 4999)
	}
	for c := -1; c < 70000; c++ {
		if got := ValidReceivedCloseCode(c); got != valid(c) {
			t.Fatalf("ValidReceivedCloseCode(%d) = %v", c, got)
		}
	}
	for _, c := range []int{0, 999, 1004, 1005, 1006, 1015, 1016, 2999, 5000, 65535} {
		if ValidReceivedCloseCode(c) {
			t.Errorf("%d accepted", c)
		}
	}
	for _, c := range []int{1000, 1001, 1002, 1003, 1007, 1011, 1014, 3000, 4999} {
		if !ValidReceivedCloseCode(c) {
			t.Errorf("%d rejected", c)
		}
	}
}

func TestParseHeader(t *testing.T) {
	tests := []struct {
		name       string
		in         []byte
		fromServer bool
		want       Header
		n          int
		err        error
	}{
		{"empty", nil, true, Header{}, 0, nil},
		{"one byte", []byte{0x81}, true, Header{}, 0, nil},
		{"text 5", []byte{0x81, 5}, true, Header{Fin: true, Op: OpText, Length: 5}, 2, nil},
		{"binary nofin 0", []byte{0x02, 0}, true, Header{Op: OpBinary}, 2, nil},
		{"continuation", []byte{0x80, 125}, true, Header{Fin: true, Op: OpContinuation, Length: 125}, 2, nil},
		{"len16", []byte{0x82, 126, 0x01, 0x00}, true, Header{Fin: true, Op: OpBinary, Length: 256}, 4, nil},
		{"len16 partial", []byte{0x82, 126, 0x01}, true, Header{}, 0, nil},
		{"len16 non-minimal", []byte{0x82, 126, 0, 5}, true, Header{Fin: true, Op: OpBinary, Length: 5}, 4, nil},
		{"len64", []byte{0x82, 127, 0, 0, 0, 1, 0, 0, 0, 0}, true, Header{Fin: true, Op: OpBinary, Length: 1 << 32}, 10, nil},
		{"len64 non-minimal", []byte{0x82, 127, 0, 0, 0, 0, 0, 0, 0, 7}, true, Header{Fin: true, Op: OpBinary, Length: 7}, 10, nil},
		{"len64 max", []byte{0x82, 127, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, true, Header{Fin: true, Op: OpBinary, Length: 1<<63 - 1}, 10, nil},
		{"len64 partial", []byte{0x82, 127, 0, 0, 0, 0, 0, 0, 0}, true, Header{}, 0, nil},
		{"len64 msb", []byte{0x82, 127, 0x80}, true, Header{}, 0, ErrLength63},
		{"len64 msb full", []byte{0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 0}, true, Header{}, 0, ErrLength63},
		{"ping", []byte{0x89, 4}, true, Header{Fin: true, Op: OpPing, Length: 4}, 2, nil},
		{"close 125", []byte{0x88, 125}, true, Header{Fin: true, Op: OpClose, Length: 125}, 2, nil},
		{"rsv1", []byte{0xC1, 0}, true, Header{}, 0, ErrReservedBits},
		{"rsv2", []byte{0xA1, 0}, true, Header{}, 0, ErrReservedBits},
		{"rsv3", []byte{0x91, 0}, true, Header{}, 0, ErrReservedBits},
		{"op3", []byte{0x83, 0}, true, Header{}, 0, ErrReservedOpcode},
		{"op7", []byte{0x87, 0}, true, Header{}, 0, ErrReservedOpcode},
		{"opB", []byte{0x8B, 0}, true, Header{}, 0, ErrReservedOpcode},
		{"opF", []byte{0x8F, 0}, true, Header{}, 0, ErrReservedOpcode},
		{"masked from server", []byte{0x81, 0x85}, true, Header{}, 0, ErrMaskedServerFrame},
		{"unmasked from client", []byte{0x81, 0x05}, false, Header{}, 0, ErrUnmaskedClientFrame},
		{"fragmented ping", []byte{0x09, 0}, true, Header{}, 0, ErrFragmentedControl},
		{"fragmented close", []byte{0x08, 0}, true, Header{}, 0, ErrFragmentedControl},
		{"ping 126", []byte{0x89, 126, 0, 1}, true, Header{}, 0, ErrControlTooLong},
		{"pong 127", []byte{0x8A, 127}, true, Header{}, 0, ErrControlTooLong},
		{"rsv before opcode", []byte{0xF3, 0x80}, true, Header{}, 0, ErrReservedBits},
		{"opcode before mask", []byte{0x83, 0x80}, true, Header{}, 0, ErrReservedOpcode},
		{"client masked", []byte{0x81, 0x83, 1, 2, 3, 4}, false, Header{Fin: true, Op: OpText, Masked: true, Mask: [4]byte{1, 2, 3, 4}, Length: 3}, 6, nil},
		{"client masked partial key", []byte{0x81, 0x83, 1, 2, 3}, false, Header{}, 0, nil},
		{"client len16 masked", []byte{0x82, 0xFE, 0x12, 0x34, 9, 8, 7, 6}, false, Header{Fin: true, Op: OpBinary, Masked: true, Mask: [4]byte{9, 8, 7, 6}, Length: 0x1234}, 8, nil},
		{"client len64 masked", []byte{0x82, 0xFF, 0, 0, 0, 0, 0, 1, 0, 0, 9, 8, 7, 6}, false, Header{Fin: true, Op: OpBinary, Masked: true, Mask: [4]byte{9, 8, 7, 6}, Length: 65536}, 14, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, n, err := ParseHeader(append(tt.in, 0xEE), tt.fromServer) // trailing byte must be ignored
			if tt.n == 0 && tt.err == nil {
				h, n, err = ParseHeader(tt.in, tt.fromServer)
			}
			if !errors.Is(err, tt.err) || n != tt.n || h != tt.want {
				t.Fatalf("got %+v, %d, %v; want %+v, %d, %v", h, n, err, tt.want, tt.n, tt.err)
			}
		})
	}
}

func TestAppendHeaderRoundTrip(t *testing.T) {
	lengths := []uint64{0, 1, 125, 126, 127, 65535, 65536, 1 << 32, 1<<63 - 1}
	for _, l := range lengths {
		for _, masked := range []bool{false, true} {
			for _, op := range []Opcode{OpContinuation, OpText, OpBinary} {
				h := Header{Fin: l%2 == 0, Op: op, Masked: masked, Length: l}
				if masked {
					h.Mask = [4]byte{0xde, 0xad, 0xbe, 0xef}
				}
				b := AppendHeader([]byte{0xAA}, h)[1:]
				if len(b) != HeaderLen(h) {
					t.Errorf("%+v: len %d, HeaderLen %d", h, len(b), HeaderLen(h))
				}
				got, n, err := ParseHeader(b, !masked)
				if err != nil || n != len(b) || got != h {
					t.Errorf("%+v: parsed %+v, %d, %v", h, got, n, err)
				}
			}
		}
	}
	for _, c := range []struct {
		l        uint64
		lenBytes int
		size     int
	}{{5, 0, 2}, {5, 2, 4}, {5, 8, 10}, {125, 8, 10}, {300, 8, 10}, {65535, 2, 4}} {
		h := Header{Fin: true, Op: OpBinary, Length: c.l}
		b := AppendHeaderLen(nil, h, c.lenBytes)
		got, n, err := ParseHeader(b, true)
		if len(b) != c.size || n != c.size || err != nil || got != h {
			t.Errorf("%+v/%d: % x -> %+v %d %v", h, c.lenBytes, b, got, n, err)
		}
	}
	// 2^63 is expressible and rejected by the parser.
	b := AppendHeaderLen(nil, Header{Fin: true, Op: OpBinary, Length: 1 << 63}, 8)
	if _, _, err := ParseHeader(b, true); err != ErrLength63 {
		t.Errorf("2^63: %v", err)
	}
	// Reserved fields are written verbatim.
	b = AppendHeader(nil, Header{Rsv: 4, Op: 0xB, Length: 200})
	if !bytes.Equal(b, []byte{0x4B, 126, 0, 200}) {
		t.Errorf("verbatim: % x", b)
	}
	for _, c := range []struct {
		l        uint64
		lenBytes int
	}{{126, 0}, {65536, 2}, {1, 3}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("AppendHeaderLen(%d, %d) did not panic", c.l, c.lenBytes)
				}
			}()
			AppendHeaderLen(nil, Header{Length: c.l}, c.lenBytes)
		}()
	}
}

func maskSlow(key [4]byte, b []byte, pos int) {
	for i := range b {
		b[i] ^= key[(pos+i)%4]
	}
}

func TestMask(t *testing.T) {
	key := [4]byte{0x11, 0x22, 0x44, 0x88}
	for size := 0; size < 100; size++ {
		for pos := 0; pos < 8; pos++ {
			src := make([]byte, size+3)
			for i := range src {
				src[i] = byte(i*7 + size)
			}
			for off := 0; off < 3; off++ { // unaligned starts
				a := bytes.Clone(src[off : off+size])
				b := bytes.Clone(a)
				np := Mask(key, a, pos)
				maskSlow(key, b, pos)
				if !bytes.Equal(a, b) || np != (pos+size)%4 {
					t.Fatalf("size %d pos %d off %d: mismatch or pos %d", size, pos, off, np)
				}
			}
		}
	}
	// Masking in pieces equals masking at once.
	whole := bytes.Repeat([]byte("abcdefghij"), 20)
	pieces := bytes.Clone(whole)
	Mask(key, whole, 0)
	pos := 0
	for i, step := 0, 1; i < len(pieces); i, step = i+step, step+3 {
		j := min(i+step, len(pieces))
		pos = Mask(key, pieces[i:j], pos)
	}
	if !bytes.Equal(whole, pieces) {
		t.Error("piecewise masking differs")
	}
}

func TestAcceptKey(t *testing.T) {
	// RFC 6455 section 1.3.
	if got := AcceptKey("dGhlIHNhbXBsZSBub25jZQ=="); got != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Errorf("AcceptKey = %q", got)
	}
	k1, k2 := NewKey(), NewKey()
	raw, err := base64.StdEncoding.DecodeString(k1)
	if err != nil || len(raw) != 16 || len(k1) != 24 || k1 == k2 {
		t.Errorf("NewKey: %q %q %v", k1, k2, err)
	}
}

func TestUTF8(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		ok   bool // valid and complete
		// failAt is the index of the first byte at which Feed must fail
		// when fed byte by byte; -1 when the input is a valid prefix.
		failAt int
	}{
		{"empty", nil, true, -1},
		{"ascii", []byte("hello, world 0123456789"), true, -1},
		{"2-byte", []byte("ü"), true, -1},
		{"3-byte", []byte("€"), true, -1},
		{"4-byte", []byte("𝄞"), true, -1},
		{"max", []byte{0xF4, 0x8F, 0xBF, 0xBF}, true, -1},
		{"mixed", []byte("κόσμε ascii 𝄞 €"), true, -1},
		{"truncated 2", []byte{0xC3}, false, -1},
		{"truncated 4", []byte{0xF0, 0x9D, 0x84}, false, -1},
		{"F4 90", []byte{0xF4, 0x90, 0x80, 0x80}, false, 1},
		{"ED A0 surrogate", []byte{0xED, 0xA0, 0x80}, false, 1},
		{"ED 9F ok", []byte{0xED, 0x9F, 0xBF}, true, -1},
		{"overlong C0", []byte{0xC0, 0x80}, false, 0},
		{"overlong C1", []byte{0xC1, 0xBF}, false, 0},
		{"overlong E0", []byte{0xE0, 0x9F, 0xBF}, false, 1},
		{"overlong F0", []byte{0xF0, 0x8F, 0xBF, 0xBF}, false, 1},
		{"F5", []byte{0xF5, 0x80, 0x80, 0x80}, false, 0},
		{"FF", []byte("abc\xff"), false, 3},
		{"stray continuation", []byte("ab\x80"), false, 2},
		{"missing continuation", []byte{0xE2, 0x82, 'a'}, false, 2},
		{"late error", []byte("0123456789abcdef\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5\xed\xa0\x80edited"), false, 28},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if ValidUTF8(tt.in) != tt.ok {
				t.Errorf("ValidUTF8 = %v", !tt.ok)
			}
			var v UTF8Validator
			if v.Feed(tt.in) != (tt.failAt < 0) || v.Complete() != tt.ok {
				t.Errorf("whole: Feed/Complete wrong")
			}
			v.Reset()
			failed := -1
			for i := range tt.in {
				if !v.Feed(tt.in[i : i+1]) {
					failed = i
					break
				}
			}
			if failed != tt.failAt {
				t.Errorf("byte by byte failed at %d, want %d", failed, tt.failAt)
			}
			if failed >= 0 && (v.Feed([]byte("a")) || v.Complete()) {
				t.Errorf("failure not sticky")
			}
		})
	}
	// Exhaustive agreement with unicode/utf8 on all sequences of up to 3
	// bytes from an interesting alphabet, split at every point.
	alpha := []byte{0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xDF, 0xE0, 0xE1, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF}
	var buf [4]byte
	for _, a := range alpha {
		for _, b := range alpha {
			for _, c := range alpha {
				for _, d := range alpha {
					buf = [4]byte{a, b, c, d}
					in := buf[:]
					for split := 0; split <= 4; split++ {
						var v UTF8Validator
						ok := v.Feed(in[:split]) && v.Feed(in[split:]) && v.Complete()
						if ok != utf8.Valid(in) {
							t.Fatalf("% x split %d: %v, utf8.Valid %v", in, split, ok, !ok)
						}
					}
				}
			}
		}
	}
}

func TestFramesAndClose(t *testing.T) {
	f := AppendFrame(nil, true, OpText, []byte("hi"))
	if !bytes.Equal(f, []byte{0x81, 2, 'h', 'i'}) {
		t.Errorf("AppendFrame: % x", f)
	}
	key := [4]byte{1, 2, 3, 4}
	payload := []byte("hello")
	m := AppendMaskedFrame(nil, false, OpBinary, key, payload)
	h, n, err := ParseHeader(m, false)
	if err != nil || h.Fin || h.Op != OpBinary || h.Mask != key || h.Length != 5 || string(payload) != "hello" {
		t.Fatalf("masked: %+v %v", h, err)
	}
	Mask(h.Mask, m[n:], 0)
	if string(m[n:]) != "hello" {
		t.Errorf("unmasked %q", m[n:])
	}

	if p := ClosePayload(1000, "bye"); !bytes.Equal(p, []byte{0x03, 0xE8, 'b', 'y', 'e'}) {
		t.Errorf("ClosePayload: % x", p)
	}
	if p := ClosePayload(0, "x"); len(p) != 0 {
		t.Errorf("ClosePayload(0): % x", p)
	}
	tests := []struct {
		in     []byte
		code   int
		reason string
		err    error
	}{
		{nil, 1005, "", nil},
		{[]byte{0x03}, 0, "", ErrInvalidClosePayload},
		{ClosePayload(1000, ""), 1000, "", nil},
		{ClosePayload(1001, "going"), 1001, "going", nil},
		{ClosePayload(4999, "€"), 4999, "€", nil},
		{ClosePayload(1005, "x"), 1005, "", ErrInvalidCloseCode},
		{ClosePayload(999, ""), 999, "", ErrInvalidCloseCode},
		{ClosePayload(1015, ""), 1015, "", ErrInvalidCloseCode},
		{ClosePayload(5000, ""), 5000, "", ErrInvalidCloseCode},
		{ClosePayload(1000, "\xed\xa0\x80"), 1000, "", ErrInvalidUTF8},
	}
	for _, tt := range tests {
		code, reason, err := ParseClosePayload(tt.in)
		if code != tt.code || string(reason) != tt.reason || err != tt.err {
			t.Errorf("ParseClosePayload(% x) = %d %q %v", tt.in, code, reason, err)
		}
	}
}
