package ws

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// event is one callback of a Parser, flattened for comparison.
type event struct {
	control bool
	op      Opcode
	payload string
}

func (e event) String() string {
	kind := "msg"
	if e.control {
		kind = "ctl"
	}
	return fmt.Sprintf("%s/%v/%q", kind, e.op, e.payload)
}

// feedChunks feeds in to a fresh parser in chunks of the given size (0: all
// at once) and returns the events and the final error.
func feedChunks(in []byte, chunk int, max int64) ([]event, error) {
	p := Parser{MaxMessageSize: max}
	var evs []event
	onMsg := func(op Opcode, b []byte) { evs = append(evs, event{false, op, string(b)}) }
	onCtl := func(op Opcode, b []byte) { evs = append(evs, event{true, op, string(b)}) }
	if chunk <= 0 {
		chunk = len(in) + 1
	}
	var err error
	for i := 0; ; i += chunk {
		j := min(i+chunk, len(in))
		if err = p.Feed(in[i:j], onMsg, onCtl); err != nil || j == len(in) {
			break
		}
	}
	return evs, err
}

func frames(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func fr(fin bool, op Opcode, s string) []byte { return AppendFrame(nil, fin, op, []byte(s)) }

func msg(op Opcode, s string) event { return event{false, op, s} }
func ctl(op Opcode, s string) event { return event{true, op, s} }

func TestParser(t *testing.T) {
	big := strings.Repeat("x", 70000)
	tests := []struct {
		name string
		in   []byte
		max  int64
		want []event
		err  error
	}{
		{"text", fr(true, OpText, "hello"), 0, []event{msg(OpText, "hello")}, nil},
		{"empty binary", fr(true, OpBinary, ""), 0, []event{msg(OpBinary, "")}, nil},
		{"two messages", frames(fr(true, OpBinary, "a"), fr(true, OpText, "b")), 0,
			[]event{msg(OpBinary, "a"), msg(OpText, "b")}, nil},
		{"fragmented", frames(fr(false, OpText, "he"), fr(false, OpContinuation, "l"), fr(true, OpContinuation, "lo")), 0,
			[]event{msg(OpText, "hello")}, nil},
		{"empty fragments", frames(fr(false, OpBinary, ""), fr(false, OpContinuation, ""), fr(true, OpContinuation, "z")), 0,
			[]event{msg(OpBinary, "z")}, nil},
		{"control interleaved", frames(fr(false, OpBinary, "ab"), fr(true, OpPing, "p0"), fr(false, OpContinuation, "c"), fr(true, OpPong, ""), fr(true, OpContinuation, "d")), 0,
			[]event{ctl(OpPing, "p0"), ctl(OpPong, ""), msg(OpBinary, "abcd")}, nil},
		{"big 16-bit and 64-bit", frames(fr(true, OpBinary, big[:300]), fr(true, OpBinary, big)), 0,
			[]event{msg(OpBinary, big[:300]), msg(OpBinary, big)}, nil},
		{"non-minimal length", append(AppendHeaderLen(nil, Header{Fin: true, Op: OpText, Length: 2}, 8), "ok"...), 0,
			[]event{msg(OpText, "ok")}, nil},
		{"utf8 split across fragments", frames(fr(false, OpText, "\xe2"), fr(false, OpContinuation, "\x82"), fr(true, OpContinuation, "\xac")), 0,
			[]event{msg(OpText, "€")}, nil},
		{"close", frames(fr(true, OpClose, string(ClosePayload(1000, "done"))), fr(true, OpText, "ignored"), []byte{0xff}), 0,
			[]event{ctl(OpClose, "\x03\xe8done")}, nil},
		{"close empty", fr(true, OpClose, ""), 0, []event{ctl(OpClose, "")}, nil},
		{"close within fragmented", frames(fr(false, OpText, "a"), fr(true, OpClose, "")), 0, []event{ctl(OpClose, "")}, nil},
		{"at max", fr(true, OpBinary, "12345"), 5, []event{msg(OpBinary, "12345")}, nil},

		{"stray continuation", fr(true, OpContinuation, "x"), 0, nil, ErrUnexpectedContinuation},
		{"new data frame mid message", frames(fr(false, OpText, "a"), fr(true, OpText, "b")), 0, nil, ErrExpectedContinuation},
		{"new binary mid message", frames(fr(false, OpBinary, "a"), fr(true, OpPing, ""), fr(true, OpBinary, "b")), 0,
			[]event{ctl(OpPing, "")}, ErrExpectedContinuation},
		{"continuation after complete", frames(fr(true, OpText, "a"), fr(true, OpContinuation, "b")), 0,
			[]event{msg(OpText, "a")}, ErrUnexpectedContinuation},
		{"invalid utf8", fr(true, OpText, "a\xffb"), 0, nil, ErrInvalidUTF8},
		{"invalid utf8 fails fast", frames(fr(false, OpText, "\xf4\x90"), fr(true, OpPing, "never")), 0, nil, ErrInvalidUTF8},
		{"truncated utf8 at fin", frames(fr(false, OpText, "a"), fr(true, OpContinuation, "\xe2\x82")), 0, nil, ErrInvalidUTF8},
		{"binary not utf8 checked", fr(true, OpBinary, "\xff"), 0, []event{msg(OpBinary, "\xff")}, nil},
		{"too big", fr(true, OpBinary, "123456"), 5, nil, ErrMessageTooBig},
		{"too big fragmented", frames(fr(false, OpBinary, "123"), fr(true, OpContinuation, "456")), 5, nil, ErrMessageTooBig},
		{"too big header only", AppendHeader(nil, Header{Fin: true, Op: OpBinary, Length: 1 << 40}), 1 << 20, nil, ErrMessageTooBig},
		{"control not counted", frames(fr(false, OpBinary, "123"), fr(true, OpPing, "123456"), fr(true, OpContinuation, "45")), 5,
			[]event{ctl(OpPing, "123456"), msg(OpBinary, "12345")}, nil},
		{"masked", AppendMaskedFrame(nil, true, OpText, [4]byte{1, 2, 3, 4}, []byte("x")), 0, nil, ErrMaskedServerFrame},
		{"rsv", []byte{0xC1, 0}, 0, nil, ErrReservedBits},
		{"reserved opcode", []byte{0x83, 0}, 0, nil, ErrReservedOpcode},
		{"fragmented ping", fr(false, OpPing, ""), 0, nil, ErrFragmentedControl},
		{"long ping", fr(true, OpPing, strings.Repeat("p", 126)), 0, nil, ErrControlTooLong},
		{"length 2^63", AppendHeaderLen(nil, Header{Fin: true, Op: OpBinary, Length: 1 << 63}, 8), 0, nil, ErrLength63},
		{"close one byte", fr(true, OpClose, "\x03"), 0, nil, ErrInvalidClosePayload},
		{"close 1005", fr(true, OpClose, string(ClosePayload(1005, "x"))), 0, nil, ErrInvalidCloseCode},
		{"close bad reason", fr(true, OpClose, string(ClosePayload(1000, "\xc0"))), 0, nil, ErrInvalidUTF8},
		{"error after messages", frames(fr(true, OpText, "a"), fr(true, OpPing, "b"), []byte{0x83, 0}), 0,
			[]event{msg(OpText, "a"), ctl(OpPing, "b")}, ErrReservedOpcode},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, chunk := range []int{0, 1, 2, 3, 7, 64} {
				evs, err := feedChunks(tt.in, chunk, tt.max)
				if err != tt.err || fmt.Sprint(evs) != fmt.Sprint(tt.want) {
					t.Fatalf("chunk %d: got %v, %v; want %v, %v", chunk, evs, err, tt.want, tt.err)
				}
			}
		})
	}
}

