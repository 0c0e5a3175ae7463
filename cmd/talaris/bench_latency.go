//go:build linux

package main

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
)

func nowNano() int64 { return time.Now().UnixNano() }

// talLatency runs one latency or rtt measurement of the workload's whole
// duration (the tests' entry; the bench runs latRounds).
func (b *bench) talLatency(wl string, v talVariant, url string) (Result, error) {
	return oneRound(func(h *hdrhistogram.Histogram) (Result, error) {
		return b.talLatencyRound(wl, v, url, b.wlDur(wl), h, &testhook.PoolStats{})
	})
}

// oneRound runs round into a new histogram and adds its figures.
func oneRound(round func(h *hdrhistogram.Histogram) (Result, error)) (Result, error) {
	h := newHist()
	r, err := round(h)
	if err == nil {
		histInto(&r, h)
	}
	return r, err
}

// wlDur is the measured time of a latency or rtt run.
func (b *bench) wlDur(wl string) time.Duration {
	if wl == "rtt" {
		return b.rttDur
	}
	return b.latDur
}

// talLatencyRound measures wl for d after the warm-up on a new Pool,
// recording into h and adding the Pool's wait counters over the window to
// *st. The Result holds frames, seconds and CPU, not h's figures.
func (b *bench) talLatencyRound(wl string, v talVariant, url string, d time.Duration, h *hdrhistogram.Histogram,
	st *testhook.PoolStats) (Result, error) {
	p, err := b.talPool(v, 0)
	if err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.Dial(ctx, url, nil)
	if err != nil {
		p.Close()
		return Result{}, err
	}
	defer closePool(p, nil, v.inline) // paced and echo feeds never fill the ring
	recording := false
	got := false
	var frames uint64
	var c0 float64
	var t0rec time.Time
	var st0 testhook.PoolStats
	fn := func(_ talaris.Conn, _ talaris.Opcode, pl []byte) {
		got = true
		if recording && wl == "latency" && len(pl) >= 16 {
			h.RecordValue(max(nowNano()-int64(binary.LittleEndian.Uint64(pl[8:])), 1))
			frames++
		}
	}
	start := time.Now()
	warmEnd, end := start.Add(b.warm), start.Add(b.warm+d)
	msg := make([]byte, 64)
	for {
		now := time.Now()
		if !recording && now.After(warmEnd) {
			recording, c0, t0rec, st0 = true, cpuSeconds(), now, testhook.Stats(p)
		}
		// A stall under load (a descheduled VM, a busy box: seen at 300 ms)
		// can straddle the window, a round trip or one pump call for the
		// whole of it: the loop only looks at the clock between them, so
		// the window would close empty. It closes only once it holds a
		// frame (the paced feed's next one is due within 1/rate), or 10 s
		// after its end (a feed gone quiet: the row reports no frames).
		if now.After(end) && (frames > 0 || now.Sub(end) > 10*time.Second) {
			break
		}
		if wl == "latency" {
			if _, err := talPump(p, v, fn); err != nil {
				return Result{}, err
			}
			continue
		}
		binary.LittleEndian.PutUint64(msg, frames)
		t0 := time.Now()
		if err := c.SendBinary(msg); err != nil {
			return Result{}, err
		}
		for got = false; !got; {
			if _, err := talPump(p, v, fn); err != nil {
				return Result{}, err
			}
		}
		if recording {
			h.RecordValue(max(int64(time.Since(t0)), 1))
			frames++
		}
	}
	r := Result{Frames: frames, Bytes: frames * 64}
	if recording {
		r.Secs, r.CPUSecs = time.Since(t0rec).Seconds(), cpuSeconds()-c0
		addWaits(st, st0, testhook.Stats(p))
		r.Note = waitNote(testhook.PoolStats{}, *st, frames)
	}
	return r, nil
}

// peerLatency is talLatency for a Go peer.
func (b *bench) peerLatency(wl string, p goPeer, url string) (Result, error) {
	return oneRound(func(h *hdrhistogram.Histogram) (Result, error) { return b.peerLatencyRound(wl, p, url, b.wlDur(wl), h) })
}

