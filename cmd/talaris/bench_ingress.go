//go:build linux

package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
)

func (b *bench) talPool(v talVariant, sampleEvery uint32) (*talaris.Pool, error) {
	cfg := talaris.Config{SpinTime: v.spinTime, SampleEvery: sampleEvery, Loops: v.loops, BufSize: v.bufSize, BufCount: v.bufCount,
		Tuning: talaris.Tuning{NoTLSRecordLayer: v.noTLSRec, NoOwnGCM: v.libGCM, ReplySpin: v.replySpin,
			InlineLoop: v.inline, MinWait: v.minWait}}
	testhook.SetKnobs(&cfg, &testhook.Knobs{LoopWait: int(v.loop) + 1, ConsumerWait: int(v.cons) + 1, RingFlags: v.ringFlags,
		EventRingSize: v.evRing, MaxConnPendingEvents: v.connEvents, ReplyDoorbell: v.bell, NoRecvBundle: v.noBundle,
		MinWaitCompletions: v.minWaitN, NoDirectSend: v.noDirect})
	if b.loopCPU >= 0 {
		cfg.LoopCPUs = []int{b.loopCPU}
	}
	return talaris.NewPool(cfg)
}

func talPump(p *talaris.Pool, v talVariant, fn talaris.DataFunc) (int, error) {
	if v.spin { // a busy-polling pump: PumpDataNowait in a loop, never sleeping
		for range 1024 {
			if n, err := p.PumpDataNowait(fn); n > 0 || err != nil {
				return n, err
			}
		}
		return 0, nil
	}
	return p.PumpData(fn)
}

func (b *bench) talIngress(v talVariant, url string, conns int, opts *talaris.DialOptions, sampleEvery uint32) (res Result, rerr error) {
	p, err := b.talPool(v, sampleEvery)
	if err != nil {
		return Result{}, err
	}
	cs, err := talDialAll(p, url, opts, conns)
	defer func() {
		if cerr := closePool(p, cs, v.inline); cerr != nil {
			res.Note = cerr.Error()
		}
	}()
	if err != nil {
		return Result{}, err
	}
	var frames, nbytes uint64
	fn := func(_ talaris.Conn, _ talaris.Opcode, pl []byte) { frames++; nbytes += uint64(len(pl)) }
	// The pump goroutine is not locked to its OS thread, as a user's would
	// not be (and a locked one is left to sysmon: pumpsched.go). It stays
	// on one thread but for a rare move, so the pump thread is the busiest
	// thread other than the loop's (threadSplit's pumpTid 0).
	const pumpTid = 0
	warmEnd := time.Now().Add(b.warm)
	end := warmEnd.Add(b.dur)
	var f0, b0 uint64
	var c0 float64
	var t0 time.Time
	var st0 testhook.PoolStats
	var th0 []taskCPU
	var s0 float64
	for {
		if _, err := talPump(p, v, fn); err != nil {
			return Result{}, err
		}
		now := time.Now()
		if t0.IsZero() {
			if now.After(warmEnd) {
				th0 = tasksCPU()
				s0 = b.feed.cpu()
				f0, b0, c0, t0 = frames, nbytes, cpuSeconds(), now
				st0 = testhook.Stats(p)
			}
		} else if now.After(end) {
			r := Result{Frames: frames - f0, Bytes: nbytes - b0, Secs: now.Sub(t0).Seconds(), CPUSecs: cpuSeconds() - c0,
				ServerCPUSecs: serverDelta(s0, b.feed.cpu()),
				Note:          strings.TrimPrefix(stageNote(p)+"; "+waitNote(st0, testhook.Stats(p), frames-f0), "; ")}
			threadSplit(&r, tasksDelta(th0, tasksCPU()), pumpTid, false)
			return r, nil
		}
	}
}

// waitNote says, per thousand messages, how often the loop held a
// connection at its share of the ring, was woken, and the pump slept, and
// how many batches, completions, recv re-arms and batched loop waits
// (Config.Tuning.MinWait) they took.
func waitNote(a, b testhook.PoolStats, msgs uint64) string {
	k := float64(max(msgs, 1)) / 1000
	return fmt.Sprintf("per 1000 messages: %.2f fair holds, %.2f loop wakes, %.2f pump sleeps, %.2f batches, %.2f completions, %.2f re-arms, %.2f min-waits",
		float64(b.FairHolds-a.FairHolds)/k, float64(b.LoopWakes-a.LoopWakes)/k, float64(b.PumpSleeps-a.PumpSleeps)/k,
		float64(b.Batches-a.Batches)/k, float64(b.CQEs-a.CQEs)/k, float64(b.Rearms-a.Rearms)/k,
		float64(b.MinWaits-a.MinWaits)/k)
}

