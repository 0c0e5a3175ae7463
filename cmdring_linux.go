//go:build linux && cgo

package talaris

// The producer side of the Go->C command ring: 16-byte-aligned records
// (a struct tl_cmd header and an inline payload) that Go appends under
// its loop's shard.sendMu and the loop drains. Go is the only producer, so the ring
// stays single-producer even though any goroutine may send.

/*
#include "csrc/talaris.h"
*/
import "C"

import (
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// Record flags and the header size (TL_CMDF_* and sizeof(struct tl_cmd)).
const (
	cmdfFin    = 0x10 // with cmdSend: the last fragment of a message
	cmdfCont   = 0x20 // with cmdSend: a continuation fragment
	cmdfMore   = 0x40 // with cmdSend: more records of the same batch follow (one flush at the last)
	cmdfMemory = 0x1  // with cmdDial: a socketless connection fed by cmdInject
	// with cmdClose: abort the connection only if it has not opened yet
	// (Dial's context ended; an open connection is Dial's result).
	cmdfIfDialing = 0x2

	cmdHdr = 16
)

// The header must be struct tl_cmd's size (see talaris_linux.go for the
// trick). The op and flag values mirror csrc/ring.h by number: the C side
// keeps them stable as part of the ring's layout.
type (
	_ [unsafe.Sizeof(C.struct_tl_cmd{}) - cmdHdr]byte
	_ [cmdHdr - unsafe.Sizeof(C.struct_tl_cmd{})]byte
)

// maxRecord is the largest payload one command record carries; bigger sends
// become several fragments of one message.
func (p *Pool) maxRecord() int {
	return int(p.shards[0].cmdSize / 4) // every loop's ring has the same size
}

// reserve waits until n bytes (a whole record) fit contiguously and
// returns the offset to write at. Called with sendMu held. The loop takes
// every command off the ring as soon as it runs (nothing waits there), so
// a full ring is momentary: reserve spins
// briefly, then sleeps on the ring's space_seq futex, which the loop bumps
// and wakes after a drain while prod_waiting is set (and Close does too).
// It returns ErrPoolClosed once the pool closes; a direct send's rest
// (rest) still goes in until the loop is gone (Pool.close).
//
// refuse: the caller may still take its command back (nothing of it is
// in the ring: a send's first record, a ping). On an inline loop's ring,
// from another goroutine than the loop's, it then gets errRingFull
// instead of the sleep: only the loop's goroutine makes room, and it may
// not run the loop for a long time (Send* promise not to wait;
// SendContext waits with its context, waitRing).
func (sh *shard) reserve(n uint64, rest, refuse bool) (uint64, error) {
	spins := 0
	for {
		if sh.refuses(rest) {
			return 0, ErrPoolClosed
		}
		off := sh.tail & (sh.cmdSize - 1)
		pad := uint64(0)
		if off+n > sh.cmdSize {
			pad = sh.cmdSize - off
		}
		if sh.tail+pad+n-sh.headCache <= sh.cmdSize {
			if pad > 0 {
				h := (*C.struct_tl_cmd)(unsafe.Pointer(&sh.cmdBuf[off]))
				*h = C.struct_tl_cmd{len: C.uint32_t(pad - cmdHdr), op: cmdPad}
				sh.tail += pad
				off = 0
			}
			return off, nil
		}
		sh.headCache = atomic.LoadUint64(sh.cmdHead)
		if sh.tail+pad+n-sh.headCache <= sh.cmdSize {
			continue
		}
		// The loop is behind: let it run (it drains unconditionally);
		// an inline loop's own goroutine runs it here. Records put but
		// not yet published (a batch publishes once, at its end) are
		// published first: the room we wait for may be theirs to free.
		if atomic.LoadUint64(sh.cmdTail) != sh.tail {
			atomic.StoreUint64(sh.cmdTail, sh.tail)
		}
		if sh.p.cfg.Tuning.InlineLoop && sh.p.runInline(C.TL_INLINE_NOWAIT) {
			continue
		}
		sh.kick()
		if spins < 64 {
			spins++
			runtime.Gosched()
			continue
		}
		if refuse && sh.p.cfg.Tuning.InlineLoop {
			return 0, errRingFull
		}
		// Announce, then recheck (Dekker with the loop's seq_cst store of
		// head and load of prod_waiting), then sleep until a drain.
		atomic.StoreUint32(sh.prodWaiting, 1)
		seq := atomic.LoadUint32(sh.spaceSeq)
		sh.headCache = atomic.LoadUint64(sh.cmdHead)
		if sh.tail+pad+n-sh.headCache > sh.cmdSize && !sh.refuses(rest) {
			futexWait(sh.spaceSeq, seq, time.Second) // the timeout is a defence only
		}
		atomic.StoreUint32(sh.prodWaiting, 0)
	}
}

// publish makes records up to p.tail visible and wakes the loop if it
// announced that it sleeps.
func (sh *shard) publish() {
	atomic.StoreUint64(sh.cmdTail, sh.tail)
	sh.kick()
}

// kick wakes the loop if it announced that it sleeps.
func (sh *shard) kick() {
	if atomic.LoadUint32(sh.loopSleeping) != 0 && atomic.CompareAndSwapUint32(sh.loopSleeping, 1, 0) {
		sh.wakeLoop()
	}
}

// refuses reports whether the shard's ring takes no more records: once
// the pool closes, except a direct send's rest (rest), which the loop
// waits for (its close frame goes after it) until the loop is gone.
func (sh *shard) refuses(rest bool) bool {
	return sh.p.closed.Load() && (!rest || sh.gone.Load())
}

// putRecord appends one record for global slot slot (one of the shard's)
// without publishing it. Called with sendMu held.
func (sh *shard) putRecord(op, flags uint8, code uint16, slot, gen uint32, payload []byte, refuse bool) error {
	return sh.putRecordPre(op, flags, code, slot, gen, nil, payload, op == cmdDirect, refuse)
}

// putRecordPre is putRecord whose payload is pre then payload (a direct
// send's rest: its units, then its bytes); rest as for reserve: the
// record goes in after Pool.Close began, until the loop is gone (a
// direct send's rest, a batch's records after its first: what was
// accepted goes in whole).
func (sh *shard) putRecordPre(op, flags uint8, code uint16, slot, gen uint32, pre, payload []byte, rest, refuse bool) error {
	pl := len(pre) + len(payload)
	n := cmdHdr + (uint64(pl)+15)&^15
	off, err := sh.reserve(n, rest, refuse)
	if err != nil {
		return err
	}
	h := (*C.struct_tl_cmd)(unsafe.Pointer(&sh.cmdBuf[off]))
	*h = C.struct_tl_cmd{len: C.uint32_t(pl), op: C.uint8_t(op), flags: C.uint8_t(flags),
		code: C.uint16_t(code), slot: C.uint32_t(slot - sh.base), gen: C.uint32_t(gen)}
	copy(sh.cmdBuf[off+cmdHdr:], pre)
	copy(sh.cmdBuf[off+cmdHdr+uint64(len(pre)):], payload)
	sh.tail += n
	return nil
}

// lockSend takes sendMu. On an inline loop's own goroutine it never
// sleeps on the lock: its holder may be another goroutine waiting in
// reserve for ring room that only this thread's loop can make, so while
// the lock is taken this goroutine runs the loop (iterations that do not
// wait), which drains the ring and wakes the holder. Anywhere else it is
// sendMu.Lock.
func (sh *shard) lockSend() {
	if sh.p.cfg.Tuning.InlineLoop {
		for {
			if sh.sendMu.TryLock() {
				return
			}
			if !sh.p.runInline(C.TL_INLINE_NOWAIT) {
				break // another goroutine, or the loop stopped: the holder's wait ends without us
			}
			runtime.Gosched()
		}
	}
	sh.sendMu.Lock()
}

// command appends and publishes one record on slot's loop.
func (p *Pool) command(op, flags uint8, code uint16, slot, gen uint32, payload []byte) error {
	return p.commandOr(op, flags, code, slot, gen, payload, false)
}

// commandOr is command; refuse as for reserve (errRingFull instead of a
// wait that only an inline loop's goroutine can end).
func (p *Pool) commandOr(op, flags uint8, code uint16, slot, gen uint32, payload []byte, refuse bool) error {
	sh := p.shardOf[slot]
	sh.lockSend()
	defer sh.sendMu.Unlock()
	if err := sh.putRecord(op, flags, code, slot, gen, payload, refuse); err != nil {
		return err
	}
	sh.publish()
	return nil
}
