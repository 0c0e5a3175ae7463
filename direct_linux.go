//go:build linux && cgo

package talaris

// Direct sends (docs/ARCHITECTURE.md, "Direct sends"): a text or binary
// message for an open ws:// connection whose loop has nothing to write is
// framed, masked and written by the sending goroutine itself, one send(2)
// on the non-blocking socket, so an order needs no eventfd write and no
// loop wake-up. Who may write the socket is one word per connection,
// tl_conn_pub.tx_own (csrc/ring.h): the loop offers it (FREE) when its
// output is done, a sender takes it (GO) with a CAS, and hands it back
// (FREE, or LOOP and a wake-up when the loop asked for it meanwhile). What
// the socket does not take goes to the loop as TL_CMD_DIRECT (HANDOFF),
// which writes it before anything else of that connection. Nothing here
// touches the receive path.

/*
#include "csrc/talaris.h"
*/
import "C"

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/talaris-go/talaris/ws"
)

// tx_own bits (TL_OWN_* in csrc/ring.h).
const (
	ownLoop       = uint32(C.TL_OWN_LOOP)
	ownFree       = uint32(C.TL_OWN_FREE)
	ownGo         = uint32(C.TL_OWN_GO)
	ownHandoff    = uint32(C.TL_OWN_HANDOFF)
	ownState      = uint32(C.TL_OWN_STATE)
	ownWant       = uint32(C.TL_OWN_WANT)
	ownEpochShift = C.TL_OWN_EPOCH_SHIFT

	wsMaxHdr = 14 // FIN/opcode, length (up to 9 bytes), mask key
)

// directSlot is one slot's direct-send state. buf is used only by the
// goroutine holding the slot's socket (tx_own GO or HANDOFF), so mu is
// never contended: the socket may come back through the loop (C atomics,
// which the race detector does not see), and mu states the exclusion in
// Go's terms. The counters are reset with the slot.
type directSlot struct {
	mu                     sync.Mutex
	buf                    []byte
	sends, handoffs, bytes atomic.Uint64
	wire                   atomic.Uint64
	// bellKey is the socket in the pump's doorbell (tx_fd | epoch<<32 |
	// 1<<63; 0: none yet), so each socket is added once.
	bellKey atomic.Uint64
	_       [16]byte // keep neighbours' counters apart
}

func (c Conn) ownWord() *uint32 {
	return (*uint32)(unsafe.Pointer(&c.p.pub[c.slot].tx_own))
}

// takeDirect takes c's socket for a direct send of n payload bytes when
// that may go out at once: direct sends on, a small message, c open and
// sendable, nothing of c's queued (so nothing sent earlier can be
// overtaken) and the loop not writing. It returns the tx_own value held.
// Called with sendMu held (txAcc is stable).
func (c Conn) takeDirect(n int) (uint32, bool) {
	p := c.p
	if n > p.maxDirect || p.closed.Load() || !c.sendable() || c.inGap() || c.queued(p.txAcc[c.slot].Load()) != 0 {
		return 0, false
	}
	w := c.ownWord()
	v := atomic.LoadUint32(w)
	if v&ownState != ownFree {
		return 0, false // the loop writes (or it is TLS, or not open)
	}
	nv := v&^(ownState|ownWant) | ownGo
	if !atomic.CompareAndSwapUint32(w, v, nv) {
		return 0, false
	}
	// The loop closes the socket only after taking it back, which it cannot
	// while we hold it, so the slot cannot be reused under us: this only
	// confirms that the FREE we took is this handle's.
	if atomic.LoadUint32((*uint32)(unsafe.Pointer(&p.pub[c.slot].gen))) != c.gen {
		p.releaseDirect(c.slot)
		return 0, false
	}
	return nv, true
}

// sendDirect frames b and writes it to c's socket from this goroutine;
// the rest of a short or refused write goes to the loop (handoff). c's
// socket is held (takeDirect); the caller is inside p.enter and does not
// hold sendMu.
func (c Conn) sendDirect(op Opcode, b []byte, held uint32) error {
	p := c.p
	d := &p.direct[c.slot]
	d.mu.Lock()
	defer d.mu.Unlock()
	need := len(b) + wsMaxHdr
	if cap(d.buf) < need {
		d.buf = make([]byte, max(need, 512, 2*cap(d.buf)))
	}
	buf := d.buf[:need]
	n, err := frameMasked(buf, op, b)
	if err != nil {
		p.releaseDirect(c.slot)
		return err
	}
	off := c.writeDirect(buf[:n], held)
	d.sends.Add(1)
	d.bytes.Add(uint64(len(b)))
	d.wire.Add(uint64(off))
	if off == n {
		p.releaseDirect(c.slot)
		return nil
	}
	d.handoffs.Add(1)
	return c.handoff(buf[off:n], 1, held)
}

