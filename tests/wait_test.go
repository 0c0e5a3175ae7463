//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
	"golang.org/x/sys/unix"
)

// The pump's reply doorbell (testhook.Knobs.ReplyDoorbell; docs/ARCHITECTURE.md,
// "Wait strategies"): after a direct send the pump sleeps in epoll on the
// socket and the loop's eventfd. These tests run a real gorilla server whose
// echo comes 1 ms late, so the pump has given up spinning and sleeps on the
// doorbell for every reply, and check that every reply still arrives in
// order, that Pool.Close and Conn.Close racing the ping-pong end it, and that
// a peer that stops reading or resets ends it cleanly. Timeouts are hang
// guards only.

// bellPeer is how the delayed echo server behaves after `after` echoes.
type bellPeer int

func TestReplyDoorbell(t *testing.T) {
	url := delayedEcho(t, time.Millisecond, bellEcho, 0)
	secure := wstest.NewGorilla().StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0)).URL + "/echo"
	for _, tc := range []struct {
		name     string
		cfg      talaris.Config
		url      string
		opts     *talaris.DialOptions
		wantBell bool
	}{
		{"bell/ws", testhook.WithKnobs(talaris.Config{}, testhook.Knobs{ReplyDoorbell: true}), url, nil, true},
		{"default/ws", talaris.Config{}, url, nil, false},
		{"bell-nodirect/ws", testhook.WithKnobs(talaris.Config{}, testhook.Knobs{ReplyDoorbell: true, NoDirectSend: true}), url, nil, false},
		{"bell-block/ws", testhook.WithKnobs(talaris.Config{Wait: talaris.WaitBlock}, testhook.Knobs{ReplyDoorbell: true}), url, nil, false},
		// wss sends go through the loop: no direct send, no doorbell.
		{"bell/wss", testhook.WithKnobs(talaris.Config{}, testhook.Knobs{ReplyDoorbell: true}), secure, tlsOpts, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, c := dialOpts(t, tc.cfg, tc.url, tc.opts)
			const n = 100
			if seen, err := pingPong(p, c, n); err != nil || seen != n {
				t.Fatalf("%d/%d echoes: %v", seen, n, err)
			}
			st := testhook.Stats(p)
			t.Logf("pump sleeps %d, on the doorbell %d, rung by the socket %d", st.PumpSleeps, st.BellSleeps, st.BellRings)
			if tc.wantBell && st.BellSleeps == 0 {
				t.Fatalf("the pump never slept on its doorbell (%d sleeps) over %d replies 1 ms apart", st.PumpSleeps, n)
			}
			if !tc.wantBell && (st.BellSleeps != 0 || st.BellRings != 0) {
				t.Fatalf("doorbell used: %+v", st)
			}
		})
	}
}

// TestReplyDoorbellCloseRace closes the Pool (and, every other round, the
// connection first) from another goroutine while the pump sleeps on its
// doorbell between delayed echoes: the pump returns ErrPoolClosed or
// ErrClosed, Close returns, and sends and pumps afterwards fail cleanly.
func TestReplyDoorbellCloseRace(t *testing.T) {
	url := delayedEcho(t, time.Millisecond, bellEcho, 0)
	for i := 0; i < 16; i++ {
		p := newTestPool(t, testhook.WithKnobs(talaris.Config{}, testhook.Knobs{ReplyDoorbell: true}), hangGuard)
		ctx, cancel := dialCtx(t)
		c, err := p.Dial(ctx, url, nil)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		pingPongCloseRace(t, p, c, i, time.Duration(i%8)*time.Millisecond+time.Duration(i)*137*time.Microsecond)
	}
}

