//go:build linux && cgo

package talaris

// Sleeping and waking across the rings without cgo: plain syscalls on a
// futex word (the pump sleeps, the loop wakes it), on the loop's eventfd
// (the loop sleeps, Go wakes it) and on the reply doorbell's epoll.
// docs/ARCHITECTURE.md, "Rings and wake-ups", has the protocol.

import (
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// doorbell is the pump's reply doorbell (testhook.Knobs.ReplyDoorbell).
type doorbell struct {
	// The pump's doorbell (testhook.Knobs.ReplyDoorbell; pump_linux.go,
	// sleepBell): bellEp is an epoll instance holding bellEfd (the
	// eventfd every loop writes instead of the futex while the pump
	// sleeps there) and each socket a direct send wrote to (added once
	// per socket by the sender, edge-triggered); -1 when off.
	// lastDirect is the nanotime of the latest direct send; bellEvents
	// is epoll_wait's buffer (the pumper's).
	bellEp, bellEfd int
	lastDirect      atomic.Int64
	bellSleeps      atomic.Uint64 // testhook.PoolStats.BellSleeps
	bellRings       atomic.Uint64 // testhook.PoolStats.BellRings
	bellEvents      [8]unix.EpollEvent
}

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

// openBell creates the pump's doorbell (testhook.Knobs.ReplyDoorbell): an
// epoll instance with an eventfd in it, edge-triggered (never read: each
// write of a loop is an edge), whose number every loop's ring carries
// (cons_efd) for the wake-ups it gives while the pump sleeps there.
func (p *Pool) openBell() error {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("talaris: epoll_create1: %w", err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(ep)
		return fmt.Errorf("talaris: eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(efd)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, efd, &ev); err != nil {
		unix.Close(efd)
		unix.Close(ep)
		return fmt.Errorf("talaris: epoll_ctl: %w", err)
	}
	p.bellEp, p.bellEfd = ep, efd
	for _, sh := range p.shards {
		atomic.StoreInt32(sh.consEfd, int32(efd))
	}
	return nil
}

// closeBell closes the doorbell once the loops are gone (release).
func (p *Pool) closeBell() {
	if p.bellEp >= 0 { // (the numbers stay: nothing reads them once the loops are freed)
		unix.Close(p.bellEp)
		unix.Close(p.bellEfd)
	}
}
