//go:build linux && cgo

package talaris

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Sleeping and waking across the rings without cgo: plain syscalls on a
// futex word (the pump sleeps, the loop wakes it) and on the loop's
// eventfd (the loop sleeps, Go wakes it). docs/ARCHITECTURE.md, "Rings
// and wake-ups", has the protocol.

// linux/futex.h: FUTEX_WAIT=0, FUTEX_WAKE=1, FUTEX_PRIVATE_FLAG=128.
const (
	futexWaitPrivate = 0 | 128
	futexWakePrivate = 1 | 128
)

// futexWait sleeps while *addr == val, at most d.
func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(futexWaitPrivate),
		uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every waiter on addr.
func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(futexWakePrivate),
		1<<30, 0, 0, 0)
}

var one = [8]byte{1, 0, 0, 0, 0, 0, 0, 0}

// wakeLoop writes the loop's eventfd.
func (p *Pool) wakeLoop() {
	unix.Write(p.efd, one[:])
}

// osYield gives this thread's CPU to another runnable thread, if any
// (sched_yield).
func osYield() {
	unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
}