// writeDirect writes buf (whole frames) to c's held socket with send(2)
// until it is all written or the socket takes no more, and returns how
// much went: EAGAIN (the socket is full) or an error leaves the rest to
// the loop, which writes it or meets the same error and ends the
// connection the way it does for its own sends. It stamps the send for
// the reply spin and the doorbell first.
func (c Conn) writeDirect(buf []byte, held uint32) int {
	p := c.p
	d := &p.direct[c.slot]
	fd := uintptr(atomic.LoadInt32((*int32)(unsafe.Pointer(&p.pub[c.slot].tx_fd))))
	// Stamped before the bytes go: an answer can come back before a
	// stamp taken after them, and the pump would then spin for it in vain.
	var now int64 // one clock read for both stamps
	if p.stampSends {
		now = nanotime()
		p.noteSend(p.shardOf[c.slot], now)
	}
	if p.bellEp >= 0 {
		p.ringBellOn(d, fd, held, now)
	}
	off, n := 0, len(buf)
	for off < n {
		w, _, errno := unix.Syscall6(unix.SYS_SENDTO, fd, uintptr(unsafe.Pointer(&buf[off])), uintptr(n-off),
			unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 || w == 0 {
			break
		}
		off += int(w)
	}
	return off
}

// ringBellOn notes a direct send for the pump's doorbell (pump_linux.go,
// sleepBell): its time (now, or the clock when 0), and the socket added to the doorbell's epoll set
// when it is not there yet (once per socket: one epoll_ctl). We still
// hold the socket, so fd is open and ours; its close removes it from the
// set, and a later socket on the same number has another epoch (or the
// slot was reset, clearing bellKey). Edge-triggered: each arrival of data
// is one wake-up, whoever reads it (the loop does).
func (p *Pool) ringBellOn(d *directSlot, fd uintptr, held uint32, now int64) {
	if now == 0 {
		now = nanotime()
	}
	p.lastDirect.Store(now)
	key := uint64(fd) | uint64(held>>ownEpochShift)<<32 | 1<<63
	if d.bellKey.Load() == key {
		return
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(fd)}
	if err := unix.EpollCtl(p.bellEp, unix.EPOLL_CTL_ADD, int(fd), &ev); err == nil || err == unix.EEXIST {
		d.bellKey.Store(key)
	}
}

// releaseDirect gives the socket back after a whole write: FREE, or to
// the loop when it asked for it meanwhile (it has output, or wants to
// close the socket), waking it if it sleeps (Dekker: our CAS, then its
// loop_sleeping; its store of loop_sleeping, then its look at tx_own).
func (p *Pool) releaseDirect(slot uint32) {
	w := (*uint32)(unsafe.Pointer(&p.pub[slot].tx_own))
	for {
		v := atomic.LoadUint32(w)
		if v&ownWant != 0 {
			if atomic.CompareAndSwapUint32(w, v, v&^(ownState|ownWant)|ownLoop) {
				p.shardOf[slot].kick()
				return
			}
			continue
		}
		if atomic.CompareAndSwapUint32(w, v, v&^ownState|ownFree) {
			return
		}
	}
}

// testHookHandoff, when a test sets it, runs in handoff between taking
// HANDOFF and queueing the rest: the window a Pool.Close may fall in.
var testHookHandoff func()

// handoff passes the unwritten rest of a write to the loop: tx_own
// HANDOFF (the loop writes nothing of c's until the rest arrives, and then
// writes it first), then the rest as TL_CMD_DIRECT with the epoch we held,
// so a rest for a socket the loop has since closed is dropped, never sent
// on the next connection. The rest counts as queued until written: its
// bytes and msgs messages (those it ends).
func (c Conn) handoff(rest []byte, msgs int, held uint32) error {
	p := c.p
	w := c.ownWord()
	for {
		v := atomic.LoadUint32(w)
		if atomic.CompareAndSwapUint32(w, v, v&^(ownState|ownWant)|ownHandoff) {
			break
		}
	}
	if testHookHandoff != nil {
		testHookHandoff()
	}
	sh := p.shardOf[c.slot]
	sh.lockSend()
	defer sh.sendMu.Unlock()
	units := uint64(len(rest)) + uint64(msgs)*unitMsg
	p.txAcc[c.slot].Add(units)
	var pre [8]byte
	binary.NativeEndian.PutUint64(pre[:], units)
	if err := sh.putRecordPre(cmdDirect, 0, uint16(held>>ownEpochShift), c.slot, c.gen, pre[:], rest, true, false); err != nil {
		return err // the pool closed: the loop is gone, and the socket with it
	}
	sh.publish()
	return nil
}

// frameMasked writes one whole masked frame (FIN set) of opcode op
// carrying b into dst (len(b)+wsMaxHdr bytes) and returns its length. The
// mask key comes from crypto/rand, as RFC 6455 asks; the framing and the
// masking are package ws's, the ones its parser and the test servers use.
func frameMasked(dst []byte, op Opcode, b []byte) (int, error) {
	var key [4]byte
	if _, err := rand.Read(key[:]); err != nil {
		return 0, err
	}
	return len(ws.AppendMaskedFrame(dst[:0], true, op, key, b)), nil
}
