//go:build linux && cgo

package talaris

// The send API's Linux half: admission against Config.MaxSendQueue,
// Send*, SendContext and its waits, Ping and Pong, Close and Abort, and
// Inject for memory connections. Records go through the command ring's
// producer (cmdring_linux.go); a message that may go out at once is
// written by the sending goroutine itself (direct_linux.go).

/*
#include "csrc/talaris.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"
)

// sendAdmission is the Pool's per-slot send admission, beside the command
// ring it guards.
type sendAdmission struct {
	// Per slot: units accepted (updated under the slot's shard.sendMu),
	// refused sends, and the generation Conn.Close ended.
	txAcc       []atomic.Uint64
	txFull      []atomic.Uint64
	txFullTotal atomic.Uint64 // txFull over every connection ever (Metrics.SendQueueFull)
	userClosed  []atomic.Uint32
	// Per slot: the dial has a ReconnectPolicy (set by dial before the
	// handle exists).
	rcPolicy []atomic.Bool
	// Per slot: tx_dropped's messages the pump has reported in an Event
	// (dropsSince; written by the pump, reset with the slot by a dial:
	// atomic, since what orders the two goes through the C rings).
	dropSeen []atomic.Uint64
	// Per slot: tx_dropped when a Flush last reported drops (reset with
	// the slot): a Flush reports the drops since.
	flushDrops []atomic.Uint64
	direct     []directSlot // direct sends (direct_linux.go)
	maxDirect  int          // largest direct message; -1 with testhook.Knobs.NoDirectSend
}

// Send units (csrc/ring.h): a message counts its payload bytes plus
// unitMsg, so accepted minus retired units say both how many bytes
// (below bit 40) and how many messages (above it) are queued.
const (
	unitMsg   = uint64(C.TL_UNIT_MSG)
	unitBytes = uint64(C.TL_UNIT_BYTES)
)

// admit counts units send units against c's queue (Config.MaxSendQueue
// bounds their bytes) and returns nil when they fit, ErrWouldBlock when
// they do not, or the reason c takes no sends at all. Called with sendMu
// held, which serialises txAcc's updates (pub stays mapped while the call
// is inside enter).
func (c Conn) admit(units uint64) error {
	p := c.p
	if p.closed.Load() {
		return ErrPoolClosed
	}
	if err := c.refusal(); err != nil {
		return err
	}
	acc := p.txAcc[c.slot].Load()
	if q := c.queued(acc); q > 0 && q&unitBytes+units&unitBytes > p.cfg.MaxSendQueue {
		return ErrWouldBlock
	}
	p.txAcc[c.slot].Store(acc + units)
	return nil
}

// refusal is why c takes no sends now, or nil: ErrReconnecting from the
// moment a handle with a ReconnectPolicy dropped (or started the close
// handshake of a drop, the server's close) until its next open,
// ErrClosed once it ended or was closed.
func (c Conn) refusal() error {
	if !c.live() || c.p.userClosed[c.slot].Load() == c.gen {
		return ErrClosed
	}
	if c.inGap() {
		return ErrReconnecting
	}
	if c.sendable() {
		return nil
	}
	if c.p.rcPolicy[c.slot].Load() {
		return ErrReconnecting // closing because the server closed: the next attempt follows
	}
	return ErrClosed
}

// countFull counts a send refused (or made to wait) by a full queue.
func (p *Pool) countFull(slot uint32) {
	p.txFull[slot].Add(1)
	p.txFullTotal.Add(1)
}

// queued returns the send units accepted for c (acc) that the loop has
// not yet written or dropped (bytes: & unitBytes; messages: / unitMsg).
func (c Conn) queued(acc uint64) uint64 {
	done := atomic.LoadUint64((*uint64)(unsafe.Pointer(&c.p.pub[c.slot].tx_done)))
	if done >= acc {
		return 0
	}
	return acc - done
}

// send queues one data message, split into fragments of at most
// maxRecord bytes, or returns ErrWouldBlock at once (counted in
// SendQueueFull when countFull is set).
func (c Conn) send(op Opcode, b []byte) error {
	if op == OpText && !utf8.Valid(b) {
		return ErrInvalidUTF8
	}
	return c.trySend(op, b, true)
}

func (c Conn) trySend(op Opcode, b []byte, countFull bool) error {
	if !c.enter() {
		return c.endedErr()
	}
	p := c.p
	defer p.exit()
	sh := p.shardOf[c.slot]
	sh.lockSend()
	if held, ok := c.takeDirect(len(b)); ok {
		sh.sendMu.Unlock()
		return c.sendDirect(op, b, held) // stamps for the reply spin itself
	}
	defer sh.sendMu.Unlock()
	units := uint64(len(b)) + unitMsg
	if err := c.admit(units); err != nil {
		if err == ErrWouldBlock && countFull {
			p.countFull(c.slot)
		}
		return err
	}
	if p.stampSends {
		p.noteSend(sh, nanotime()) // before the loop can send it (sendDirect says why)
	}
	if err := c.putChunksLocked(cmdSend, op, b, 0); err != nil {
		return c.unadmit(units, err)
	}
	return nil
}

// errRingFull is a send refused because an inline loop's command ring is
// full and the caller is not the loop's goroutine (reserve): an
// ErrWouldBlock that SendContext waits out on the ring (waitRing).
var errRingFull = fmt.Errorf("%w: the command ring is full until the inline loop's goroutine runs the loop", ErrWouldBlock)

// unadmit takes back the units of a command the ring refused whole
// (errRingFull; counted as a full queue) and returns err. Called with
// sendMu held, like admit.
func (c Conn) unadmit(units uint64, err error) error {
	if err == errRingFull {
		c.p.txAcc[c.slot].Add(^(units - 1))
		c.p.countFull(c.slot)
	}
	return err
}

// waitRing sleeps until the command ring of c's loop has room for n
// bytes, the pool closes or ctx is done (a SendContext refused with
// errRingFull). The loop bumps space_seq after a drain while prod_waiting
// is set, Close bumps it, and so does ctx's AfterFunc: no wake-up is
// lost (the 1 s timeout covers another producer clearing prod_waiting).
// The caller is inside p.enter.
func (c Conn) waitRing(ctx context.Context, n uint64) error {
	sh := c.p.shardOf[c.slot]
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		atomic.AddUint32(sh.spaceSeq, 1)
		futexWake(sh.spaceSeq)
		close(fired)
	})
	defer func() {
		if !stop() {
			<-fired
		}
	}()
	n = cmdHdr + (min(n, uint64(c.p.maxRecord()))+15)&^15
	for {
		atomic.StoreUint32(sh.prodWaiting, 1)
		seq := atomic.LoadUint32(sh.spaceSeq)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("talaris: send: %w", err)
		}
		if c.p.closed.Load() {
			return ErrPoolClosed
		}
		// Room for the record, wherever the tail is (a wrap may pad it).
		if atomic.LoadUint64(sh.cmdTail)+2*n-atomic.LoadUint64(sh.cmdHead) <= sh.cmdSize {
			return nil
		}
		futexWait(sh.spaceSeq, seq, time.Second)
	}
}

// noteSend stamps an accepted send for the reply spin (Config.Tuning.ReplySpin)
// and the loop's batched wait (Config.Tuning.MinWait, which a send ends):
// the pump's (Pool.lastSend) and sh's loop's (tl_cmdring.sent_ns). Both
// are hints read with relaxed loads; a lost race only shortens a spin.
func (p *Pool) noteSend(sh *shard, now int64) {
	p.lastSend.Store(now)
	atomic.StoreUint64(sh.sentNs, uint64(now))
}

// endedErr is the error of a call refused by enter: the zero Conn's is
// ErrClosed, a closing pool's ErrPoolClosed.
func (c Conn) endedErr() error {
	if c.p == nil {
		return ErrClosed
	}
	return ErrPoolClosed
}

// sendContext is SendContext: trySend, and while the queue is full (or
// the handle waits to reconnect), sleep on the slot's tx_seq futex, which the loop bumps when queued bytes are
// written (and on every state change), Close bumps when the pool closes
// and ctx's AfterFunc bumps when ctx is done. Every wake-up source writes
// the word, so no wake-up is lost and no poll is needed.
func (c Conn) sendContext(ctx context.Context, op Opcode, b []byte) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if op != OpText && op != OpBinary {
		return fmt.Errorf("%w: %d (SendContext sends text or binary messages)", ErrInvalidOpcode, uint8(op))
	}
	if op == OpText && !utf8.Valid(b) {
		return ErrInvalidUTF8
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("talaris: send: %w", err)
	}
	// Inside enter for the whole call: Close wakes the wait and frees
	// the loop's memory only once every such call has left.
	if !c.enter() {
		return c.endedErr()
	}
	defer c.p.exit()
	err := c.trySend(op, b, true)
	for err == ErrWouldBlock || err == errRingFull {
		if err == errRingFull {
			err = c.waitRing(ctx, uint64(len(b)))
		} else {
			err = c.waitWritable(ctx, uint64(len(b))+unitMsg)
		}
		if err == nil {
			err = c.trySend(op, b, false)
		}
	}
	return err
}

// waitWritable sleeps until units send units may fit c's queue (and c is
// not waiting to reconnect), c ends, the pool closes or ctx is done. The caller is inside p.enter (Close
// wakes every waiter, then waits for them to leave before it frees pub).
func (c Conn) waitWritable(ctx context.Context, units uint64) error {
	p := c.p
	return c.waitTx(ctx, func() (bool, error) {
		if err := c.refusal(); err != nil {
			return false, err
		}
		q := c.queued(p.txAcc[c.slot].Load())
		return q == 0 || q&unitBytes+units&unitBytes <= p.cfg.MaxSendQueue, nil
	})
}

// waitTx sleeps on c's tx_seq futex until ready reports true or an error,
// the pool closes or ctx is done. The loop bumps the word when queued
// units retire and on every state change, Close bumps it when the pool
// closes and ctx's AfterFunc when ctx is done: every wake-up source
// writes the word, so no wake-up is lost and nothing polls. The caller is
// inside p.enter (Close wakes every waiter, then waits for them to leave
// before it frees pub).
func (c Conn) waitTx(ctx context.Context, ready func() (bool, error)) error {
	p := c.p
	if p.closed.Load() {
		return ErrPoolClosed
	}
	// Hold the slot: it is not reset for a new connection (which would
	// zero tx_waiters under us) while we wait.
	p.slotMu.Lock()
	if p.gens[c.slot] != c.gen || p.refs[c.slot] == 0 {
		p.slotMu.Unlock()
		return ErrClosed
	}
	p.refs[c.slot]++
	p.slotMu.Unlock()
	defer p.unref(c.slot)

	pb := p.pub[c.slot]
	seq := (*uint32)(unsafe.Pointer(&pb.tx_seq))
	waiting := (*uint32)(unsafe.Pointer(&pb.tx_waiters))
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		atomic.AddUint32(seq, 1)
		futexWake(seq)
		close(fired)
	})
	defer func() {
		if !stop() {
			<-fired // it runs: let it finish with seq before pub may go
		}
	}()
	atomic.AddUint32(waiting, 1)
	defer atomic.AddUint32(waiting, ^uint32(0))
	for {
		// Read the word, then every condition, then sleep only if the
		// word is unchanged (Dekker with the loop's bump-then-check).
		s := atomic.LoadUint32(seq)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("talaris: send: %w", err)
		}
		if p.closed.Load() {
			return ErrPoolClosed
		}
		if ok, err := ready(); ok || err != nil {
			return err
		}
		if p.cfg.Tuning.InlineLoop && p.runInline(C.TL_INLINE_ONCE) {
			continue // the inline loop's own goroutine: it sends the queue
		}
		futexWait(seq, s, time.Second) // the timeout is a defence only
	}
}

// inject queues b for a memory connection in records of at most maxRecord
// bytes (the loop parses across record boundaries). The bytes count
// against MaxSendQueue until the loop has parsed them (it keeps what the
// event ring cannot take yet in the connection's own queue, so an INJECT
// never waits in the shared ring); while they would not fit, inject
// waits like SendContext without a deadline, that is for the pump.
func (c Conn) inject(b []byte) error {
	if !c.enter() {
		return c.endedErr()
	}
	defer c.p.exit()
	if len(b) == 0 {
		if !c.live() {
			return ErrClosed
		}
		return nil
	}
	err := c.tryInject(b)
	for err == ErrWouldBlock {
		if err = c.waitWritable(context.Background(), uint64(len(b))); err == nil {
			err = c.tryInject(b)
		}
	}
	return err
}

func (c Conn) tryInject(b []byte) error {
	sh := c.p.shardOf[c.slot] // the caller is inside p.enter
	sh.lockSend()
	defer sh.sendMu.Unlock()
	if err := c.admit(uint64(len(b))); err != nil {
		return err
	}
	return c.putChunksLocked(cmdInject, 0, b, 0)
}

// putChunksLocked appends b as records of op cmd of at most maxRecord
// bytes, publishing after each so the loop can start on a large one. For
// cmdSend the records are the fragments of one message of opcode op, and
// more (cmdfMore or 0) goes on every record: a batch's messages but its
// last. Called with sendMu held.
func (c Conn) putChunksLocked(cmd uint8, op Opcode, b []byte, more uint8) error {
	p := c.p
	sh := p.shardOf[c.slot]
	maxr := p.maxRecord()
	for first := true; ; first = false {
		chunk := b
		fin := true
		if len(chunk) > maxr {
			chunk, fin = b[:maxr], false
		}
		var flags uint8
		if cmd == cmdSend {
			flags = uint8(op)
			if !first {
				flags = cmdfCont
			}
			if fin {
				flags |= cmdfFin
			}
			flags |= more
		}
		// Once its first fragment is in, a message goes in whole, also if
		// Pool.Close begins meanwhile (rest), as a batch does.
		if err := sh.putRecordPre(cmd, flags, 0, c.slot, c.gen, nil, chunk, !first && cmd == cmdSend, first && cmd == cmdSend); err != nil {
			return err
		}
		b = b[len(chunk):]
		sh.publish()
		if fin {
			return nil
		}
	}
}

// ctrlUnits is TL_CTRL_UNITS: a ping or pong counts its payload plus this
// against the send queue, so empty heartbeats are bounded too.
const ctrlUnits = C.TL_CTRL_UNITS

func (c Conn) control(op uint8, b []byte) error {
	if len(b) > 125 {
		return ErrControlTooLong
	}
	if !c.enter() {
		return c.endedErr()
	}
	p := c.p
	defer p.exit()
	sh := p.shardOf[c.slot]
	sh.lockSend()
	defer sh.sendMu.Unlock()
	if c.refusal() == ErrReconnecting {
		return ErrReconnecting
	}
	// Before the upgrade completes the loop has nowhere to put a control
	// frame (only data messages wait for the open): say so instead of
	// accepting one that would be dropped. Not counted as a full queue.
	if st := atomic.LoadUint32((*uint32)(unsafe.Pointer(&p.pub[c.slot].state))); c.live() && st < uint32(StateOpen) {
		return errNotOpen
	}
	units := uint64(len(b)) + ctrlUnits + unitMsg
	if err := c.admit(units); err != nil {
		if err == ErrWouldBlock {
			p.countFull(c.slot)
		}
		return err
	}
	if err := sh.putRecord(op, 0, 0, c.slot, c.gen, b, true); err != nil {
		return c.unadmit(units, err)
	}
	sh.publish()
	return nil
}

// abort sends the abort command (also after Close: it ends the handshake
// at once); see endConn.
func (c Conn) abort() error { return c.endConn(cmdAbort, 0, nil) }

// closeConn sends the close command; a second Close returns ErrClosed.
func (c Conn) closeConn(code int, reason string) error {
	return c.endConn(cmdClose, uint16(code), []byte(reason))
}

// endConn sends Close or Abort. From here on Send* on c returns ErrClosed
// (the loop would drop what follows the close frame) and a SendContext
// waiting on c returns.
func (c Conn) endConn(op uint8, code uint16, payload []byte) error {
	if !c.enter() {
		return c.endedErr()
	}
	p := c.p
	defer p.exit()
	sh := p.shardOf[c.slot]
	sh.lockSend()
	defer sh.sendMu.Unlock()
	if p.closed.Load() {
		return ErrPoolClosed
	}
	if !c.live() || (op == cmdClose && p.userClosed[c.slot].Load() == c.gen) {
		return ErrClosed // ended, or closed already (an Abort still goes)
	}
	p.userClosed[c.slot].Store(c.gen)
	seq := (*uint32)(unsafe.Pointer(&p.pub[c.slot].tx_seq))
	atomic.AddUint32(seq, 1)
	futexWake(seq)
	if err := sh.putRecord(op, 0, code, c.slot, c.gen, payload, false); err != nil {
		return err
	}
	sh.publish()
	return nil
}
