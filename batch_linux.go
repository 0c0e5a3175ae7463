//go:build linux && cgo

package talaris

// Conn.SendBatch's Linux half: several messages admitted together (all or
// none) and written together, by the sending goroutine in one send(2)
// when the socket may be written directly, else as command records the
// loop collects and flushes once, at the batch's last record.

/*
#include "csrc/talaris.h"
*/
import "C"

import (
	"crypto/rand"
	"fmt"
	"sync/atomic"
	"unicode/utf8"

	"github.com/talaris-go/talaris/ws"
)

// batchUnits returns the send units of msgs (their bytes, plus one
// unitMsg each) and their bytes framed (header and mask key included).
func batchUnits(msgs [][]byte) (units uint64, wire int) {
	for _, m := range msgs {
		units += uint64(len(m)) + unitMsg
		wire += len(m) + wsMaxHdr
	}
	return units, wire
}

// sendBatch is SendBatch: every message of msgs queued in order, or none.
func (c Conn) sendBatch(op Opcode, msgs [][]byte) error {
	if op != OpText && op != OpBinary {
		return fmt.Errorf("%w: %d (SendBatch sends text or binary messages)", ErrInvalidOpcode, uint8(op))
	}
	if op == OpText {
		for _, m := range msgs {
			if !utf8.Valid(m) {
				return ErrInvalidUTF8
			}
		}
	}
	if !c.enter() {
		return c.endedErr()
	}
	p := c.p
	defer p.exit()
	if len(msgs) == 0 {
		if err := c.refusal(); err != nil {
			return err
		}
		return nil
	}
	units, wire := batchUnits(msgs)
	sh := p.shardOf[c.slot]
	sh.lockSend()
	if held, ok := c.takeDirect(wire); ok {
		sh.sendMu.Unlock()
		return c.sendDirectBatch(op, msgs, wire, held)
	}
	defer sh.sendMu.Unlock()
	if err := c.admit(units); err != nil {
		if err == ErrWouldBlock {
			p.countFull(c.slot)
		}
		return err
	}
	if p.cfg.Tuning.InlineLoop {
		if err := sh.inlineBatchFits(msgs, p.maxRecord()); err != nil {
			return c.unadmit(units, err)
		}
	}
	if p.stampSends {
		p.noteSend(sh, nanotime())
	}
	if err := c.putBatchLocked(op, msgs); err != nil {
		return c.unadmit(units, err)
	}
	return nil
}

// errBatchTooBig is a batch an inline loop's command ring can never hold
// at once, sent from another goroutine than the loop's.
var errBatchTooBig = fmt.Errorf("%w: the batch is larger than the inline loop's command ring (Config.Tuning.InlineLoop): split it", ErrInvalidConfig)

// inlineBatchFits checks, on an inline loop's shard and before any record
// of the batch is put, that all of them fit the command ring now: on
// another goroutine than the loop's nobody drains the ring until that
// goroutine runs the loop, so a batch that had to wait for room would
// hold sendMu (and every Close, Abort and Dial of the shard) and could be
// cut by a Pool.Close half-published. Only sendMu holders add records and
// the loop only frees room, so room found here stays. On the loop's own
// goroutine reserve runs the loop for room, and any batch goes. Returns
// errRingFull (SendContext-like callers wait on the ring) or
// errBatchTooBig. Called with sendMu held.
func (sh *shard) inlineBatchFits(msgs [][]byte, maxr int) error {
	need, big := uint64(0), 0
	for _, m := range msgs {
		for n := len(m); ; n -= maxr {
			need += cmdHdr + (uint64(min(n, maxr))+15)&^15
			big = max(big, min(n, maxr))
			if n <= maxr {
				break
			}
		}
	}
	need += cmdHdr + (uint64(big)+15)&^15 // the padding of one wrap at most
	if sh.tail+need-atomic.LoadUint64(sh.cmdHead) <= sh.cmdSize {
		return nil
	}
	if sh.p.runInline(C.TL_INLINE_NOWAIT) {
		return nil // the loop's goroutine (it just ran the loop): reserve makes room as it goes
	}
	if need > sh.cmdSize {
		return errBatchTooBig
	}
	return errRingFull
}

// putBatchLocked appends msgs as the records of a batch: each message as
// putChunksLocked would (fragments of at most maxRecord bytes), every
// record but the last marked cmdfMore, so the loop writes them with one
// send; they are published once, at the end (reserve publishes what is
// put when it must wait for room). Only the first record may be refused
// (errRingFull, or ErrPoolClosed: nothing of the batch is in the ring);
// the rest go in whole even if Pool.Close begins meanwhile, as a direct
// send's rest does. Called with sendMu held.
func (c Conn) putBatchLocked(op Opcode, msgs [][]byte) error {
	sh := c.p.shardOf[c.slot]
	maxr := c.p.maxRecord()
	for i, m := range msgs {
		more := uint8(cmdfMore)
		if i == len(msgs)-1 {
			more = 0
		}
		for first := true; ; first = false {
			chunk, fin := m, true
			if len(chunk) > maxr {
				chunk, fin = m[:maxr], false
			}
			flags := uint8(op)
			if !first {
				flags = cmdfCont
			}
			if fin {
				flags |= cmdfFin
			} else {
				flags |= cmdfMore
			}
			flags |= more
			head := i == 0 && first
			if err := sh.putRecordPre(cmdSend, flags, 0, c.slot, c.gen, nil, chunk, !head, head); err != nil {
				return err
			}
			m = m[len(chunk):]
			if fin {
				break
			}
		}
	}
	sh.publish()
	return nil
}

// sendDirectBatch frames msgs into c's direct buffer (wire bytes at most)
// and writes them with one send(2) from this goroutine; the rest of a
// short write goes to the loop, counted as the messages it ends. c's
// socket is held (takeDirect); the caller is inside p.enter and does not
// hold sendMu.
func (c Conn) sendDirectBatch(op Opcode, msgs [][]byte, wire int, held uint32) error {
	p := c.p
	d := &p.direct[c.slot]
	d.mu.Lock()
	defer d.mu.Unlock()
	if cap(d.buf) < wire {
		d.buf = make([]byte, 0, max(wire, 512, 2*cap(d.buf)))
	}
	buf := d.buf[:0]
	var keys [256]byte // 64 mask keys per crypto/rand read
	k := len(keys)
	var payload uint64
	for _, m := range msgs {
		if k == len(keys) {
			if _, err := rand.Read(keys[:]); err != nil {
				p.releaseDirect(c.slot)
				return err
			}
			k = 0
		}
		buf = ws.AppendMaskedFrame(buf, true, op, [4]byte(keys[k:k+4]), m)
		k += 4
		payload += uint64(len(m))
	}
	d.buf = buf[:0] // keep what append grew
	off := c.writeDirect(buf, held)
	d.sends.Add(uint64(len(msgs)))
	d.bytes.Add(payload)
	d.wire.Add(uint64(off))
	if off == len(buf) {
		p.releaseDirect(c.slot)
		return nil
	}
	// The messages whose frames end past off are not wholly written.
	left, end := 0, 0
	for _, m := range msgs {
		end += ws.HeaderLen(ws.Header{Masked: true, Length: uint64(len(m))}) + len(m)
		if end > off {
			left++
		}
	}
	d.handoffs.Add(1)
	return c.handoff(buf[off:], left, held)
}
