//go:build linux && cgo

package talaris

// Conn.Flush and what a connection reports of the sends it dropped: the
// send units the loop retired without writing them (tl_conn_pub.tx_dropped).

/*
#include "csrc/talaris.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// dropped returns the send units of c's slot retired without reaching
// the socket, since the slot's dial (messages: / unitMsg).
func (c Conn) dropped() uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&c.p.pub[c.slot].tx_dropped)))
}

// flush is Flush: it waits until the loop has retired every send unit
// accepted before the call (tx_done reaches the accepted count read under
// sendMu), then says whether they all reached the socket.
func (c Conn) flush(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("talaris: flush: %w", err)
	}
	if !c.enter() { // for the whole call: Close wakes the wait and frees pub only after it left
		return c.endedErr()
	}
	p := c.p
	defer p.exit()
	sh := p.shardOf[c.slot]
	sh.lockSend()
	if !c.live() {
		sh.sendMu.Unlock()
		return c.endErr()
	}
	target := p.txAcc[c.slot].Load()
	sh.sendMu.Unlock()
	done := func() bool {
		return atomic.LoadUint64((*uint64)(unsafe.Pointer(&p.pub[c.slot].tx_done))) >= target
	}
	err := c.waitTx(ctx, func() (bool, error) {
		if done() {
			return true, nil
		}
		if !c.live() {
			return false, c.endErr()
		}
		return false, nil
	})
	if err != nil {
		if err == ErrClosed {
			return c.endErr()
		}
		if ctx.Err() != nil {
			return fmt.Errorf("talaris: flush: %w", ctx.Err())
		}
		return err
	}
	// tx_dropped is stored before tx_done (tl_pub_tx_drop): a drop among
	// the units we waited for is visible now. Every drop since the slot's
	// dial that no Flush reported yet was of a message accepted before
	// this call: it is reported once, here.
	if cur, prev := c.dropped(), p.flushDrops[c.slot].Load(); cur != prev {
		p.flushDrops[c.slot].CompareAndSwap(prev, cur)
		n := (cur - prev) / unitMsg
		if c.inGap() {
			return fmt.Errorf("%w: %d queued messages dropped", ErrReconnecting, n)
		}
		if !c.live() {
			return c.endErr()
		}
		return fmt.Errorf("%w: %d queued messages dropped", ErrClosed, n)
	}
	return nil
}

// endErr is the error of c's ended connection: the cause its final
// event reports (a clean close: ErrClosed), or ErrClosed once the slot
// belongs to another connection. The caller is inside p.enter.
func (c Conn) endErr() error {
	pb := c.p.pub[c.slot]
	if atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.gen))) != c.gen ||
		atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.state))) < uint32(StateClosed) {
		return ErrClosed
	}
	e := atomic.LoadInt32((*int32)(unsafe.Pointer(&pb.err)))
	if e == 0 {
		return fmt.Errorf("%w: the connection ended with a close handshake", ErrClosed)
	}
	return proxyErr(makeErr(e, int32(pb.aux), int(pb.code), C.GoString(&pb.detail[0])), c.p.proxyOf(c.slot, c.gen))
}

// dropsSince returns the messages of slot's connection dropped since the
// last call for it (the pump's, at the final event and at each
// EventReconnecting) and remembers the count. Pump goroutine only.
func (p *Pool) dropsSince(slot uint32) uint64 {
	n := atomic.LoadUint64((*uint64)(unsafe.Pointer(&p.pub[slot].tx_dropped))) / unitMsg
	return n - p.dropSeen[slot].Swap(n)
}