// peerLatencyRound is talLatencyRound for a Go peer.
func (b *bench) peerLatencyRound(wl string, p goPeer, url string, d time.Duration, h *hdrhistogram.Histogram) (Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := p.dial(ctx, url, nil, nil)
	if err != nil {
		return Result{}, err
	}
	defer pc.close()
	var c0, c1 float64
	var t0, t1 time.Time
	n0 := h.TotalCount() // earlier rounds' samples
	if wl == "latency" {
		var rec atomic.Bool
		var n atomic.Int64
		done := make(chan struct{})
		go func() {
			defer close(done)
			pc.run(func(_ bool, pl []byte) {
				if len(pl) >= 16 && rec.Load() {
					h.RecordValue(max(nowNano()-int64(binary.LittleEndian.Uint64(pl[8:])), 1))
					n.Add(1)
				}
			})
		}()
		time.Sleep(b.warm)
		c0, t0 = cpuSeconds(), time.Now()
		rec.Store(true)
		time.Sleep(d)
		// A stall straddling the window would leave it empty (talLatency
		// says why): it closes once it holds a frame, or the feed ended.
	waitFrame:
		for wait := time.Now(); n.Load() == 0 && time.Since(wait) < 5*time.Second; {
			select {
			case <-done:
				break waitFrame
			case <-time.After(time.Millisecond):
			}
		}
		rec.Store(false)
		c1, t1 = cpuSeconds(), time.Now()
		pc.close()
		<-done
	} else {
		msg := make([]byte, 64)
		start := time.Now()
		// One clock read per round trip decides both whether it counts
		// and whether the window is over, so the round trip that ends the
		// window is always recorded (two reads could straddle the warm-up's
		// end: one said "still warming", the next "window over").
		for i := uint64(0); ; i++ {
			binary.LittleEndian.PutUint64(msg, i)
			t := time.Now()
			if err := pc.write(msg); err != nil {
				return Result{}, err
			}
			if err := pc.readOne(func(bool, []byte) {}); err != nil {
				return Result{}, err
			}
			now := time.Now()
			if now.Sub(start) > b.warm {
				if t0.IsZero() {
					c0, t0 = cpuSeconds(), t
				}
				h.RecordValue(max(int64(now.Sub(t)), 1))
			}
			if now.Sub(start) >= b.warm+d {
				break
			}
		}
		c1, t1 = cpuSeconds(), time.Now()
	}
	r := Result{Frames: uint64(h.TotalCount() - n0), Bytes: uint64(h.TotalCount()-n0) * 64}
	if !t0.IsZero() {
		r.Secs, r.CPUSecs = t1.Sub(t0).Seconds(), c1-c0
	}
	return r, nil
}

// addWaits adds the wait counters waitNote reads, from a to b, to *sum.
func addWaits(sum *testhook.PoolStats, a, b testhook.PoolStats) {
	sum.FairHolds += b.FairHolds - a.FairHolds
	sum.LoopWakes += b.LoopWakes - a.LoopWakes
	sum.PumpSleeps += b.PumpSleeps - a.PumpSleeps
	sum.Batches += b.Batches - a.Batches
	sum.CQEs += b.CQEs - a.CQEs
	sum.Rearms += b.Rearms - a.Rearms
	sum.MinWaits += b.MinWaits - a.MinWaits
}

// latRound is one in-process client of a latency or rtt workload: run
// measures it for d into h (a talaris client also adds its wait counters
// to *st).
type latRound struct {
	client string
	run    func(d time.Duration, h *hdrhistogram.Histogram, st *testhook.PoolStats) (Result, error)
}

// latRounds runs a latency or rtt workload's in-process clients in n
// rounds of d/n each, every client in turn (round-robin), the first time a
// result is asked for, and merges each client's rounds: one histogram, the
// frames, seconds and CPU summed. On a shared machine whose speed moves
// between phases of seconds (an echo round trip's p50 read 19 and 55 us
// for one client in runs a minute apart), a client measured in one piece
// is measured in one phase; interleaved, every client is measured over the
// same stretch of time (decodeRounds does the same for decode). A client
// whose round fails keeps that error and runs no more rounds.
type latRounds struct {
	rounds []latRound
	n      int
	d      time.Duration
	once   sync.Once
	res    map[string]Result
	err    map[string]error
}

func (l *latRounds) result(client string) (Result, error) {
	l.once.Do(func() {
		l.res = map[string]Result{}
		n := max(l.n, 1)
		hs := map[string]*hdrhistogram.Histogram{}
		sts := map[string]*testhook.PoolStats{}
		for _, r := range l.rounds {
			hs[r.client], sts[r.client] = newHist(), &testhook.PoolStats{}
		}
		l.err = roundRobin(n, len(l.rounds), func(i int) (string, error) {
			r := l.rounds[i]
			res, err := r.run(l.d/time.Duration(n), hs[r.client], sts[r.client])
			if err == nil {
				sum := l.res[r.client]
				sum.Frames += res.Frames
				sum.Bytes += res.Bytes
				sum.Secs += res.Secs
				sum.CPUSecs += res.CPUSecs
				sum.Note = res.Note // a talaris client's note covers its rounds so far
				l.res[r.client] = sum
			}
			return r.client, err
		})
		for c, r := range l.res {
			if l.err[c] == nil {
				histInto(&r, hs[c])
				l.res[c] = r
			}
		}
	})
	if err := l.err[client]; err != nil {
		return Result{}, err
	}
	return l.res[client], nil
}
