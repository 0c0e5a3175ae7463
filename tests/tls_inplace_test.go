//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// In-place delivery on wss://: SSL_read decrypts into plaintext slots and
// whole frames inside one are handed to the callback where they lie (the
// receive path of ws://); a frame not all decrypted yet waits in its slot
// (moved to the front of a fresh one when the slot is full) so it is
// delivered in place too; fragmented messages and frames larger than a
// slot can hold take the reassembly path; and when every plaintext slot is
// held by events the pump has not passed, a connection decrypts into its
// own buffer and copies (the ring stays the only back-pressure).
// testhook.PayloadOrigin says which path each payload took.

// ptSlot, ptRecord mirror TL_PT_SLOT and TL_PT_RECORD (csrc/base/slots.h): a
// frame of at most ptSlot-ptRecord bytes is kept whole in a slot.
const (
	ptSlot   = 64 << 10
	ptRecord = 16 << 10
)

// ipMsg is one message of an in-place stream: payload i of size bytes,
// sent in frag frames (1: whole).
type ipMsg struct{ size, frag int }

// ipStream is what an in-place test server sends on one connection: the
// messages, how the frame bytes are cut into TLS records, and how it ends.
type ipStream struct {
	msgs []ipMsg
	// chunk > 0: the frame stream is written in chunk-byte writes (one TLS
	// record each, up to 16 KiB), so frames straddle records; 0: one
	// record per frame. Records are batched into ~64 KiB TCP writes.
	chunk int
	// cut > 0: after the messages, cut bytes of one more frame, then the
	// TLS stream ends (close_notify, FIN) without a close frame.
	cut int
}

func (s ipStream) payload(i int) []byte { return wstest.Payload(i, s.msgs[i].size) }

// frames returns message i's frames.
func (s ipStream) frames(i int) []byte {
	p, m := s.payload(i), s.msgs[i]
	if m.frag <= 1 {
		return ws.AppendFrame(nil, true, ws.OpBinary, p)
	}
	var out []byte
	step := (len(p) + m.frag - 1) / m.frag
	for k := 0; k < m.frag; k++ {
		lo, hi := min(k*step, len(p)), min((k+1)*step, len(p))
		op := ws.OpContinuation
		if k == 0 {
			op = ws.OpBinary
		}
		out = ws.AppendFrame(out, k == m.frag-1, op, p[lo:hi])
	}
	return out
}

// serve writes the stream on tc (records batched by bc).
func (s ipStream) serve(tc *tls.Conn, bc *batchConn, br *bufio.Reader) {
	bc.hold = true
	var pend []byte
	write := func(b []byte) bool {
		if _, err := tc.Write(b); err != nil {
			return false
		}
		if len(bc.buf) >= 64<<10 {
			return bc.Flush() == nil
		}
		return true
	}
	for i := range s.msgs {
		f := s.frames(i)
		if s.chunk == 0 {
			if !write(f) {
				return
			}
			continue
		}
		pend = append(pend, f...)
		for len(pend) >= s.chunk {
			if !write(pend[:s.chunk]) {
				return
			}
			pend = pend[s.chunk:]
		}
	}
	if s.cut > 0 {
		pend = append(pend, ws.AppendFrame(nil, true, ws.OpBinary, wstest.Payload(len(s.msgs), 2*s.cut))[:s.cut]...)
	} else {
		pend = append(pend, ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(1000, "done"))...)
	}
	if len(pend) > 0 && !write(pend) {
		return
	}
	if bc.Flush() != nil {
		return
	}
	bc.hold = false
	if s.cut > 0 {
		tc.Close() // close_notify, then FIN: the frame stays cut
		return
	}
	readClose(br)
	tc.Close()
}

// ipResult is what one connection received.
type ipResult struct {
	got                   int // messages checked so far
	inPlace, copied       int // whole-frame messages by origin
	reassembled           int // fragmented or slot-crossing messages seen in the arena
	bytes                 int // payload bytes delivered
	final                 *finalEvent
	err                   error
	fragInPlace, otherOrg int
}

