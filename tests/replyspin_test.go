//go:build linux && cgo

package talaris_test

import (
	"errors"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
)

// The reply spin (Config.ReplySpin; docs/ARCHITECTURE.md, "The reply
// spin"): after a send, the pump and the loop spin for the answer instead
// of sleeping, while the send is unanswered and answers have been coming
// within ReplySpin. Real gorilla servers on loopback: a fast echo (the
// spin is taken), an echo 2 ms late (at most the first send spins: the
// spin stays off), a peer that never answers (Close and Conn.Close racing
// the spin end it). PoolStats.ReplySpins/ReplyLate are the pump's counts.
// Timeouts are hang guards only.

func TestReplySpin(t *testing.T) {
	fast := wstest.NewGorilla().Start(t).URL + "/echo"
	secure := wstest.NewGorilla().StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0)).URL + "/echo"
	late := delayedEcho(t, 2*time.Millisecond, bellEcho, 0)
	spun := func(st talaris.PoolStats) bool { return st.ReplySpins > 0 }
	never := func(st talaris.PoolStats) bool { return st.ReplySpins == 0 && st.ReplyLate == 0 }
	// The latch, in bounds no scheduling can break. Each echo comes at
	// least 2 ms (> ReplySpin, 300 us) after the send's stamp, which is
	// taken before its bytes go (direct_linux.go, cmdring_linux.go): no
	// answer is ever in time, and only one in time turns the spin back on
	// (noteAnswer). So the pump spins for the first send at most, whatever
	// the machine does: on a quiet one that spin ends empty (1 spin, 1
	// late); on a loaded one the pump may be descheduled inside it past
	// the answer (1 spin, 0 late: the late answer turns it off) or reach
	// the ring after the answer came (no spin: the same). Without the
	// latch, every one of the 50 sends would spin.
	latched := func(st talaris.PoolStats) bool { return st.ReplySpins <= 1 && st.ReplyLate <= st.ReplySpins }
	for _, tc := range []struct {
		name string
		cfg  talaris.Config
		url  string
		opts *talaris.DialOptions
		want func(talaris.PoolStats) bool
		what string
	}{
		{"default/ws", talaris.Config{}, fast, nil, spun, "ReplySpins > 0"},
		{"default/wss", talaris.Config{}, secure, tlsOpts, spun, "ReplySpins > 0"},
		{"nodirect/ws", talaris.Config{NoDirectSend: true}, fast, nil, spun, "ReplySpins > 0"},
		{"off/ws", talaris.Config{ReplySpin: -1}, fast, nil, never, "no reply spin"},
		{"block/ws", talaris.Config{LoopWait: talaris.WaitBlock, ConsumerWait: talaris.WaitBlock}, fast, nil, never, "no reply spin"},
		{"late/ws", talaris.Config{}, late, nil, latched, "at most the first of 50 sends spins"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, c := dialOpts(t, tc.cfg, tc.url, tc.opts)
			n := 300
			if tc.url == late {
				n = 50
			}
			if seen, err := pingPong(p, c, n); err != nil || seen != n {
				t.Fatalf("%d/%d echoes: %v", seen, n, err)
			}
			st := p.Stats()
			t.Logf("%d round trips: %d reply spins, %d ended empty, %d pump sleeps", n, st.ReplySpins, st.ReplyLate, st.PumpSleeps)
			if !tc.want(st) {
				t.Fatalf("want %s: ReplySpins %d, ReplyLate %d", tc.what, st.ReplySpins, st.ReplyLate)
			}
		})
	}
}

// TestReplySpinCloseRace closes the Pool (and, every other round, the
// connection first) from another goroutine while the pump and the loop
// spin for an answer that never comes (the peer stops reading after
// `after` echoes): the pump returns ErrPoolClosed or ErrClosed, Close
// returns, and sends and pumps afterwards fail cleanly.
func TestReplySpinCloseRace(t *testing.T) {
	for _, after := range []int{0, 5} {
		url := delayedEcho(t, 0, bellStopRead, after)
		for i := 0; i < 12; i++ {
			p, c := bellDial(t, talaris.Config{ReplySpin: 10 * time.Millisecond, CloseTimeout: 100 * time.Millisecond}, url)
			// 0..2.2 ms: inside the 10 ms spin, at its start or later.
			pingPongCloseRace(t, p, c, i, time.Duration(i)*200*time.Microsecond)
		}
	}
}

// TestReplySpinSilentPeerCPU: a pool whose sends are never answered does
// not spin on every send. 100 sends (through the loop) 3 ms apart to a peer that reads and
// never answers, with a goroutine waiting in PumpData, with a 2 ms
// ReplySpin and without one: the first send's spin ends empty and turns
// it off, so the two use about the same CPU; without that latch the loop
// would spin for every send. CPU time, not
// wall time, so a busy machine does not make it flaky. (Measured: 41 ms
// against 26 ms over 370 ms; with the latch taken out of loop.c, 92 ms
// against 22.)
func TestReplySpinSilentPeerCPU(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	run := func(spin time.Duration) (used, wall time.Duration, st talaris.PoolStats) {
		// Sends through the loop: each wakes it, so it reaches its reply
		// spin on every send (a direct send leaves a sleeping loop asleep).
		p, c := bellDial(t, talaris.Config{ReplySpin: spin, NoDirectSend: true}, srv.URL+"/collect")
		done := make(chan error, 1)
		go func() {
			for {
				if _, err := p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {}); err != nil {
					done <- err
					return
				}
			}
		}()
		msg := make([]byte, 64)
		const n = 100
		before := len(srv.Collected())
		c0, t0 := cpuTime(), time.Now()
		for i := 0; i < n; i++ {
			if err := c.SendBinary(msg); err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * time.Millisecond)
		}
		used, wall = cpuTime()-c0, time.Since(t0)
		waitFor(t, "the peer got every message", func() bool { return len(srv.Collected())-before == n }, func() string { return "" })
		p.Close()
		if err := <-done; !errors.Is(err, talaris.ErrPoolClosed) {
			t.Fatalf("pump: %v", err)
		}
		return used, wall, p.Stats()
	}
	offUsed, offWall, _ := run(-1)
	used, wall, st := run(2 * time.Millisecond)
	t.Logf("unanswered sends: %v CPU over %v with a 2 ms reply spin (pump: %d spins, %d ended empty), %v over %v without", used, wall, st.ReplySpins, st.ReplyLate, offUsed, offWall)
	if used > offUsed+wall/10 {
		t.Fatalf("%v CPU over %v of unanswered sends with the reply spin, %v without: the reply spin did not turn off", used, wall, offUsed)
	}
}