// TestReplyDoorbellPeerEnds: the peer resets the connection, or stops
// reading and answering, while the pump sleeps on its doorbell for a reply.
// A reset ends the connection (the pump consumes its final event and, with
// no connection left, returns ErrNoConns); a silent peer leaves the
// pump asleep (not spinning: the doorbell is only a way to sleep) until
// Pool.Close, which wakes it with ErrPoolClosed.
func TestReplyDoorbellPeerEnds(t *testing.T) {
	t.Run("reset", func(t *testing.T) {
		url := delayedEcho(t, time.Millisecond, bellReset, 20)
		p, c := bellDial(t, testhook.WithKnobs(talaris.Config{}, testhook.Knobs{ReplyDoorbell: true}), url)
		seen, err := pingPong(p, c, 1<<30)
		// The answer to echo 20 meets the reset (ErrClosed) or goes out
		// before it; either way the pump then takes the final event.
		for errors.Is(err, talaris.ErrClosed) {
			_, err = p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {})
		}
		if seen != 20 || !errors.Is(err, talaris.ErrNoConns) {
			t.Fatalf("%d echoes before the reset (want 20), pump: %v (want ErrNoConns: the connection ended)", seen, err)
		}
		if st := c.State(); st != talaris.StateClosed {
			t.Fatalf("state %v after the reset", st)
		}
		if err := c.SendBinary([]byte("late")); err == nil {
			t.Fatal("send after the reset succeeded")
		}
	})
	t.Run("stop-reading", func(t *testing.T) {
		url := delayedEcho(t, time.Millisecond, bellStopRead, 20)
		before := loopTids(t)
		p, c := bellDial(t, testhook.WithKnobs(talaris.Config{CloseTimeout: 200 * time.Millisecond}, testhook.Knobs{ReplyDoorbell: true}), url) // the silent peer never answers our close
		// The threads under test: the pool's loop thread(s) and this
		// goroutine's, which pumps (locked to it so its CPU can be read).
		tids := newLoopTids(t, before)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tids[unix.Gettid()] = true
		go func() {
			defer p.Close()
			// Once the peer has sent its 20 echoes (it then reads nothing
			// more, so the pump waits for the 21st's), read the CPU the
			// pump's thread and the loop's use over 200 ms: a thread that
			// sleeps uses none, however loaded the machine. Hang guard:
			// the echoes come in milliseconds.
			for deadline := time.Now().Add(30 * time.Second); c.Stats().MsgsIn < 20; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Errorf("hang guard: 20 echoes not in after 30s (stats %+v)", c.Stats())
					return
				}
			}
			const window = 200 * time.Millisecond
			c0, err := tasksCPU(tids)
			s0 := testhook.Stats(p)
			time.Sleep(window)
			c1, err1 := tasksCPU(tids)
			s1 := testhook.Stats(p)
			if err != nil || err1 != nil {
				t.Errorf("thread CPU: %v, %v", err, err1)
				return
			}
			used := c1 - c0
			t.Logf("waiting for a silent peer: the pump's and the loop's threads used %v CPU in %v (%d pump sleeps, %d on the doorbell)",
				used, window, s1.PumpSleeps-s0.PumpSleeps, s1.BellSleeps-s0.BellSleeps)
			if used > window/2 {
				t.Errorf("the pump's and the loop's threads used %v CPU in %v waiting for a silent peer: something spins", used, window)
			}
		}()
		msg := make([]byte, 64)
		seen, err := pingPong(p, c, 1<<30)
		if seen != 20 || !errors.Is(err, talaris.ErrPoolClosed) {
			t.Fatalf("%d echoes (want 20), pump: %v (want ErrPoolClosed)", seen, err)
		}
		if err := c.SendBinary(msg); err == nil {
			t.Fatal("send after Close succeeded")
		}
	})
}

