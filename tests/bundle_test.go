//go:build linux && cgo

package talaris_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
)

// Recv bundles (on by default; Config.NoRecvBundle turns them off): one multishot recv completion hands
// over several receive slots, taken from the buffer ring in its order
// (csrc/bufring.h). The integrity, in-place, cgo-call and kill-restart
// tests have bundle rows (TestIntegrity/bundle*, TestTLSInPlace*/bundle*,
// TestHandoffCgoCalls/bundle, TestReconnectKillRestart/*/bundle,
// TestTLSInPlaceCloseRace/bundle); these race closes against ws:// floods.

// TestRecvBundleCloseRace: three ws:// connections flood 300-byte frames
// (straddling 4 KiB slots) into a pool receiving with bundles from a
// 16-slot ring, so completions carry several slots and the ring runs dry;
// Conn.Close and Pool.Close race the pump from other goroutines while the
// callback checks every payload byte in order. The pump ends with
// ErrPoolClosed, nothing read is wrong, and no slot is lost or handed out
// twice (a lost one would starve the recvs: the hang guard; a doubled one
// would corrupt a payload).
func TestRecvBundleCloseRace(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	spec := streamSpec{n: scaled(200_000), size: 300}
	for it := range 6 {
		t.Run(fmt.Sprint(it), func(t *testing.T) {
			p := newTestPool(t, talaris.Config{BufSize: 4096, BufCount: 16}, hangGuard)
			var conns []talaris.Conn
			sts := map[talaris.Conn]*streamState{}
			for range 3 {
				c, err := p.DialAsync(srv.URL+spec.path(), nil)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
				sts[c] = newStreamState(spec)
			}
			floodCloseRace(t, p, conns, it, func(c talaris.Conn, ev talaris.Event) int {
				st := sts[c]
				st.on(ev)
				return st.chk.Count()
			})
			for i, c := range conns {
				if st := sts[c]; st.err != nil {
					t.Errorf("conn %d: %v", i, st.err)
				}
			}
		})
	}
}

// TestRecvBundleFloodSlowPump: four ws:// floods into 16 slots of 4 KiB
// with bundles, pumped by a consumer that sleeps after every batch: slots
// stay held by payloads delivered in place, bundles empty the ring and
// end, recvs wait for slots and are re-armed, connections stall. Every
// message of every stream arrives, in order, with the right checksum,
// and the pool's slots all come back (the next stream on the same pool
// runs through them again).
func TestRecvBundleFloodSlowPump(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	p := newTestPool(t, talaris.Config{BufSize: 4096, BufCount: 16, EventRingSize: 1024, Loops: 1}, 3*hangGuard)
	for round, spec := range []streamSpec{{n: scaled(50_000), size: 300}, {n: scaled(5_000), size: 9000}} {
		sts := map[talaris.Conn]*streamState{}
		for range 4 {
			sts[dial(t, p, srv.URL+spec.path())] = newStreamState(spec)
		}
		pumpStreams(t, p, sts, fmt.Sprintf("round %d ", round), func() { time.Sleep(200 * time.Microsecond) })
	}
	st := p.Stats()
	t.Logf("stats %+v", st)
	if st.Rearms == 0 || st.Stalls == 0 {
		t.Errorf("Rearms=%d Stalls=%d, want both > 0 (bundles emptying 16 slots, a slow pump)", st.Rearms, st.Stalls)
	}
}
