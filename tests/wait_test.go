//go:build linux && cgo

package talaris_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
)

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
	{"bell", talaris.Config{ReplyDoorbell: true}},
	// The default without the reply spin, and with one long enough to
	// stay on for the whole test (Config.ReplySpin).
	{"noreplyspin", talaris.Config{ReplySpin: -1}},
	{"replyspin-10ms", talaris.Config{ReplySpin: 10 * time.Millisecond}},
	// The default with the loop's minimum-wait batching on (Config.MinWait:
	// a ping-pong never takes it, TestMinWaitNotTakenAtLowRates).
	{"minwait", talaris.Config{MinWait: 50 * time.Microsecond}},
	{"adaptive", talaris.Config{LoopWait: talaris.WaitAdaptive, ConsumerWait: talaris.WaitAdaptive}},
	// A long SpinTime keeps both adaptive spins on for the whole test.
	{"adaptive-1ms", talaris.Config{LoopWait: talaris.WaitAdaptive, ConsumerWait: talaris.WaitAdaptive, SpinTime: time.Millisecond}},
	// Replies never come in time: the spins switch off and stay off.
	{"adaptive-1us", talaris.Config{LoopWait: talaris.WaitAdaptive, ConsumerWait: talaris.WaitAdaptive, SpinTime: time.Microsecond}},
	{"adaptive-loop-only", talaris.Config{LoopWait: talaris.WaitAdaptive, ConsumerWait: talaris.WaitBlock}},
	{"block", talaris.Config{LoopWait: talaris.WaitBlock, ConsumerWait: talaris.WaitBlock}},
	{"spin-then-block", talaris.Config{LoopWait: talaris.WaitSpinThenBlock, ConsumerWait: talaris.WaitSpinThenBlock}},
}

// pingPong sends message 0 to an echo server and answers every echo with
// the next message from inside the PumpData callback, until n echoes came
// back in order. It returns the echoes seen and the pump's error.
func pingPong(p *talaris.Pool, c talaris.Conn, n int) (int, error) {
	msg := make([]byte, 64)
	seen := 0
	var bad error
	if err := c.SendBinary(msg); err != nil {
		return 0, err
	}
	for seen < n && bad == nil {
		_, err := p.PumpData(func(cc talaris.Conn, op talaris.Opcode, pl []byte) {
			if cc != c || op != talaris.OpBinary || len(pl) != 64 || binary.LittleEndian.Uint64(pl) != uint64(seen) {
				bad = fmt.Errorf("echo %d: conn %v op %v len %d seq %d", seen, cc == c, op, len(pl), binary.LittleEndian.Uint64(pl))
				return
			}
			seen++
			if seen < n {
				binary.LittleEndian.PutUint64(msg, uint64(seen))
				if err := c.SendBinary(msg); err != nil {
					bad = err
				}
			}
		})
		if err != nil {
			return seen, err
		}
	}
	return seen, bad
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
				p, err := talaris.NewPool(talaris.Config{LoopWait: talaris.WaitAdaptive, ConsumerWait: talaris.WaitAdaptive})
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

// pingPongCloseRace ping-pongs on c until another goroutine, after delay,
// closes the Pool (on odd rounds the connection first): the pump must
// return ErrPoolClosed or ErrClosed, and a send and a pump afterwards fail.
func pingPongCloseRace(t *testing.T, p *talaris.Pool, c talaris.Conn, i int, delay time.Duration) {
	t.Helper()
	closed := make(chan struct{})
	go func() {
		time.Sleep(delay)
		if i%2 == 1 {
			c.Close(talaris.CloseNormal, "race")
		}
		p.Close()
		close(closed)
	}()
	_, err := pingPong(p, c, 1<<30)
	if !errors.Is(err, talaris.ErrPoolClosed) && !errors.Is(err, talaris.ErrClosed) {
		t.Fatalf("round %d: ping-pong ended with %v, want ErrPoolClosed or ErrClosed", i, err)
	}
	<-closed
	if err := c.SendBinary([]byte("late")); err == nil {
		t.Fatalf("round %d: send after Close succeeded", i)
	}
	if _, err := p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) {}); !errors.Is(err, talaris.ErrPoolClosed) {
		t.Fatalf("round %d: pump after Close: %v", i, err)
	}
}

// TestDefaultWaitIdleCPU: after a burst of round trips (which turns the
// adaptive spins on), an idle default Pool with one open connection and a
// goroutine waiting in PumpData uses well under 10 % of one CPU over 2 s
// (a spinning side would use 100 %). CPU time, not wall time, so a busy
// machine does not make it flaky.
func TestDefaultWaitIdleCPU(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
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
	got := 0
	go func() {
		for {
			if _, err := p.PumpData(func(talaris.Conn, talaris.Opcode, []byte) { got++ }); err != nil {
				done <- err
				return
			}
		}
	}()
	time.Sleep(100 * time.Millisecond) // let the last spin run out
	c0, s0 := cpuTime(), p.Stats().PumpSleeps
	const idle = 2 * time.Second
	time.Sleep(idle)
	used, sleeps := cpuTime()-c0, p.Stats().PumpSleeps-s0
	p.Close()
	if err := <-done; !errors.Is(err, talaris.ErrPoolClosed) {
		t.Fatalf("pump: %v", err)
	}
	if got != 0 {
		t.Fatalf("%d messages on a quiet connection", got)
	}
	t.Logf("idle: %v CPU in %v (%.2f %%), %d pump sleeps", used, idle, 100*used.Seconds()/idle.Seconds(), sleeps)
	if used > idle/10 {
		t.Fatalf("idle default pool used %v of CPU in %v: something spins", used, idle)
	}
	if sleeps == 0 {
		t.Fatal("the pump never slept while idle")
	}
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
