package talaris

import (
	"bytes"
	"runtime"
	"time"
)

// The pump and Go's scheduler.
//
// A pump that keeps up with its feed sleeps on a futex (to the runtime, a
// blocking syscall) thousands of times a second, and its goroutine never
// parks: it leaves each syscall on the fast path, with its own P, and never
// passes through the scheduler. The P's scheduler tick then stays the same
// for as long as the pump runs, and the runtime's monitor thread (sysmon)
// takes it for a goroutine that has run for 10 ms without a break
// (forcePreemptNS): it preempts it or, found in the futex, takes its P
// away. Every such retake resets sysmon's own sleep to 20 us, from which it
// backs off again over about a thousand wake-ups (the pump sleeping on an
// idle Pool is retaken once per 100 ms sleep the same way). Measured at
// wss 256 B x1 (`talaris bench --workloads ingress --clients talaris
// --conns 1 --transports wss`): sysmon slept 2.5 thousand times a second
// and took about 5 % of a CPU, a tenth of the client's CPU per frame.
//
// So the pump passes through the scheduler (runtime.Gosched) at most once
// per pumpSchedEvery, where it is about to sleep anyway, while it sleeps
// and wakes often (its previous sleep began less than pumpSchedEvery ago):
// the tick then changes well within sysmon's 10 ms and sysmon keeps its
// long sleeps. A pump that sleeps long (an idle or slow feed) is left as it
// was: its P is retaken once per sleep and sysmon, with every P idle, sleeps
// deeply; passing there too kept sysmon from that deep sleep (idle Pool 2.4
// % of a CPU against 0.6 %). Gosched costs about half a microsecond on a
// goroutine that is free to move, but on one locked to its OS thread
// (runtime.LockOSThread, the way latency-minded users pin the pump to a
// core) it hands the thread's P to another thread and back, 40-50 us here:
// such a pump is left alone too. Whether it is locked is read from its
// stack trace's header, once per pass.

// pumpSchedEvery is the longest the pump goes without passing through the
// scheduler while it sleeps and wakes often: under sysmon's 10 ms, with
// room for a wake-up that comes late.
const pumpSchedEvery = 8 * time.Millisecond

// pumpSched is the pump's account of its passes through the scheduler.
// Owned by the goroutine that pumps (the pump claim serialises them).
type pumpSched struct {
	last int64    // nanotime of the previous beforeSleep
	next int64    // nanotime of the next pass
	buf  [64]byte // runtime.Stack's first line (no allocation)
}

// beforeSleep is called where the pump is about to sleep, at nanotime now.
// When a pass is due and the goroutine is not locked to its thread, it
// yields to the scheduler and reports true: the caller rechecks the rings
// before it sleeps.
func (s *pumpSched) beforeSleep(now int64) bool {
	often := now-s.last < int64(pumpSchedEvery)
	s.last = now
	if !often {
		s.next = now + int64(pumpSchedEvery) // the first pass once it is
		return false
	}
	if now < s.next {
		return false
	}
	s.next = now + int64(pumpSchedEvery)
	if lockedToThread(s.buf[:]) {
		return false
	}
	runtime.Gosched()
	return true
}

// lockedMark is what the header of a goroutine's stack trace says of one
// locked to its OS thread ("goroutine 7 [running, locked to thread]:").
var lockedMark = []byte(", locked to thread]")

// lockedToThread reports whether the calling goroutine is locked to its OS
// thread. buf receives the start of its stack trace (64 bytes hold the
// header); about 3 us. TestLockedToThread holds the runtime to the format.
func lockedToThread(buf []byte) bool {
	n := runtime.Stack(buf, false)
	line, _, _ := bytes.Cut(buf[:n], []byte{'\n'})
	return bytes.Contains(line, lockedMark)
}