// check handles one event of a connection fed s.
func (r *ipResult) check(p *talaris.Pool, s ipStream, ev talaris.Event) {
	switch ev.Kind {
	case talaris.EventOpen:
	case talaris.EventBinary:
		if r.err != nil {
			return
		}
		if r.got >= len(s.msgs) {
			r.err = fmt.Errorf("message %d beyond the %d sent", r.got, len(s.msgs))
			return
		}
		if want := s.payload(r.got); !bytes.Equal(ev.Payload, want) {
			r.err = fmt.Errorf("message %d: %d bytes differ from the %d sent (order or content)", r.got, len(ev.Payload), len(want))
			return
		}
		switch testhook.PayloadOrigin(p, ev.Payload) {
		case testhook.OriginPlaintext:
			if s.msgs[r.got].frag > 1 {
				r.fragInPlace++
			}
			r.inPlace++
		case testhook.OriginArena:
			r.copied++
		default:
			r.otherOrg++
		}
		r.bytes += len(ev.Payload)
		r.got++
	default:
		f := copyFinal(ev)
		r.final = &f
	}
}

// ipServer serves s over TLS (version v only; 0: any) with ALPN http/1.1
// and returns its wss:// URL.
func ipServer(t *testing.T, s ipStream, v uint16) string {
	cfg := serverTLS(t, testCertFile, testKeyFile, v, v)
	cfg.NextProtos = []string{"http/1.1"}
	return tlsRawServer(t, cfg, s.serve)
}

// runInPlace dials url n times on p, pumps until every connection ended
// (afterBatch runs after each Pump call) and returns the results.
func runInPlace(t *testing.T, p *talaris.Pool, url string, n int, s ipStream, afterBatch func()) []*ipResult {
	t.Helper()
	res := map[talaris.Conn]*ipResult{}
	var order []*ipResult
	for range n {
		c, err := p.DialAsync(url, tlsOpts)
		if err != nil {
			t.Fatal(err)
		}
		r := &ipResult{}
		res[c] = r
		order = append(order, r)
	}
	ended := 0
	pumpUntil(t, p, func(c talaris.Conn, ev talaris.Event) {
		r := res[c]
		if r == nil {
			t.Errorf("event %v for an unknown connection", ev.Kind)
			return
		}
		r.check(p, s, ev)
		if r.final != nil && ev.Kind != talaris.EventBinary {
			ended++
		}
	}, func() bool { return ended == n }, afterBatch)
	for i, r := range order {
		if r.err != nil {
			t.Errorf("conn %d: %v", i, r.err)
		}
		if r.otherOrg > 0 || r.fragInPlace > 0 {
			t.Errorf("conn %d: %d payloads neither in a plaintext slot nor in the arena, %d fragmented ones in place", i, r.otherOrg, r.fragInPlace)
		}
	}
	return order
}

// expectClean checks that every message arrived and the close was clean.
func expectClean(t *testing.T, rs []*ipResult, s ipStream) {
	t.Helper()
	for i, r := range rs {
		if r.got != len(s.msgs) {
			t.Errorf("conn %d: %d of %d messages", i, r.got, len(s.msgs))
		}
		if r.final == nil || r.final.Kind != talaris.EventClose || r.final.Code != 1000 {
			t.Errorf("conn %d: final %+v, want EventClose 1000", i, r.final)
		}
	}
}

func uniform(n, size, frag int) []ipMsg {
	m := make([]ipMsg, n)
	for i := range m {
		m[i] = ipMsg{size: size, frag: frag}
	}
	return m
}

// TestTLSInPlace: every frame on wss:// is delivered from the plaintext
// slot it was decrypted into, whether a record holds one frame, many, or
// frames straddle records (the plaintext of consecutive records is
// contiguous in the slot, and a frame cut at a slot's end moves to the
// next). Every payload is checked, in order, on TLS 1.2 and 1.3. The
// event ring (4096 events, about 1 MiB of these frames) is far smaller
// than the 128 plaintext slots (8 MiB), so none runs out: no copy at all.
func TestTLSInPlace(t *testing.T) {
	t.Logf("TLS backend %s", talaris.TLSBackend())
	n := scaled(60_000)
	patterns := []struct {
		name  string
		chunk int
	}{
		{"frame-per-record", 0},
		{"many-per-record", 16000},
		{"straddling-records", 1000},
		{"tiny-records", 97},
	}
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		for _, pat := range patterns {
			t.Run(tls.VersionName(v)+"/"+pat.name, func(t *testing.T) {
				s := ipStream{msgs: uniform(n, 256, 1), chunk: pat.chunk}
				url := ipServer(t, s, v)
				p := newTestPool(t, testhook.WithKnobs(talaris.Config{}, testhook.Knobs{EventRingSize: 4096}), hangGuard)
				rs := runInPlace(t, p, url, 2, s, nil)
				expectClean(t, rs, s)
				for i, r := range rs {
					if r.copied != 0 {
						t.Errorf("conn %d: %d of %d frames copied into the arena, want 0", i, r.copied, r.got)
					}
					t.Logf("conn %d: %d in place, %d copied", i, r.inPlace, r.copied)
				}
			})
		}
	}
}