func TestParserStickyAndReset(t *testing.T) {
	var p Parser
	if err := p.Feed([]byte{0x83, 0}, nil, nil); err != ErrReservedOpcode {
		t.Fatal(err)
	}
	if err := p.Feed(fr(true, OpText, "x"), nil, nil); err != ErrReservedOpcode || p.Err() != ErrReservedOpcode {
		t.Fatal("error not sticky")
	}
	p.Reset()
	n := 0
	if err := p.Feed(fr(true, OpText, "x"), func(Opcode, []byte) { n++ }, nil); err != nil || n != 1 {
		t.Fatal(err, n)
	}
	if err := p.Feed(fr(true, OpClose, ""), nil, nil); err != nil || !p.Closed() {
		t.Fatal(err)
	}
	if err := p.Feed([]byte{0xff, 0xff}, nil, nil); err != nil {
		t.Fatal("input after close not discarded:", err)
	}
}

func TestCloseCode(t *testing.T) {
	tests := []struct {
		err  error
		code int
	}{
		{nil, 1000},
		{ErrInvalidUTF8, 1007},
		{fmt.Errorf("wrapped: %w", ErrInvalidUTF8), 1007},
		{ErrMessageTooBig, 1009},
		{ErrReservedBits, 1002}, {ErrReservedOpcode, 1002}, {ErrMaskedServerFrame, 1002},
		{ErrUnmaskedClientFrame, 1002}, {ErrFragmentedControl, 1002}, {ErrControlTooLong, 1002},
		{ErrLength63, 1002}, {ErrUnexpectedContinuation, 1002}, {ErrExpectedContinuation, 1002},
		{ErrInvalidClosePayload, 1002}, {ErrInvalidCloseCode, 1002},
		{errors.New("other"), 1011},
	}
	for _, tt := range tests {
		if got := CloseCode(tt.err); got != tt.code {
			t.Errorf("CloseCode(%v) = %d, want %d", tt.err, got, tt.code)
		}
	}
}