// TestReplyDoorbellAllocs: a round trip through the doorbell (a direct
// send, the pump asleep in epoll, woken by the socket or the eventfd)
// makes no cgo call and no allocation beyond the default's. The
// allocation count is the process's (testing.AllocsPerRun), so the peer
// is one that allocates nothing per message: a raw echo with fixed
// buffers, 1 ms late (a gorilla server's own allocations, counted with
// the client's, made two runs differ by what the peer did).
func TestReplyDoorbellAllocs(t *testing.T) {
	url := wstest.NewRaw(func(rc *wstest.RawConn) {
		var in [2 + 4 + 125]byte // a masked client frame of up to 125 bytes
		var out [2 + 125]byte
		for {
			if _, err := io.ReadFull(rc.Conn, in[:2]); err != nil {
				return
			}
			n := int(in[1] & 0x7f)
			if in[1]&0x80 == 0 || n > 125 {
				return // not a masked short frame: not this test's
			}
			if _, err := io.ReadFull(rc.Conn, in[2:6+n]); err != nil {
				return
			}
			out[0], out[1] = in[0], byte(n) // FIN and opcode kept: a close is answered in kind
			for i := range n {
				out[2+i] = in[6+i] ^ in[2+i%4]
			}
			if in[0]&0x0f != byte(ws.OpClose) {
				time.Sleep(time.Millisecond)
			}
			if _, err := rc.Conn.Write(out[:2+n]); err != nil || in[0]&0x0f == byte(ws.OpClose) {
				return
			}
		}
	}).Start(t).URL + "/"
	var base float64
	for _, bell := range []bool{false, true} {
		p, c := bellDial(t, testhook.WithKnobs(talaris.Config{}, testhook.Knobs{ReplyDoorbell: bell}), url)
		msg := make([]byte, 64)
		got := false
		fn := func(talaris.Conn, talaris.Opcode, []byte) { got = true }
		var fail error
		round := func() {
			if err := c.SendBinary(msg); err != nil {
				fail = err
				return
			}
			for got = false; !got && fail == nil; {
				_, fail = p.PumpData(fn)
			}
		}
		round() // the socket joins the doorbell, the frame buffer grows
		cgo0, sleeps0 := runtime.NumCgoCall(), testhook.Stats(p).BellSleeps
		allocs := testing.AllocsPerRun(50, round)
		cgo, sleeps := runtime.NumCgoCall()-cgo0, testhook.Stats(p).BellSleeps-sleeps0
		if fail != nil {
			t.Fatal(fail)
		}
		t.Logf("doorbell %v: %.2f allocations and %d cgo calls per round trip; %d doorbell sleeps in 51", bell, allocs, cgo, sleeps)
		if !bell {
			base = allocs
			continue
		}
		if allocs > base || cgo != 0 || sleeps == 0 {
			t.Fatalf("%.2f allocations (%.2f without the doorbell), %d cgo calls per round trip, %d doorbell sleeps: want no more, 0, > 0",
				allocs, base, cgo, sleeps)
		}
	}
}

