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

// futexWaitv is struct futex_waitv (linux/futex.h), one word of a
// futex_waitv(2) wait (Linux 5.16; the io_uring features the loop needs
// came later).
type futexWaitv struct {
	val      uint64
	uaddr    uint64
	flags    uint32
	reserved uint32
}

// FUTEX2_SIZE_U32 and FUTEX2_PRIVATE (linux/futex.h).
const (
	futex2Size32  = 0x02
	futex2Private = 128
)

// futexWaitAny sleeps while every word of w still holds its val, at most
// d (spurious returns are fine: the caller rechecks).
func futexWaitAny(w []futexWaitv, d time.Duration) {
	// The timeout is absolute on CLOCK_MONOTONIC, nanotime's clock.
	ts := unix.NsecToTimespec(nanotime() + int64(d))
	unix.Syscall6(unix.SYS_FUTEX_WAITV, uintptr(unsafe.Pointer(&w[0])), uintptr(len(w)), 0,
		uintptr(unsafe.Pointer(&ts)), uintptr(unix.CLOCK_MONOTONIC), 0)
}

var one = [8]byte{1, 0, 0, 0, 0, 0, 0, 0}

// wakeLoop writes the loop's eventfd.
func (sh *shard) wakeLoop() {
	unix.Write(sh.efd, one[:])
}

// osYield gives this thread's CPU to another runnable thread, if any
// (sched_yield).
func osYield() {
	unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
}