// talDialAll dials n connections at once with DialAsync and pumps until
// all are open. (A blocking Dial while an open connection floods the pool
// and nobody pumps cannot finish: EventOpen needs room in the full ring.)
func talDialAll(p *talaris.Pool, url string, opts *talaris.DialOptions, n int) ([]talaris.Conn, error) {
	var cs []talaris.Conn
	for range n {
		c, err := p.DialAsync(url, opts)
		if err != nil {
			return cs, err
		}
		cs = append(cs, c)
	}
	open := 0
	var failed error
	deadline := time.Now().Add(20 * time.Second)
	for open < n && failed == nil {
		k, err := p.PumpNowait(func(_ talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventOpen:
				open++
			case talaris.EventError:
				failed = ev.Err
			}
		})
		if err != nil {
			return cs, err
		}
		if time.Now().After(deadline) {
			return cs, fmt.Errorf("%d of %d connections open after 20s", open, n)
		}
		if k == 0 {
			time.Sleep(20 * time.Microsecond)
		}
	}
	return cs, failed
}

// closePool ends a pool that may still be receiving a flood. Pool.Close
// deadlocks when the loop holds final events that no longer fit in a full
// event ring (a core bug, see the report), so every connection is closed
// first while the ring keeps being drained, and Close itself is bounded.
// An inline pool (Config.Tuning.InlineLoop) is closed on this goroutine, the one
// that made it: its Close runs the close handshakes here (bounded by
// CloseTimeout) and unlocks the goroutine from its OS thread; from another
// goroutine this one would stay locked, and every later row's wake-ups of
// it would pass through a thread hand-off (measured: the Go clients' round
// trips after an inline row 1.5-2x slower).
func closePool(p *talaris.Pool, cs []talaris.Conn, inline bool) error {
	// Ask the feed to stop flooding and drain until every connection has
	// answered "stopped" (the last frame of its flood).
	for _, c := range cs {
		c.SendText([]byte("stop"))
	}
	stopped := 0
	deadline := time.Now().Add(5 * time.Second)
	for stopped < len(cs) && time.Now().Before(deadline) {
		n, err := p.PumpNowait(func(_ talaris.Conn, ev talaris.Event) {
			if ev.Kind == talaris.EventText && string(ev.Payload) == "stopped" {
				stopped++
			}
		})
		if err != nil {
			break
		}
		if n == 0 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	if inline {
		return p.Close()
	}
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
		return nil
	case <-time.After(15 * time.Second): // Close may wait CloseTimeout (5 s) for close handshakes
		leakedPools.Add(1)
		return fmt.Errorf("Pool.Close hung (core bug; %d connections left, loop thread leaked and spinning: later results are disturbed)", p.ConnCount())
	}
}

// leakedPools counts pools whose Close never returned.
var leakedPools atomic.Int32

type counter struct {
	n, b atomic.Uint64
	// mu makes a peer's (n, b) pair one snapshot: stored apart, a
	// snapshot could see frames from one moment and bytes from another.
	mu sync.Mutex
	_  [40]byte
}

func (b *bench) peerTLS(tlsOn bool) *tls.Config {
	if !tlsOn {
		return nil
	}
	return b.goTLS.Clone()
}

func (b *bench) peerIngress(p goPeer, url string, conns int, tlsOn bool) (Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pcs := make([]peerConn, 0, conns)
	defer func() {
		for _, pc := range pcs {
			pc.close()
		}
	}()
	for range conns {
		pc, err := p.dial(ctx, url, b.peerTLS(tlsOn), nil)
		if err != nil {
			return Result{}, err
		}
		pcs = append(pcs, pc)
	}
	ctrs := make([]counter, conns)
	var wg sync.WaitGroup
	for i, pc := range pcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &ctrs[i]
			var n, nb uint64
			pc.run(func(_ bool, pl []byte) {
				n++
				nb += uint64(len(pl))
				if n&63 == 0 {
					c.mu.Lock()
					c.n.Store(n)
					c.b.Store(nb)
					c.mu.Unlock()
				}
			})
		}()
	}
	snap := func() (uint64, uint64) {
		var n, nb uint64
		for i := range ctrs {
			ctrs[i].mu.Lock()
			n += ctrs[i].n.Load()
			nb += ctrs[i].b.Load()
			ctrs[i].mu.Unlock()
		}
		return n, nb
	}
	time.Sleep(b.warm)
	f0, b0 := snap()
	c0, s0, t0 := cpuSeconds(), b.feed.cpu(), time.Now()
	time.Sleep(b.dur)
	f1, b1 := snap()
	r := Result{Frames: f1 - f0, Bytes: b1 - b0, Secs: time.Since(t0).Seconds(), CPUSecs: cpuSeconds() - c0, ServerCPUSecs: serverDelta(s0, b.feed.cpu())}
	for _, pc := range pcs {
		pc.close()
	}
	pcs = nil
	wg.Wait()
	return r, nil
}
