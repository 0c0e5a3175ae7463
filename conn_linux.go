//go:build linux && cgo

package talaris

// A Conn's view of its slot's public block (struct tl_conn_pub), which
// the loop writes and Go reads with atomics.

/*
#include "csrc/talaris.h"
*/
import "C"

import (
	"sync/atomic"
	"unsafe"
)

// live reports whether c's connection has not ended. The caller is
// inside p.enter.
func (c Conn) live() bool {
	if c.slot >= uint32(len(c.p.pub)) {
		return false
	}
	pb := c.p.pub[c.slot]
	// The slot keeps the generation after the final event until it is
	// reused: a closed connection is dead too (Conn's documented contract).
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.gen))) == c.gen &&
		atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.state))) < uint32(StateClosed)
}

// sendable reports whether c takes sends: live, not closed with Close, and
// no close frame sent or received yet (StateClosing: the loop would drop
// them). Called with sendMu held or from SendContext's wait.
func (c Conn) sendable() bool {
	if !c.live() || c.p.userClosed[c.slot].Load() == c.gen {
		return false
	}
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&c.p.pub[c.slot].state))) < uint32(StateClosing)
}

// enter admits a call on c that reads the pool's shared memory (see
// Pool.enter); false for the zero Conn and once the pool is closing.
func (c Conn) enter() bool { return c.p != nil && c.p.enter() }

func (c Conn) state() State {
	if c.p == nil {
		return StateIdle
	}
	if !c.p.enter() {
		return StateClosed // the pool closed: every connection ended with it
	}
	defer c.p.exit()
	if c.slot >= uint32(len(c.p.pub)) {
		return StateIdle
	}
	pb := c.p.pub[c.slot]
	if atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.gen))) != c.gen {
		return StateClosed
	}
	return State(atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.state))))
}

func (c Conn) stats() ConnStats {
	if !c.enter() {
		return ConnStats{}
	}
	defer c.p.exit()
	if !c.live() {
		return ConnStats{} // ended: zero, as documented
	}
	pb := c.p.pub[c.slot]
	d := &c.p.direct[c.slot]
	ld := func(v *C.uint64_t) uint64 { return atomic.LoadUint64((*uint64)(unsafe.Pointer(v))) }
	ds := d.sends.Load()
	st := ConnStats{
		MsgsIn: ld(&pb.msgs_in), BytesIn: ld(&pb.bytes_in),
		MsgsOut: ld(&pb.msgs_out) + ds, BytesOut: ld(&pb.bytes_out) + d.bytes.Load(),
		PingsIn: ld(&pb.pings_in), PongsIn: ld(&pb.pongs_in), WireIn: ld(&pb.wire_in), WireOut: ld(&pb.wire_out) + d.wire.Load(),
		Resumed:    atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.resumed))) != 0,
		SendQueued: c.queued(c.p.txAcc[c.slot].Load()) & unitBytes, SendQueueFull: c.p.txFull[c.slot].Load(),
		SendDropped: c.dropped() / unitMsg,
		Reconnects:  ld(&pb.reconnects),
	}
	// A slot reused by a new Dial while we read (its generation is stored
	// before its counters are reset) would mix another connection's
	// counters into ours: only a generation unchanged after the loads
	// makes them c's.
	if !c.live() {
		return ConnStats{}
	}
	return st
}

// directSends is testhook.DirectSends: the messages of c the sending
// goroutine wrote to the socket itself, and those of them the socket took
// only part of (the loop wrote the rest); zero once c ended.
func (c Conn) directSends() (sends, handoffs uint64) {
	if !c.enter() {
		return 0, 0
	}
	defer c.p.exit()
	d := &c.p.direct[c.slot]
	// Handoffs before sends: sendDirect adds a send before its handoff,
	// so read the other way round handoffs <= sends holds.
	handoffs = d.handoffs.Load()
	sends = d.sends.Load()
	if !c.live() {
		return 0, 0 // ended, or the slot is another connection's now
	}
	return sends, handoffs
}

// inGap reports whether c waits to reconnect (from the teardown before
// its EventReconnecting until the next open): sends then return
// ErrReconnecting. Call after live.
func (c Conn) inGap() bool {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&c.p.pub[c.slot].gap))) != 0
}

func (c Conn) subprotocol() string {
	if !c.enter() {
		return ""
	}
	defer c.p.exit()
	if !c.live() {
		return ""
	}
	return C.GoString(&c.p.pub[c.slot].proto[0])
}
