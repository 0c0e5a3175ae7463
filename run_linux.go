//go:build linux && cgo

package talaris

// Pool.Run and Pool.RunData: a pump a service runs on a goroutine of its
// own until its context ends or the Pool closes. It holds the pump claim
// for its whole life and passes the events as the blocking pumps do
// (pumpWait, or the inline loop's pumpInline); where they would return
// ErrNoConns it sleeps instead. Its wake-ups, none polled:
//
//   - a connection dialed later: every dial publishes at least one event
//     (EventOpen, or the final EventError, or a failed synchronous Dial's
//     quiet events), and the loop's publish wakes a pump asleep on its
//     ring (cons_sleeping, wake_seq); so with no connection the pump
//     sleeps on the same futex words, only without the 100 ms cap;
//   - Close: it sets closed, then bumps every wake word (and the
//     doorbell), as for any sleeping pump;
//   - the context: context.AfterFunc sets runState.stop, then bumps the
//     wake words the same way (Dekker with the pump's recheck in sleep,
//     as for closed), writes the doorbell, and for an inline loop its
//     eventfd, which ends the loop's wait in the kernel.

/*
#include "csrc/talaris.h"
*/
import "C"

import (
	"context"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// runState is one Run call's: stop is set (then the pump woken) once its
// context ended. A nil *runState is a Pump* call's: never stopped.
type runState struct {
	stop atomic.Bool
}

// stopped reports whether Run's context has ended (false for nil).
func (r *runState) stopped() bool { return r != nil && r.stop.Load() }

// run is Run (fd nil) and RunData (fe nil).
func (p *Pool) run(ctx context.Context, fe EventFunc, fd DataFunc) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := p.enterPump(); err != nil {
		if err == ErrPoolClosed {
			return nil
		}
		return err // ErrConcurrentPump
	}
	defer p.leavePump()
	if p.closed.Load() {
		return nil
	}
	inline := p.cfg.Tuning.InlineLoop
	if inline && C.tl_loop_inline_owner(p.shards[0].loop) == 0 {
		return ErrNotLoopThread
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r := &runState{}
	woke := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		r.stop.Store(true)
		p.wakeRun()
		close(woke)
	})
	// The wake touches the loops' memory, which the claim keeps alive
	// (release frees it only once nobody pumps): it must be done before
	// leavePump gives the claim back (defers run in reverse).
	defer func() {
		if !stop() {
			<-woke
		}
	}()
	for {
		var err error
		if inline {
			// One iteration at a time (a wait in it ends at the
			// eventfd's write, else within TL_INLINE_CAP_NS): the
			// blocking mode would go back to its wait after the
			// context's wake-up.
			_, err = p.pumpInline(fe, fd, nil, C.TL_INLINE_ONCE, 1)
		} else {
			_, err = p.pumpWait(fe, fd, nil, r)
		}
		if p.rec != nil {
			p.rec.flush() // as leavePump after each Pump call
		}
		switch {
		case err == ErrPoolClosed:
			return nil
		case err != nil:
			return err
		case r.stopped():
			return ctx.Err()
		}
	}
}

// wakeRun wakes a Run asleep in any of its waits once its context ended
// (runState.stop is set): the wake words, as Close bumps them; the
// doorbell; an inline loop's eventfd. The caller (the context's
// AfterFunc) runs while Run holds the claim, so the loop is not freed.
func (p *Pool) wakeRun() {
	for _, sh := range p.shards {
		atomic.AddUint32(sh.wakeSeq, 1)
		futexWake(sh.wakeSeq)
	}
	if p.bellEfd >= 0 {
		unix.Write(p.bellEfd, one[:])
	}
	if p.cfg.Tuning.InlineLoop {
		p.shards[0].wakeLoop()
	}
}

// futexWaitIdle is futexWait without a timeout: Run's sleep on a pool
// with no connection, ended only by a wake-up (sleep).
func futexWaitIdle(addr *uint32, val uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(futexWaitPrivate),
		uintptr(val), 0, 0, 0)
}

// futexWaitAnyIdle is futexWaitAny without a timeout (a NULL timeout:
// futex_waitv(2) then ignores the clock).
func futexWaitAnyIdle(w []futexWaitv) {
	unix.Syscall6(unix.SYS_FUTEX_WAITV, uintptr(unsafe.Pointer(&w[0])), uintptr(len(w)), 0,
		0, uintptr(unix.CLOCK_MONOTONIC), 0)
}