// TestTLSInPlaceMixed: fragmented messages (reassembled, so in the arena),
// large messages (a 1 MiB one never fits a plaintext slot) and small whole
// frames interleaved, cut into records that split frames.
func TestTLSInPlaceMixed(t *testing.T) {
	var msgs []ipMsg
	for i := range scaled(3000) {
		switch {
		case i%100 == 99:
			msgs = append(msgs, ipMsg{size: 1 << 20, frag: 1})
		case i%10 == 3:
			msgs = append(msgs, ipMsg{size: 40000, frag: 1})
		case i%7 == 0:
			msgs = append(msgs, ipMsg{size: 3000, frag: 3})
		default:
			msgs = append(msgs, ipMsg{size: 200 + i%300, frag: 1})
		}
	}
	for _, chunk := range []int{0, 5000, -1} {
		name, cfg := fmt.Sprintf("chunk%d", chunk), talaris.Config{}
		if chunk < 0 { // recv bundles: records straddle the slots of one completion
			name, chunk, cfg = "nobundle-chunk5000", 5000, testhook.WithKnobs(talaris.Config{BufSize: 4096}, testhook.Knobs{NoRecvBundle: true})
		}
		t.Run(name, func(t *testing.T) {
			s := ipStream{msgs: msgs, chunk: chunk}
			url := ipServer(t, s, 0)
			p := newTestPool(t, cfg, hangGuard)
			rs := runInPlace(t, p, url, 2, s, nil)
			expectClean(t, rs, s)
			big := 0
			for _, m := range msgs {
				if m.frag > 1 || m.size > ptSlot-ptRecord {
					big++
				}
			}
			for i, r := range rs {
				// Fragmented and 1 MiB messages can only be in the arena
				// (runInPlace fails a fragmented one in place).
				if r.copied < big || r.inPlace == 0 {
					t.Errorf("conn %d: %d copied (want >= %d reassembled), %d in place (want > 0)", i, r.copied, big, r.inPlace)
				}
				t.Logf("conn %d: %d in place, %d copied", i, r.inPlace, r.copied)
			}
		})
	}
}

// TestTLSInPlaceCutMidFrame: the TLS stream ends (close_notify and FIN)
// in the middle of a frame: every whole frame before it is delivered, in
// place, and the connection ends with ErrConnectionLost (1006).
func TestTLSInPlaceCutMidFrame(t *testing.T) {
	for _, cut := range []int{1, 3, 150} {
		t.Run(fmt.Sprintf("cut%d", cut), func(t *testing.T) {
			s := ipStream{msgs: uniform(scaled(5000), 256, 1), chunk: 700, cut: cut}
			url := ipServer(t, s, 0)
			p := newTestPool(t, talaris.Config{}, hangGuard)
			rs := runInPlace(t, p, url, 2, s, nil)
			for i, r := range rs {
				if r.got != len(s.msgs) {
					t.Errorf("conn %d: %d of %d whole frames before the cut", i, r.got, len(s.msgs))
				}
				if r.final == nil || r.final.Kind != talaris.EventError || !errors.Is(r.final.Err, talaris.ErrConnectionLost) || r.final.Code != 1006 {
					t.Errorf("conn %d: final %+v, want EventError ErrConnectionLost 1006", i, r.final)
				}
				if r.inPlace == 0 {
					t.Errorf("conn %d: nothing delivered in place", i)
				}
			}
		})
	}
}

// TestTLSInPlaceFloodSlowPump: four connections flood 256-byte frames at a
// pump that sleeps after every batch, with only 8 plaintext slots
// (BufCount 64): the ring fills (Stalls), the plaintext slots run out
// while events still point into them and connections fall back to
// copying, then take slots again as the pump passes them. Nothing is lost,
// order is kept, memory stays the fixed pool (no allocation per slot).
// When the ring is full, its 16384 unconsumed events cannot all lie in 8
// slots of 64 KiB, so a stall means the fallback ran, and only it copies
// a whole 256-byte frame (TestTLSInPlace).
// The default row receives with recv bundles (a completion hands over
// several receive slots, which the BIO reads across); the nobundle row
// without them (testhook.Knobs.NoRecvBundle).
func TestTLSInPlaceFloodSlowPump(t *testing.T) {
	for _, bundle := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "nobundle"}[bundle], func(t *testing.T) {
			testTLSInPlaceFloodSlowPump(t, bundle)
		})
	}
}