// The reply spin (Config.Tuning.ReplySpin;
// docs/notes/2026-12-wait-strategies.md, "The reply spin"): after a send, the pump and the loop spin for the answer instead
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
	spun := func(st testhook.PoolStats) bool { return st.ReplySpins > 0 }
	never := func(st testhook.PoolStats) bool { return st.ReplySpins == 0 && st.ReplyLate == 0 }
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
	latched := func(st testhook.PoolStats) bool { return st.ReplySpins <= 1 && st.ReplyLate <= st.ReplySpins }
	for _, tc := range []struct {
		name string
		cfg  talaris.Config
		url  string
		opts *talaris.DialOptions
		want func(testhook.PoolStats) bool
		what string
	}{
		{"default/ws", talaris.Config{}, fast, nil, spun, "ReplySpins > 0"},
		{"default/wss", talaris.Config{}, secure, tlsOpts, spun, "ReplySpins > 0"},
		{"nodirect/ws", testhook.WithKnobs(talaris.Config{}, testhook.Knobs{NoDirectSend: true}), fast, nil, spun, "ReplySpins > 0"},
		{"off/ws", talaris.Config{Tuning: talaris.Tuning{ReplySpin: -1}}, fast, nil, never, "no reply spin"},
		{"block/ws", talaris.Config{Wait: talaris.WaitBlock}, fast, nil, never, "no reply spin"},
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
			st := testhook.Stats(p)
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
			p, c := bellDial(t, talaris.Config{CloseTimeout: 100 * time.Millisecond, Tuning: talaris.Tuning{ReplySpin: 10 * time.Millisecond}}, url)
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
// would spin for every send. The pump's spins are counted (at most the
// first send's: PoolStats.ReplySpins <= 1); the loop's are not, so the
// CPU time of the threads under test is compared - the loop thread(s)
// and the pump's, not the process's, whose in-process gorilla server,
// GC and sender made the figure the machine's load as much as the
// code's: the threads with the spin may use at most a tenth of the 100
// sends' full spins (20 ms) more than without it. (Measured over the
// whole process: 41 ms against 26 ms over 370 ms; with the latch taken
// out of loop/wait.c, 92 ms against 22.)
func TestReplySpinSilentPeerCPU(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	const n = 100
	run := func(spin time.Duration) (used, wall time.Duration, st testhook.PoolStats) {
		// Sends through the loop: each wakes it, so it reaches its reply
		// spin on every send (a direct send leaves a sleeping loop asleep).
		before := loopTids(t)
		p, c := bellDial(t, testhook.WithKnobs(talaris.Config{Tuning: talaris.Tuning{ReplySpin: spin}}, testhook.Knobs{NoDirectSend: true}), srv.URL+"/collect")
		tids := newLoopTids(t, before)
		done := make(chan error, 1)
		pumpTid := make(chan int, 1)
		go func() {
			runtime.LockOSThread() // this thread pumps: its CPU is read
			defer runtime.UnlockOSThread()
			pumpTid <- unix.Gettid()
			for {
				if _, err := p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {}); err != nil {
					done <- err
					return
				}
			}
		}()
		tids[<-pumpTid] = true
		msg := make([]byte, 64)
		collected := len(srv.Collected())
		c0, err := tasksCPU(tids)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		for i := 0; i < n; i++ {
			if err := c.SendBinary(msg); err != nil {
				t.Fatal(err)
			}
			time.Sleep(3 * time.Millisecond)
		}
		wall = time.Since(t0)
		waitFor(t, "the peer got every message", func() bool { return len(srv.Collected())-collected == n }, func() string { return "" })
		c1, err := tasksCPU(tids) // (after the last send's spin, if any, ran out)
		if err != nil {
			t.Fatal(err)
		}
		st = testhook.Stats(p)
		p.Close()
		if err := <-done; !errors.Is(err, talaris.ErrPoolClosed) {
			t.Fatalf("pump: %v", err)
		}
		return c1 - c0, wall, st
	}
	const spin = 2 * time.Millisecond
	offUsed, offWall, offSt := run(-1)
	used, wall, st := run(spin)
	t.Logf("unanswered sends: the loop's and the pump's threads used %v CPU over %v with a 2 ms reply spin (pump: %d spins, %d ended empty), %v over %v without (pump: %d spins)",
		used, wall, st.ReplySpins, st.ReplyLate, offUsed, offWall, offSt.ReplySpins)
	if offSt.ReplySpins != 0 || st.ReplySpins > 1 {
		t.Errorf("pump reply spins: %d with a 2 ms ReplySpin (want at most the first send's), %d without (want 0)", st.ReplySpins, offSt.ReplySpins)
	}
	if used > offUsed+n*spin/10 {
		t.Fatalf("the loop's and the pump's threads used %v CPU over %d unanswered sends with the reply spin, %v without: the reply spin did not turn off", used, n, offUsed)
	}
}

