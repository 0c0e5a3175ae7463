package talaris

import (
	"bytes"
	"runtime"
	"time"
)

// The pump and Go's scheduler.
//
// A pump that keeps up with its feed sleeps on a futex (to the runtime, a
// blocking syscall) thousands of times a second and leaves each sleep on
// the syscall fast path with its own P, never passing through the
// scheduler. Its P's scheduler tick then never changes, so the runtime's
// monitor thread (sysmon) takes it for a goroutine that has run 10 ms
// without a break (forcePreemptNS) and preempts it or takes its P; each
// such retake resets sysmon's own sleep to its shortest, so sysmon keeps
// waking and costs CPU.
//
// So while the pump sleeps and wakes often (its previous sleep began less
// than pumpSchedEvery ago) it passes through the scheduler
// (runtime.Gosched) at most once per pumpSchedEvery, where it is about to
// sleep anyway: the tick changes well within sysmon's 10 ms. It does not
// pass when it sleeps long (an idle or slow feed: there a pass would keep
// sysmon from the deep sleep it takes when every P is idle), nor when its
// goroutine is locked to its OS thread (runtime.LockOSThread), where
// Gosched hands the thread's P to another thread and back; whether it is
// locked is read from its stack trace's header, once per pass. The
// measurements: docs/notes/2026-12-tls-receive-path.md, "wss x1 after recv
// bundles".

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