func testTLSInPlaceFloodSlowPump(t *testing.T, bundle bool) {
	s := ipStream{msgs: uniform(scaled(100_000), 256, 1), chunk: 16000}
	url := ipServer(t, s, 0)
	// Loops 1: the slots are per loop (two loops would have 8 each for
	// two connections, and never run out).
	p := newTestPool(t, testhook.WithKnobs(talaris.Config{BufCount: 64, Loops: 1}, testhook.Knobs{EventRingSize: 1 << 14, NoRecvBundle: bundle}), 3*hangGuard)
	rs := runInPlace(t, p, url, 4, s, func() { time.Sleep(time.Millisecond) })
	expectClean(t, rs, s)
	st := testhook.Stats(p)
	t.Logf("stats %+v", st)
	if st.Stalls == 0 {
		t.Errorf("slow pump: Stalls=0, want > 0")
	}
	copied, inPlace := 0, 0
	for _, r := range rs {
		copied += r.copied
		inPlace += r.inPlace
	}
	t.Logf("%d in place, %d copied", inPlace, copied)
	if inPlace == 0 || copied == 0 {
		t.Errorf("%d in place (want > 0), %d copied (want > 0: the plaintext slots ran out)", inPlace, copied)
	}
}

// TestTLSInPlaceCloseRace: Pool.Close and Conn.Close race wss:// floods
// (TLS 1.3) from other goroutines, while the callback reads every payload
// byte: the slots outlive every event the pump still holds (the pump frees
// the loop on its way out), so nothing read is garbage, and the pump ends
// with ErrPoolClosed. The rows: our record layer opening records into
// plaintext slots (default, without recv bundles, and with one 4 KiB
// slot per completion, so records straddle slots and the close arrives
// mid-record), and the library's SSL_read path into them
// (NoTLSRecordLayer); PoolStats.TLSRecords says which one ran.
func TestTLSInPlaceCloseRace(t *testing.T) {
	s := ipStream{msgs: uniform(scaled(200_000), 256, 1), chunk: 16000}
	url := ipServer(t, s, tls.VersionTLS13)
	for _, cc := range []struct {
		name   string
		cfg    talaris.Config
		rounds int
	}{
		{"default", talaris.Config{}, 6},
		{"nobundle", testhook.WithKnobs(talaris.Config{}, testhook.Knobs{NoRecvBundle: true}), 6},
		{"1slot", testhook.WithKnobs(talaris.Config{BufSize: 4096}, testhook.Knobs{NoRecvBundle: true}), 4},
		{"notlsrec", talaris.Config{Tuning: talaris.Tuning{NoTLSRecordLayer: true}}, 4},
		{"libgcm", talaris.Config{Tuning: talaris.Tuning{NoOwnGCM: true}}, 4},
	} {
		for it := range cc.rounds {
			t.Run(fmt.Sprintf("%s/%d", cc.name, it), func(t *testing.T) {
				p := newTestPool(t, cc.cfg, hangGuard)
				var conns []talaris.Conn
				res := map[talaris.Conn]*ipResult{}
				for range 3 {
					c, err := p.DialAsync(url, tlsOpts)
					if err != nil {
						t.Fatal(err)
					}
					conns = append(conns, c)
					res[c] = &ipResult{}
				}
				floodCloseRace(t, p, conns, it, func(c talaris.Conn, ev talaris.Event) int {
					r := res[c]
					r.check(p, s, ev)
					return r.got
				})
				for i, c := range conns {
					if r := res[c]; r.err != nil || r.otherOrg > 0 {
						t.Errorf("conn %d: %v (%d payloads of unknown origin)", i, r.err, r.otherOrg)
					}
				}
				if n, off := testhook.Stats(p).TLSRecords, cc.cfg.Tuning.NoTLSRecordLayer || noTLSRec; (n > 0) == off {
					t.Errorf("TLSRecords = %d with NoTLSRecordLayer %v: the wrong record path ran", n, off)
				}
			})
		}
	}
}
