//go:build linux && cgo

package talaris

import (
	"bytes"
	"testing"

	"github.com/talaris-go/talaris/ws"
)

// TestFrameMasked: a direct send's frame, for every length encoding,
// parses with the reference ws package as one masked final frame of the
// opcode, and unmasks to the payload.
func TestFrameMasked(t *testing.T) {
	for _, n := range []int{0, 1, 7, 8, 9, 125, 126, 127, 1000, 65535, 65536, 70000} {
		for _, op := range []Opcode{OpText, OpBinary} {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(i*7 + n)
			}
			dst := make([]byte, n+wsMaxHdr)
			m, err := frameMasked(dst, op, b)
			if err != nil {
				t.Fatal(err)
			}
			h, hl, err := ws.ParseHeader(dst[:m], false)
			if err != nil || hl == 0 {
				t.Fatalf("len %d: header: %v", n, err)
			}
			if !h.Fin || h.Op != ws.Opcode(op) || !h.Masked || h.Length != uint64(n) || hl+n != m {
				t.Fatalf("len %d: header %+v (%d bytes), frame %d bytes", n, h, hl, m)
			}
			pl := bytes.Clone(dst[hl:m])
			ws.Mask(h.Mask, pl, 0)
			if !bytes.Equal(pl, b) {
				t.Fatalf("len %d: payload differs after unmasking", n)
			}
		}
	}
}

// TestFrameMaskedAllocs: framing a direct send allocates nothing (the
// mask key comes from crypto/rand into a stack array).
func TestFrameMaskedAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under the race detector")
	}
	b := make([]byte, 64)
	dst := make([]byte, 64+wsMaxHdr)
	if a := testing.AllocsPerRun(1000, func() { frameMasked(dst, OpBinary, b) }); a != 0 {
		t.Errorf("%v allocations per frame", a)
	}
}

// BenchmarkFrameMasked: the Go-side cost of framing a 64-byte order.
func BenchmarkFrameMasked(b *testing.B) {
	p := make([]byte, 64)
	dst := make([]byte, 64+wsMaxHdr)
	for b.Loop() {
		frameMasked(dst, OpBinary, p)
	}
}
