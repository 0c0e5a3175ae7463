//go:build linux && cgo

package talaris

// The Pool's pumps: the claim on the ring, the blocking pump with its
// spin, doorbell and futex sleeps, the non-blocking pump and the inline
// pump that runs the loop on the caller's thread.

/*
#include <errno.h>
#include "csrc/talaris.h"
#include "csrc/crypto/gcm.h"
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The states of the pump claim (pool.pumping): who may consume the event
// rings. One word, so that a pump call, a failed Dial's reaper and the
// release at Close exclude each other with one compare-and-swap.
const (
	pumpFree    = 0 // nobody consumes
	pumpCalling = 1 // a Pump* call runs
	pumpFreed   = 2 // Close released the loop: nobody ever consumes again
	pumpReaping = 3 // reapQuiet passes a failed Dial's quiet events
)

// pumpWait is the pumper's state between passes: how it last waited, its
// scheduler pacing and the reply spin.
type pumpWait struct {
	// lastWait is how long the pump's previous wait for events lasted
	// (WaitAdaptive spins only while it is short); owned by the pumper.
	lastWait time.Duration
	// sched paces the pump's passes through Go's scheduler (pumpsched.go);
	// owned by the pumper.
	sched pumpSched

	// The reply spin (Config.Tuning.ReplySpin; pump_linux.go, replySpinUntil):
	// replySpin is ReplySpin in ns when either side waits adaptively (0:
	// sends are not stamped). lastSend is the nanotime of the latest
	// accepted send (any goroutine); answered is the lastSend the pump
	// last delivered events after, replyLate that a pump's reply spin
	// ended empty since an answer last came in time (both the pumper's).
	replySpin  int64
	pumpReply  bool // replySpin != 0 and the pump waits adaptively: it takes the spin
	stampSends bool // noteSend on every accepted send: replySpin != 0 or Config.Tuning.MinWait on
	lastSend   atomic.Int64
	answered   int64
	replyLate  bool
	replySpins atomic.Uint64 // testhook.PoolStats.ReplySpins
	replyLates atomic.Uint64 // testhook.PoolStats.ReplyLate
}

// dispatch consumes the shard's events up to tail and wakes its loop if
// it waits for the room just released.
func (sh *shard) dispatch(tail uint64, fe EventFunc, fd DataFunc, fs StampedFunc) int {
	n := sh.ev.consume(tail, fe, fd, fs)
	sh.wakeForSpace()
	return n
}

// dispatchAll passes over the loops once, in order, dispatching each one's
// pending events (each batch released by its own head store). With several
// loops it takes at most passShare events of each per pass: a connection
// alone on its loop is never held there (conn_held: counting is per loop),
// so its flood may fill that loop's whole ring, and without the cap a
// message on another loop would wait behind all of it. With the cap it
// waits behind at most one share (testhook.Knobs.MaxConnPendingEvents) of each
// other loop, as it would behind a flood on its own loop. It returns the
// callbacks made and whether any loop had events. It stops early once a
// callback closed the pool: the other loops' events are dropped with their
// connections.
func (p *Pool) dispatchAll(fe EventFunc, fd DataFunc, fs StampedFunc) (int, bool) {
	n, saw := 0, false
	for _, sh := range p.shards {
		if tail := sh.ev.loadTail(); tail != sh.ev.pos {
			saw = true
			if len(p.shards) > 1 && tail-sh.ev.pos > p.passShare {
				tail = sh.ev.pos + p.passShare
			}
			n += sh.dispatch(tail, fe, fd, fs)
			if p.closed.Load() {
				break
			}
		}
	}
	return n, saw
}

// idle reports whether no loop has events pending.
func (p *Pool) idle() bool {
	for _, sh := range p.shards {
		if sh.ev.loadTail() != sh.ev.pos {
			return false
		}
	}
	return true
}

// wakeForSpace wakes the loop when it sleeps waiting for the room just
// released (loop_wants_space: a stalled or held connection).
func (sh *shard) wakeForSpace() {
	if atomic.LoadUint32(sh.wantsSpace) != 0 && atomic.CompareAndSwapUint32(sh.wantsSpace, 1, 0) {
		sh.wakeLoop()
	}
}

// enterPump claims the pool for one pumping goroutine.
func (p *Pool) enterPump() error {
	if p.drained == nil {
		return ErrPoolClosed // a zero Pool, not made by NewPool
	}
	for !p.pumping.CompareAndSwap(pumpFree, pumpCalling) {
		switch p.pumping.Load() {
		case pumpFree:
			continue // released meanwhile
		case pumpReaping:
			// A failed Dial passing its quiet events: microseconds. No new
			// reaper starts meanwhile (reapQuiet leaves the events to this
			// pump call), so failing Dials in a loop cannot starve it.
			p.pumpWaiting.Store(true)
			osYield()
			continue
		case pumpFreed:
			return ErrPoolClosed
		}
		p.pumpWaiting.Store(false)
		if p.closed.Load() {
			return ErrPoolClosed
		}
		return ErrConcurrentPump
	}
	p.pumpWaiting.Store(false)
	return nil
}

// leavePump publishes the samples the pump call recorded (so Metrics is
// exact whenever no pump call runs), gives the claim back and, after
// Close, frees the loop.
func (p *Pool) leavePump() {
	if p.rec != nil {
		p.rec.flush()
	}
	p.pumping.Store(pumpFree)
	if p.closed.Load() {
		p.release()
	}
}

// closedErr is ErrPoolClosed once Close ran (a callback may have called
// it: the pump returns what it delivered and this error), else nil.
func (p *Pool) closedErr() error {
	if p.closed.Load() {
		return ErrPoolClosed
	}
	return nil
}

// pumpBlocking dispatches at least one callback-worthy batch, sleeping
// when the ring is empty. How long it spins first is ConsumerWait's:
// never (WaitBlock), always (WaitSpin), SpinTime (WaitSpinThenBlock), or
// SpinTime only while the previous wait ended within SpinTime
// (WaitAdaptive: spinning pays only while events come close together).
func (p *Pool) pumpBlocking(fe EventFunc, fd DataFunc, fs StampedFunc) (int, error) {
	if err := p.enterPump(); err != nil {
		return 0, err
	}
	defer p.leavePump()
	if p.cfg.Tuning.InlineLoop {
		return p.pumpInline(fe, fd, fs, C.TL_INLINE_BLOCK, -1)
	}
	return p.pumpWait(fe, fd, fs, nil)
}

// pumpWait is pumpBlocking on loop threads, for a caller that holds the
// claim. run is a Pool.Run's state (nil for the Pump* calls): with it, no
// connection left is no end (the pump sleeps, without a timeout, until a
// loop publishes the first event of a new one, Close, or run's context
// ends), and when the context has ended it returns 0, nil (run_linux.go).
func (p *Pool) pumpWait(fe EventFunc, fd DataFunc, fs StampedFunc, run *runState) (int, error) {
	var spinFor time.Duration
	switch p.cfg.consumerWait {
	case WaitSpinThenBlock:
		spinFor = p.cfg.SpinTime
	case WaitAdaptive:
		if p.lastWait <= p.cfg.SpinTime {
			spinFor = p.cfg.SpinTime
		}
	}
	var replyUntil int64 // nanotime the reply spin ends (0: none)
	if p.pumpReply {
		replyUntil = p.replySpinUntil()
	}
	var start time.Time // when the ring was first found empty
	var spinFrom time.Time
	for {
		idle := false // Run on a pool with no connection: sleep, no spin, no timeout
		for i := 0; ; i++ {
			if p.closed.Load() {
				return 0, ErrPoolClosed
			}
			if run.stopped() {
				return 0, nil
			}
			var sent int64 // the send these events may answer (not one a callback makes)
			if p.pumpReply {
				sent = p.lastSend.Load()
			}
			if n, saw := p.dispatchAll(fe, fd, fs); saw {
				if n > 0 {
					p.lastWait = 0 // events were waiting: traffic is dense
					if !start.IsZero() {
						p.lastWait = time.Since(start)
					}
					if sent != p.answered {
						p.noteAnswer(sent)
					}
					return n, p.closedErr()
				}
				i = 0
				continue
			}
			if p.nconns.Load() == 0 { // the end rule (see Pool.Pump)
				// Nothing pending and no connection left to deliver
				// anything: the last final event was just consumed (it
				// woke us), or there never was one.
				if run == nil {
					return 0, ErrNoConns
				}
				// Run waits for a connection instead: its first event
				// (every dial publishes one) wakes the sleep below.
				if start.IsZero() {
					start = time.Now()
				}
				idle = true
				break
			}
			if p.cfg.consumerWait == WaitSpin {
				if i&255 == 255 {
					runtime.Gosched()
				}
				continue
			}
			if i&63 == 0 {
				if start.IsZero() {
					start = time.Now()
					spinFrom = start
					if replyUntil != 0 {
						p.replySpins.Add(1)
					}
				}
				if time.Since(spinFrom) >= spinFor {
					if replyUntil == 0 || nanotime() >= replyUntil {
						if replyUntil != 0 {
							p.replyLate = true // the answer did not come in time
							p.replyLates.Add(1)
							replyUntil = 0
						}
						break
					}
				}
				if i != 0 && p.cfg.consumerWait == WaitAdaptive {
					// Let the loop thread run if it waits for this CPU
					// (a busy machine): it is what we spin for.
					osYield()
				}
			}
		}
		// Sleep: announce, recheck, then wait on the futex word. Samples
		// go out first: Metrics must not wait for the next message.
		if p.rec != nil {
			p.rec.flush()
		}
		spinFor = 0 // after a sleep, look once per wake-up
		// Pass through Go's scheduler now and then (pumpsched.go): a
		// goroutine that only ever sleeps in syscalls keeps sysmon awake.
		now := nanotime()
		if p.sched.beforeSleep(now) {
			continue // the rings, once more, before the sleep
		}
		if !idle && p.bellEp >= 0 && now-p.lastDirect.Load() < int64(bellWindow) {
			if p.sleepBell(run) {
				// A socket rang: its data woke us while it wakes the
				// loop, which will publish it shortly; spin for that
				// (yielding: the loop may be woken on this very CPU)
				// rather than sleep into a second wake-up.
				spinFor, spinFrom = bellSpinTimes*p.cfg.SpinTime, time.Now()
			}
			continue
		}
		p.sleep(run, idle)
	}
}

// replySpinUntil is when the pump's reply spin (Config.Tuning.ReplySpin) ends:
// ReplySpin after the latest send while that send is unanswered and
// answers have been coming in time; 0 when there is nothing to spin for.
// Spinning then spares the answer a wake-up of the pump (on a machine
// whose idle CPUs halt, tens of microseconds); it yields as it goes, and
// the loop spins for the answer's completion the same way (loop/wait.c,
// reply_spin).
func (p *Pool) replySpinUntil() int64 {
	ls := p.lastSend.Load()
	if ls == 0 || ls == p.answered || p.replyLate {
		return 0
	}
	return ls + p.replySpin
}

// noteAnswer runs when the pump delivers events after a send it has not
// yet seen answered (sent, loaded before the callbacks ran, so a send they
// make waits for its own answer): an answer within ReplySpin of its send
// turns the reply spin (back) on, a later one leaves it off.
func (p *Pool) noteAnswer(sent int64) {
	p.answered = sent
	p.replyLate = nanotime()-sent > p.replySpin
}

// sleepBell is sleep on the doorbell (testhook.Knobs.ReplyDoorbell), taken for
// a while after a direct send, when a reply is likely: the pump waits in
// epoll on the sockets it sent on and on bellEfd, which every loop writes
// instead of the futex while cons_sleeping is 2. The reply's data then
// wakes this thread and the loop thread at once, instead of the loop's
// publish waking it after the loop has run: on a machine whose idle CPUs
// halt, the two wake-ups overlap rather than add up. Dekker per loop as in
// sleep (cons_sleeping 2, then the tail). It reports whether a socket
// (not the eventfd) woke it. A stale edge (data the loop already
// published while we were awake) only makes one spurious round. A Run
// whose context ends writes bellEfd too (run: see sleep).
func (p *Pool) sleepBell(run *runState) bool {
	for _, sh := range p.shards {
		atomic.StoreUint32(sh.consSleeping, 2)
	}
	rang := false
	if p.idle() && !p.closed.Load() && !run.stopped() {
		atomic.AddUint64((*uint64)(unsafe.Pointer(&p.shards[0].cstats.pump_sleeps)), 1)
		n, _ := unix.EpollWait(p.bellEp, p.bellEvents[:], 100)
		p.bellSleeps.Add(1)
		for i := 0; i < n; i++ {
			if int(p.bellEvents[i].Fd) != p.bellEfd {
				rang = true
			}
		}
		if rang {
			p.bellRings.Add(1)
		}
	}
	for _, sh := range p.shards {
		atomic.StoreUint32(sh.consSleeping, 0)
	}
	return rang
}

// sleep waits until a loop publishes events (or Close, a Run's context, or
// 100 ms): it announces on every loop's ring (cons_sleeping), rechecks
// them all, then waits on their wake words at once, each loop's wake
// bumping its own (one futex with one loop; futex_waitv over all with
// several, so nothing in the C loop changes). Dekker per loop: our store of cons_sleeping,
// then the load of its tail; its store of the tail, then the load of
// cons_sleeping. Close and the end of a Run's context (run) bump every
// wake word after they set what the recheck reads (closed, run's stop),
// so neither is missed either. With idle (a Run on a pool with no
// connection) there is no 100 ms cap: nothing but those wakes can
// change what the pump would see.
func (p *Pool) sleep(run *runState, idle bool) {
	if len(p.shards) == 1 {
		sh := p.shards[0]
		seq := atomic.LoadUint32(sh.wakeSeq)
		atomic.StoreUint32(sh.consSleeping, 1)
		if sh.ev.loadTail() == sh.ev.pos && !p.closed.Load() && !run.stopped() {
			atomic.AddUint64((*uint64)(unsafe.Pointer(&sh.cstats.pump_sleeps)), 1)
			if idle {
				futexWaitIdle(sh.wakeSeq, seq)
			} else {
				futexWait(sh.wakeSeq, seq, 100*time.Millisecond)
			}
		}
		atomic.StoreUint32(sh.consSleeping, 0)
		return
	}
	for i, sh := range p.shards {
		p.waitv[i].val = uint64(atomic.LoadUint32(sh.wakeSeq))
		atomic.StoreUint32(sh.consSleeping, 1)
	}
	if p.idle() && !p.closed.Load() && !run.stopped() {
		atomic.AddUint64((*uint64)(unsafe.Pointer(&p.shards[0].cstats.pump_sleeps)), 1)
		if idle {
			futexWaitAnyIdle(p.waitv)
		} else {
			futexWaitAny(p.waitv, 100*time.Millisecond)
		}
	}
	for _, sh := range p.shards {
		atomic.StoreUint32(sh.consSleeping, 0)
	}
}

// pumpOnce polls the ring once and dispatches the batch it finds (the
// non-blocking pumps).
func (p *Pool) pumpOnce(fd DataFunc, fe EventFunc) (int, error) {
	if err := p.enterPump(); err != nil {
		return 0, err
	}
	defer p.leavePump()
	if p.cfg.Tuning.InlineLoop {
		return p.pumpInline(fe, fd, nil, C.TL_INLINE_NOWAIT, 1)
	}
	if n, saw := p.dispatchAll(fe, fd, nil); saw {
		return n, p.closedErr()
	}
	if p.closed.Load() {
		return 0, ErrPoolClosed
	}
	return 0, nil
}

// pumpInline is the pumps of an inline loop (Config.Tuning.InlineLoop): it
// dispatches what the loop published and, when nothing is pending, runs
// the loop itself on this goroutine's thread - one cgo call, which returns
// once it published events (mode TL_INLINE_BLOCK: after waiting in the
// kernel as long as there is nothing to do) or after one iteration
// (TL_INLINE_NOWAIT, at most iters times; iters < 0: no limit). The
// events themselves are dispatched as with a loop thread: no cgo call per
// message, one per batch. The caller holds the pump claim.
func (p *Pool) pumpInline(fe EventFunc, fd DataFunc, fs StampedFunc, mode C.int, iters int) (int, error) {
	loop := p.shards[0].loop
	for i := 0; iters < 0 || i <= iters; i++ {
		if p.closed.Load() {
			return 0, ErrPoolClosed
		}
		if n, saw := p.dispatchAll(fe, fd, fs); saw {
			if n > 0 || mode == C.TL_INLINE_NOWAIT {
				return n, p.closedErr()
			}
			continue
		}
		if mode == C.TL_INLINE_BLOCK && p.nconns.Load() == 0 { // the end rule (see Pool.Pump)
			if C.tl_loop_inline_owner(loop) == 0 {
				return 0, ErrNotLoopThread // (the cold path: the drive below says it otherwise)
			}
			return 0, ErrNoConns
		}
		if i == iters {
			break
		}
		if mode == C.TL_INLINE_BLOCK && p.rec != nil {
			p.rec.flush() // Metrics must not wait for the next message
		}
		switch rc := C.tl_loop_inline_run(loop, mode); {
		case rc == -C.EPERM:
			return 0, ErrNotLoopThread
		case rc < 0 || rc == C.TL_INLINE_STOPPED:
			// Stopped: Close ran (from another goroutine, which marked
			// the loop dead, or a stop request this call finished).
			// What it published is dropped with the pool.
			if p.closed.Load() {
				return 0, ErrPoolClosed
			}
			return 0, ErrNotLoopThread
		}
	}
	return 0, nil
}

// pumpStamped is PumpStamped.
func (p *Pool) pumpStamped(fs StampedFunc) (int, error) { return p.pumpBlocking(nil, nil, fs) }

// pinInline pins the calling thread, which runs an inline loop, to the
// loop's CPU (LoopCPUs[0]), as a loop
// thread pins itself: the loop and the pump are this one thread. The
// mask it had is kept for unpinInline.
func (p *Pool) pinInline(d settings) error {
	if len(d.LoopCPUs) == 0 || d.LoopCPUs[0] < 0 {
		return nil
	}
	cpu := d.LoopCPUs[0]
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return fmt.Errorf("%w: pin the inline loop's thread to CPU %d: %w", ErrInvalidConfig, cpu, err)
	}
	set.Set(cpu) // (ignored past the set's end)
	if set.Count() != 1 {
		return fmt.Errorf("%w: pin the inline loop's thread to CPU %d: no such CPU", ErrInvalidConfig, cpu)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("%w: pin the inline loop's thread to CPU %d: %w", ErrInvalidConfig, cpu, err)
	}
	p.inlineAff = &old
	return nil
}

// unpinInline gives the calling thread (the inline loop's) the mask it
// had before pinInline, before the thread goes back to the scheduler.
func (p *Pool) unpinInline() {
	if p.inlineAff != nil {
		unix.SchedSetaffinity(0, p.inlineAff) // best effort: the mask was this thread's
		p.inlineAff = nil
	}
}

// runInline runs one iteration of an inline loop (Config.Tuning.InlineLoop) in
// mode (TL_INLINE_NOWAIT or TL_INLINE_ONCE) when the caller is the loop's
// goroutine: one that waits for the loop - a Dial for its connection, a
// send for room - must run it itself (a call from a pump callback too:
// the callback is outside the pump's cgo call), since no other thread
// can. It reports whether it ran one: false on another goroutine (that
// one waits for the loop's goroutine as with a loop thread) or once the
// loop stopped. A wait in it is bounded (TL_INLINE_CAP_NS), so the
// caller looks at its context and Close again.
func (p *Pool) runInline(mode C.int) bool {
	rc := C.tl_loop_inline_run(p.shards[0].loop, mode)
	return rc >= 0 && rc != C.TL_INLINE_STOPPED
}
