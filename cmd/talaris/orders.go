//go:build linux

package main

// The send-side workloads: "orders" (an order round trip while the same
// client floods in on one connection and is stuck sending on another) and
// "idle" (what a client costs when nothing happens).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
)

const stuckMsg = 16 << 10 // message size sent to the peer that stopped reading

// ordersURLs are the three connections of the orders workload: O echoes
// (the order round trip measured), F floods 64 B frames, S's server
// stops reading after the upgrade (its socket fills; the client keeps
// trying to send to it).
func (b *bench) ordersURLs() (o, f, s string) {
	base := "ws://" + b.feed.WS
	stallMs := (b.warm + b.ordersDur + 10*time.Second).Milliseconds()
	return base + "/echo", base + "/flood?size=64", fmt.Sprintf("%s/stall?ms=%d", base, stallMs)
}

// talOrders measures O's round trip on one Pool that also carries F and
// S. The sender to S runs in its own goroutine: it sends stuckMsg
// messages until b.stallBytes were accepted, and on ErrWouldBlock (S's
// queue is full) waits 200us and tries again.
func (b *bench) talOrders(v talVariant) (res Result, rerr error) {
	oURL, fURL, sURL := b.ordersURLs()
	p, err := b.talPool(v, 0)
	if err != nil {
		return Result{}, err
	}
	// O and S first (quiet), F last: talDialAll pumps F's flood away.
	var cs []talaris.Conn
	dial := func(url string) (talaris.Conn, error) {
		c, err := talDialAll(p, url, nil, 1)
		cs = append(cs, c...)
		if err != nil {
			return talaris.Conn{}, err
		}
		return c[0], nil
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var fConn []talaris.Conn
	var sConn talaris.Conn
	defer func() {
		stop.Store(true)
		wg.Wait()
		// S's peer never reads: Pool.Close would wait CloseTimeout for its
		// close handshake. A client gives up on such a peer with Abort.
		sConn.Abort()
		if cerr := closePool(p, fConn, v.inline); cerr != nil {
			res.Note = cerr.Error()
		}
	}()
	o, err := dial(oURL)
	if err != nil {
		return Result{}, err
	}
	s, err := dial(sURL)
	if err != nil {
		return Result{}, err
	}
	sConn = s
	f, err := dial(fURL)
	if err != nil {
		return Result{}, err
	}
	fConn = []talaris.Conn{f}
	var sent, wouldBlock atomic.Int64
	var sendErr atomic.Value
	wg.Add(1)
	go func() {
		defer wg.Done()
		msg := make([]byte, stuckMsg)
		for !stop.Load() && sent.Load() < b.stallBytes {
			err := s.SendBinary(msg)
			switch {
			case err == nil:
				sent.Add(stuckMsg)
			case errors.Is(err, talaris.ErrWouldBlock):
				wouldBlock.Add(1)
				time.Sleep(200 * time.Microsecond)
			default:
				sendErr.Store(err)
				return
			}
		}
	}()
	h := newHist()
	var got bool
	var fFrames uint64
	fn := func(c talaris.Conn, _ talaris.Opcode, pl []byte) {
		if c == o {
			got = true
		} else if c == f {
			fFrames++
		}
	}
	start := time.Now()
	warmEnd := start.Add(b.warm)
	// The window measures orders beside a stuck S: it opens once S's
	// sender is done (b.stallBytes accepted, its queue full, or failed),
	// not only after the warm-up, which a loaded box can outlast (seen:
	// 0.3 of 1 MiB accepted when a 250 ms run ended). 10 s bounds it.
	sReady := func(now time.Time) bool {
		return sent.Load() >= b.stallBytes || wouldBlock.Load() > 0 || sendErr.Load() != nil ||
			now.Sub(warmEnd) > 10*time.Second
	}
	msg := make([]byte, 64)
	var c0, f0 float64
	var t0 time.Time
	var frames0 uint64
	var st0 testhook.PoolStats
	for i := uint64(0); ; i++ {
		now := time.Now()
		if !t0.IsZero() && now.Sub(t0) > b.ordersDur {
			break
		}
		if t0.IsZero() && now.After(warmEnd) && sReady(now) {
			t0, c0, frames0 = now, cpuSeconds(), fFrames
			f0 = float64(sent.Load())
			st0 = testhook.Stats(p)
		}
		binary.LittleEndian.PutUint64(msg, i)
		if err := o.SendBinary(msg); err != nil {
			return Result{}, fmt.Errorf("order send: %w", err)
		}
		for got = false; !got; {
			if _, err := talPump(p, v, fn); err != nil {
				return Result{}, err
			}
			if time.Since(now) > 5*time.Second {
				return Result{}, errors.New("no echo of an order within 5s")
			}
		}
		if !t0.IsZero() {
			h.RecordValue(max(int64(time.Since(now)), 1))
		}
	}
	r := Result{Frames: uint64(h.TotalCount()), Bytes: uint64(h.TotalCount()) * 64}
	if !t0.IsZero() {
		r.Secs, r.CPUSecs = time.Since(t0).Seconds(), cpuSeconds()-c0
		r.Note = fmt.Sprintf("flood %.2f M frames/s on F; S accepted %.1f MiB (%.1f MiB while measured), ErrWouldBlock %d times",
			float64(fFrames-frames0)/r.Secs/1e6, float64(sent.Load())/(1<<20), (float64(sent.Load())-f0)/(1<<20), wouldBlock.Load())
		// Per order: how often F was held at its share of the ring
		// (testhook.Knobs.MaxConnPendingEvents), and the wake-ups each side took.
		st, n := testhook.Stats(p), float64(max(h.TotalCount(), 1))
		r.Note += fmt.Sprintf("; per order: %.1f fair holds, %.1f loop wakes, %.1f pump sleeps",
			float64(st.FairHolds-st0.FairHolds)/n, float64(st.LoopWakes-st0.LoopWakes)/n, float64(st.PumpSleeps-st0.PumpSleeps)/n)
	}
	if e, ok := sendErr.Load().(error); ok {
		r.Note += "; send to S failed: " + e.Error()
	}
	histInto(&r, h)
	return r, nil
}

// peerOrders is the orders workload for a Go peer: the order round trip
// in this goroutine, F read by a goroutine, S written by a goroutine
// (whose write blocks once S's socket is full).
func (b *bench) peerOrders(gp goPeer) (Result, error) {
	oURL, fURL, sURL := b.ordersURLs()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var pcs []peerConn
	var wg sync.WaitGroup
	defer func() {
		for _, pc := range pcs {
			pc.close()
		}
		wg.Wait()
	}()
	dial := func(url string) (peerConn, error) {
		pc, err := gp.dial(ctx, url, nil, nil)
		if err == nil {
			pcs = append(pcs, pc)
		}
		return pc, err
	}
	o, err := dial(oURL)
	if err != nil {
		return Result{}, err
	}
	s, err := dial(sURL)
	if err != nil {
		return Result{}, err
	}
	f, err := dial(fURL)
	if err != nil {
		return Result{}, err
	}
	var fFrames, sent atomic.Int64
	wg.Add(2)
	go func() {
		defer wg.Done()
		f.run(func(bool, []byte) { fFrames.Add(1) })
	}()
	go func() {
		defer wg.Done()
		msg := make([]byte, stuckMsg)
		for sent.Load() < b.stallBytes {
			if s.write(msg) != nil {
				return
			}
			sent.Add(stuckMsg)
		}
	}()
	h := newHist()
	msg := make([]byte, 64)
	start := time.Now()
	var c0 float64
	var t0 time.Time
	var frames0 int64
	for i := uint64(0); ; i++ { // one clock read per round trip (peerLatencyRound says why)
		binary.LittleEndian.PutUint64(msg, i)
		t := time.Now()
		if err := o.write(msg); err != nil {
			return Result{}, err
		}
		if err := o.readOne(func(bool, []byte) {}); err != nil {
			return Result{}, err
		}
		now := time.Now()
		if now.Sub(start) > b.warm {
			if t0.IsZero() {
				t0, c0, frames0 = t, cpuSeconds(), fFrames.Load()
			}
			h.RecordValue(max(int64(now.Sub(t)), 1))
		}
		if now.Sub(start) >= b.warm+b.ordersDur {
			break
		}
	}
	r := Result{Frames: uint64(h.TotalCount()), Bytes: uint64(h.TotalCount()) * 64}
	if !t0.IsZero() {
		r.Secs, r.CPUSecs = time.Since(t0).Seconds(), cpuSeconds()-c0
		r.Note = fmt.Sprintf("flood %.2f M frames/s on F; S accepted %.1f MiB", float64(fFrames.Load()-frames0)/r.Secs/1e6, float64(sent.Load())/(1<<20))
	}
	histInto(&r, h)
	return r, nil
}

// talIdle measures the process's CPU time while a Pool holds one open,
// quiet connection and a goroutine waits in the variant's pump.
func (b *bench) talIdle(v talVariant) (Result, error) {
	p, err := b.talPool(v, 0)
	if err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.Dial(ctx, "ws://"+b.feed.WS+"/echo", nil); err != nil {
		p.Close()
		return Result{}, err
	}
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := talPump(p, v, func(talaris.Conn, talaris.Opcode, []byte) {}); err != nil {
				done <- err
				return
			}
		}
	}()
	r := measureIdle(b.warm, b.idleDur)
	p.Close()
	if err := <-done; !errors.Is(err, talaris.ErrPoolClosed) {
		return r, fmt.Errorf("pump: %v", err)
	}
	return r, nil
}

// peerIdle is talIdle for a Go peer: one quiet connection, one goroutine
// blocked reading it.
func (b *bench) peerIdle(gp goPeer) (Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := gp.dial(ctx, "ws://"+b.feed.WS+"/echo", nil, nil)
	if err != nil {
		return Result{}, err
	}
	done := make(chan struct{})
	go func() { pc.run(func(bool, []byte) {}); close(done) }()
	r := measureIdle(b.warm, b.idleDur)
	pc.close()
	<-done
	return r, nil
}

// measureIdle waits warm, then returns the process CPU time over d
// (getrusage: every thread, the runtime's included).
func measureIdle(warm, d time.Duration) Result {
	time.Sleep(warm)
	c0, t0 := cpuSeconds(), time.Now()
	time.Sleep(d)
	return Result{Secs: time.Since(t0).Seconds(), CPUSecs: cpuSeconds() - c0}
}