// TestRingFlagsAndWaits streams through pools built with each io_uring
// setup-flag set and each wait strategy: every configuration must deliver
// the whole stream intact. A flag set the kernel refuses must fail NewPool
// with ErrInvalidConfig (never later).
func TestRingFlagsAndWaits(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	cases := []struct {
		name string
		cfg  talaris.Config
	}{
		{"default", talaris.Config{}},
		{"no-flags", testhook.WithKnobs(talaris.Config{}, testhook.Knobs{RingFlags: testhook.RingFlagsNone})},
		{"coop-taskrun", testhook.WithKnobs(talaris.Config{}, testhook.Knobs{RingFlags: testhook.RingCoopTaskrun | testhook.RingTaskrunFlag})},
		{"single-issuer", testhook.WithKnobs(talaris.Config{}, testhook.Knobs{RingFlags: testhook.RingSingleIssuer})},
		{"sqpoll", testhook.WithKnobs(talaris.Config{}, testhook.Knobs{RingFlags: testhook.RingSQPoll, SQPollIdle: 2 * time.Millisecond})},
		{"sqpoll-aff", testhook.WithKnobs(talaris.Config{}, testhook.Knobs{RingFlags: testhook.RingSQPoll | testhook.RingSQAff, SQPollCPU: 0})},
		{"wait-block", talaris.Config{Wait: talaris.WaitBlock}},
		{"wait-spin", talaris.Config{Wait: talaris.WaitSpin}},
		{"wait-spin-then-block", talaris.Config{Wait: talaris.WaitSpinThenBlock, SpinTime: 20 * time.Microsecond}},
		{"wait-adaptive", talaris.Config{Wait: talaris.WaitAdaptive}},
		{"pinned-loop", talaris.Config{LoopCPUs: []int{0}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := talaris.NewPool(tc.cfg)
			if err != nil {
				if errors.Is(err, talaris.ErrInvalidConfig) {
					t.Skipf("kernel refused this setup: %v", err)
				}
				t.Fatal(err)
			}
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const n = 20000
			c, err := p.Dial(ctx, srv.URL+"/stream?n=20000&size=40", nil)
			if err != nil {
				t.Fatal(err)
			}
			chk := wstest.NewChecker(40)
			var final *talaris.Event
			for final == nil {
				if _, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
					switch ev.Kind {
					case talaris.EventBinary:
						if err := chk.Check(ev.Payload); err != nil {
							t.Fatal(err)
						}
					case talaris.EventClose, talaris.EventError:
						e := ev
						final = &e
					}
				}); err != nil {
					t.Fatal(err)
				}
			}
			if chk.Count() != n || final.Kind != talaris.EventClose || final.Code != 1000 {
				t.Fatalf("%d/%d messages, final %v %d %v", chk.Count(), n, final.Kind, final.Code, final.Err)
			}
			_ = c
		})
	}
}

// Wait strategies: an order answered from inside a pump callback
// must reach the server under every strategy, the adaptive one included
// (its loop spins for exactly that command), over ws and wss; Close racing
// that ping-pong ends it; and the default strategy does not spin when the
// pool is idle. Timeouts here are hang guards only.

// waitConfigs are the strategies the echo tests run under.
var waitConfigs = []struct {
	name string
	cfg  talaris.Config
}{
	{"default", talaris.Config{}},
	// The default with the reply doorbell (the pump sleeps in epoll on the socket after a direct send).
	{"bell", testhook.WithKnobs(talaris.Config{}, testhook.Knobs{ReplyDoorbell: true})},
	// The default without the reply spin, and with one long enough to
	// stay on for the whole test (Config.Tuning.ReplySpin).
	{"noreplyspin", talaris.Config{Tuning: talaris.Tuning{ReplySpin: -1}}},
	{"replyspin-10ms", talaris.Config{Tuning: talaris.Tuning{ReplySpin: 10 * time.Millisecond}}},
	// The default with the loop's minimum-wait batching on (Config.Tuning.MinWait:
	// a ping-pong never takes it, TestMinWaitNotTakenAtLowRates).
	{"minwait", talaris.Config{Tuning: talaris.Tuning{MinWait: 50 * time.Microsecond}}},
	{"adaptive", talaris.Config{Wait: talaris.WaitAdaptive}},
	// A long SpinTime keeps both adaptive spins on for the whole test.
	{"adaptive-1ms", talaris.Config{Wait: talaris.WaitAdaptive, SpinTime: time.Millisecond}},
	// Replies never come in time: the spins switch off and stay off.
	{"adaptive-1us", talaris.Config{Wait: talaris.WaitAdaptive, SpinTime: time.Microsecond}},
	{"adaptive-loop-only", testhook.WithKnobs(talaris.Config{}, testhook.Knobs{LoopWait: int(talaris.WaitAdaptive) + 1, ConsumerWait: int(talaris.WaitBlock) + 1})},
	{"block", talaris.Config{Wait: talaris.WaitBlock}},
	{"spin-then-block", talaris.Config{Wait: talaris.WaitSpinThenBlock}},
}