// FuzzParser checks that the parser never panics, that its result does not
// depend on how the input is split, and that messages encoded with
// AppendFrame (fragmented, with interleaved pings) come back unchanged.
func FuzzParser(f *testing.F) {
	f.Add([]byte{0x81, 0x02, 'h', 'i'}, uint8(1))
	f.Add(frames(fr(false, OpText, "a"), fr(true, OpPing, "p"), fr(true, OpContinuation, "b")), uint8(2))
	f.Add(frames(fr(true, OpClose, "\x03\xe8"), fr(true, OpText, "x")), uint8(3))
	f.Add(AppendHeaderLen(nil, Header{Fin: true, Op: OpBinary, Length: 3}, 8), uint8(5))
	f.Add([]byte("\xf4\x90\x80\x80 invalid text"), uint8(7))
	f.Fuzz(func(t *testing.T, data []byte, chunk uint8) {
		// 1. Arbitrary input: same outcome however it is split.
		evs1, err1 := feedChunks(data, 0, 1<<16)
		evs2, err2 := feedChunks(data, int(chunk%17)+1, 1<<16)
		if err1 != err2 || fmt.Sprint(evs1) != fmt.Sprint(evs2) {
			t.Fatalf("split changes result: %v %v / %v %v", evs1, err1, evs2, err2)
		}
		// 2. Round trip: data as binary messages separated by 0xFF and
		// text (hex) messages, fragmented in pieces of chunk bytes.
		var wire []byte
		var want []event
		for i, m := range bytes.Split(data, []byte{0xff}) {
			op, payload := OpBinary, m
			if i%2 == 1 {
				op, payload = OpText, fmt.Appendf(nil, "%x", m)
			}
			want = append(want, msg(op, string(payload)))
			step := int(chunk%9) + 1
			first := true
			for len(payload) > step {
				o := OpContinuation
				if first {
					o, first = op, false
				}
				wire = AppendFrame(wire, false, o, payload[:step])
				wire = AppendFrame(wire, true, OpPing, payload[:min(len(payload), 125)])
				payload = payload[step:]
			}
			o := OpContinuation
			if first {
				o = op
			}
			wire = AppendFrame(wire, true, o, payload)
		}
		var got []event
		var p Parser
		err := p.Feed(wire, func(op Opcode, b []byte) { got = append(got, msg(op, string(b))) }, nil)
		if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("round trip: %v, %v; want %v", got, err, want)
		}
	})
}

func BenchmarkParseHeader(b *testing.B) {
	frame := AppendHeader(nil, Header{Fin: true, Op: OpBinary, Length: 300})
	for b.Loop() {
		if _, _, err := ParseHeader(frame, true); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMask(b *testing.B) {
	for _, size := range []int{16, 128, 4096} {
		buf := make([]byte, size)
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			b.SetBytes(int64(size))
			for b.Loop() {
				Mask([4]byte{1, 2, 3, 4}, buf, 1)
			}
		})
	}
}

func BenchmarkUTF8Validator(b *testing.B) {
	for _, s := range []string{strings.Repeat(`{"id":1234567}`, 20), strings.Repeat("κόσμε€𝄞", 20)} {
		in := []byte(s)
		b.Run(fmt.Sprint(len(in)), func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			var v UTF8Validator
			for b.Loop() {
				v.Reset()
				if !v.Feed(in) || !v.Complete() {
					b.Fatal("invalid")
				}
			}
		})
	}
}

func BenchmarkParser(b *testing.B) {
	// 64 small messages per 4 KiB-ish batch, mixed text and binary.
	var wire []byte
	for i := range 64 {
		if i%3 == 0 {
			wire = AppendFrame(wire, true, OpBinary, []byte("12345678"))
		} else {
			wire = AppendFrame(wire, true, OpText, fmt.Appendf(nil, `{"id":%d}`, i))
		}
	}
	var p Parser
	n := 0
	onMsg := func(Opcode, []byte) { n++ }
	b.SetBytes(int64(len(wire)))
	b.ResetTimer()
	for b.Loop() {
		if err := p.Feed(wire, onMsg, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/msg")
}