func TestWaitEchoFromCallback(t *testing.T) {
	plain := wstest.NewGorilla().Start(t)
	secure := wstest.NewGorilla().StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
	for _, wc := range waitConfigs {
		for _, tr := range []struct {
			name string
			url  string
			opts *talaris.DialOptions
		}{{"ws", plain.URL, nil}, {"wss", secure.URL, tlsOpts}} {
			t.Run(wc.name+"/"+tr.name, func(t *testing.T) {
				p, err := talaris.NewPool(wc.cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
				guard := time.AfterFunc(60*time.Second, func() { p.Close() })
				defer guard.Stop()
				ctx, cancel := context.WithTimeout(context.Background(), tlsDialTimeout)
				defer cancel()
				c, err := p.Dial(ctx, tr.url+"/echo", tr.opts)
				if err != nil {
					t.Fatal(err)
				}
				const n = 2000
				if seen, err := pingPong(p, c, n); err != nil || seen != n {
					t.Fatalf("%d/%d echoes: %v", seen, n, err)
				}
			})
		}
	}
}

// TestWaitCloseRace closes the Pool (and the connection) from other
// goroutines while the adaptive loop and pump are mid ping-pong: the pump
// returns ErrPoolClosed (or the connection's end), Close returns, and a
// send afterwards fails cleanly.
func TestWaitCloseRace(t *testing.T) {
	plain := wstest.NewGorilla().Start(t)
	secure := wstest.NewGorilla().StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
	for _, tr := range []struct {
		name string
		url  string
		opts *talaris.DialOptions
	}{{"ws", plain.URL, nil}, {"wss", secure.URL, tlsOpts}} {
		t.Run(tr.name, func(t *testing.T) {
			for i := 0; i < 20; i++ {
				p, err := talaris.NewPool(talaris.Config{Wait: talaris.WaitAdaptive})
				if err != nil {
					t.Fatal(err)
				}
				guard := time.AfterFunc(60*time.Second, func() { p.Close() })
				ctx, cancel := context.WithTimeout(context.Background(), tlsDialTimeout)
				c, err := p.Dial(ctx, tr.url+"/echo", tr.opts)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
				pingPongCloseRace(t, p, c, i, time.Duration(i%10)*time.Millisecond)
				guard.Stop()
			}
		})
	}
}

// TestDefaultWaitIdleCPU: after a burst of round trips (which turns the
// adaptive spins on), an idle default Pool with one open connection and a
// goroutine waiting in PumpData uses well under 10 % of one CPU over 2 s
// (a spinning side would use 100 %), and the pump sleeps. The CPU time is
// that of the threads under test - the loop thread and the pump's (locked
// to its goroutine) - not the process's (the in-process gorilla server,
// the GC): a thread that sleeps uses none however loaded the machine is.
func TestDefaultWaitIdleCPU(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	before := loopTids(t)
	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	tids := newLoopTids(t, before)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.Dial(ctx, srv.URL+"/echo", nil)
	if err != nil {
		t.Fatal(err)
	}
	if seen, err := pingPong(p, c, 500); err != nil || seen != 500 {
		t.Fatalf("%d/500 echoes: %v", seen, err)
	}
	done := make(chan error, 1)
	pumpTid := make(chan int, 1)
	got := 0
	go func() {
		runtime.LockOSThread() // this thread pumps: its CPU is read
		defer runtime.UnlockOSThread()
		pumpTid <- unix.Gettid()
		for {
			if _, err := p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) { got++ }); err != nil {
				done <- err
				return
			}
		}
	}()
	tids[<-pumpTid] = true
	time.Sleep(100 * time.Millisecond) // let the last spin run out
	c0, err := tasksCPU(tids)
	if err != nil {
		t.Fatal(err)
	}
	s0 := testhook.Stats(p).PumpSleeps
	const idle = 2 * time.Second
	time.Sleep(idle)
	c1, err := tasksCPU(tids)
	if err != nil {
		t.Fatal(err)
	}
	used, sleeps := c1-c0, testhook.Stats(p).PumpSleeps-s0
	p.Close()
	if err := <-done; !errors.Is(err, talaris.ErrPoolClosed) {
		t.Fatalf("pump: %v", err)
	}
	if got != 0 {
		t.Fatalf("%d messages on a quiet connection", got)
	}
	t.Logf("idle: the loop's and the pump's threads used %v CPU in %v (%.2f %%), %d pump sleeps", used, idle, 100*used.Seconds()/idle.Seconds(), sleeps)
	if used > idle/10 {
		t.Fatalf("idle default pool: its loop's and pump's threads used %v of CPU in %v: something spins", used, idle)
	}
	if sleeps == 0 {
		t.Fatal("the pump never slept while idle")
	}
}
