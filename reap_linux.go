//go:build linux && cgo

package talaris

// Failed-Dial reaping: a synchronous Dial that failed returned its error,
// so its connection's last events are quiet (no callback sees them); the
// pump, or the failed Dial itself when nobody pumps, passes them and frees
// the slot.

/*
#include <errno.h>
#include "csrc/talaris.h"
#include "csrc/crypto/gcm.h"
*/
import "C"

import (
	"bytes"
	"sync/atomic"
	"unsafe"
)

// failedDials is the Pool's state for reaping failed synchronous Dials.
type failedDials struct {
	// quiet[slot] is the generation of a synchronous Dial's connection
	// that has not opened: if it ends without opening, its final event
	// is consumed without a callback (the caller never got the Conn; Dial
	// returned the error). EventOpen clears it.
	quiet []atomic.Uint32

	// pumpWaiting: a pump call waits for a reaper's claim (enterPump);
	// reapQuiet then takes no new claim and leaves the events to it.
	pumpWaiting atomic.Bool
	// reapLogs belongs to reapQuiet's claim (pumping 3): the lifecycle
	// records it passed, logged once it gave the claim back.
	reapLogs []reapLog
}

// quietEvent reports whether a non-data event belongs to a synchronous
// Dial's connection that never opened: its final event frees the slot
// without a callback, since Dial returned the error and the caller never
// had the Conn. EventOpen ends the quiet period (Dial returns that Conn).
func (p *Pool) quietEvent(e *C.struct_tl_event, slot uint32, kind EventKind) bool {
	q := &p.quiet[slot]
	if q.Load() != uint32(e.gen) {
		return false
	}
	if kind == EventOpen {
		q.Store(0)
		return false
	}
	if e.flags&C.TL_EVF_FINAL != 0 {
		q.Store(0)
	}
	return true
}

// reapAll is reapQuiet for no particular connection: it passes the
// quiet events of failed synchronous Dials at the head of the rings, when
// no pump call runs (allocSlot's last resort before ErrTooManyConns).
func (p *Pool) reapAll() { p.reapQuiet(^uint32(0), 0) }

// reapQuiet passes, when no pump call runs, the events at the head of the
// rings that belong to failed synchronous Dials (quiet: no callback gets
// them), so their slots and ConnCount come back without a pump call: a
// service that retries Dial before it starts pumping would otherwise run
// out of slots (ErrTooManyConns) on dials that all failed. It stops at the
// first event a pump would deliver (data, an open, a connection its
// caller has). It reports whether the caller needs to look again: no pump
// runs, the final event of slot/gen was not passed (by this call or by
// another reaper: passing it clears quiet[slot]; the loop stores the
// closed state just before it publishes that event), and no event a pump
// must deliver stands at a ring's head (only a pump call passes that). A
// pump call running, or starting meanwhile (it waits out the claim, see
// enterPump), passes the event itself.
func (p *Pool) reapQuiet(slot, gen uint32) bool {
	passed := func() bool { // another reaper (or a pump) passed slot/gen's final event
		return slot < uint32(len(p.quiet)) && p.quiet[slot].Load() != gen
	}
	for {
		if p.pumpWaiting.Load() {
			return false // a pump call waits for the claim: the events are its
		}
		if p.pumping.CompareAndSwap(pumpFree, pumpReaping) {
			break
		}
		if c := p.pumping.Load(); c != pumpReaping && c != pumpFree || passed() {
			return false // a pump call (or Close) has the ring, or slot/gen is done
		}
		// Another failed Dial reaping: microseconds. Giving up here left
		// this Dial's slot taken until something pumped (ErrTooManyConns
		// for the next Dial on a full Pool).
		osYield()
	}
	found, blocked := false, false
	for _, sh := range p.shards {
		r := &sh.ev
		tail := r.loadTail()
		i := r.pos
		for ; i != tail; i++ {
			e := &r.events[i&r.mask]
			s, k := uint32(e.slot)+r.base, EventKind(e.kind)
			if k == EventText || k == EventBinary || k == EventOpen || p.quiet[s].Load() != uint32(e.gen) {
				blocked = true // a pump must deliver it: waiting here will not pass it
				break
			}
			if !p.endedQuiet(s, uint32(e.gen)) {
				break // a failed Dial still ending: its final event comes soon
			}
			if s == slot && uint32(e.gen) == gen && e.flags&C.TL_EVF_FINAL != 0 {
				found = true
			}
		}
		if i != r.pos {
			sh.dispatch(i, nil, nil, nil)
		}
	}
	logs := p.reapLogs
	p.reapLogs = nil
	p.leavePump()
	for i := range logs { // the Logger runs without the claim (a pump call waits on it)
		p.logRecord(logs[i].c, &logs[i].ev, logs[i].attempt)
	}
	return !found && !blocked && !passed()
}

// endedQuiet reports whether the events of slot/gen are a failed
// synchronous Dial's for good: quiet (its Dial waits or returned the
// error) and the connection ended without opening. Only its Dial clears
// quiet, and only for a connection that opened, so the answer cannot
// change while reapQuiet passes the event (a connection still dialing
// could open meanwhile, and its event would then be its caller's).
func (p *Pool) endedQuiet(slot, gen uint32) bool {
	if p.quiet[slot].Load() != gen {
		return false
	}
	pb := p.pub[slot]
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.state))) == uint32(StateClosed) &&
		atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.opened))) == 0
}

// reapLog is a lifecycle record reapQuiet passed, logged after it gave
// the claim back; nothing in it points into the ring.
type reapLog struct {
	c       Conn
	ev      Event
	attempt int
}

// deferLog keeps a record for reapQuiet to log (cold path: failed dials
// with a Logger).
func (p *Pool) deferLog(c Conn, ev *Event, payload []byte) {
	l := reapLog{c: c, ev: *ev, attempt: reconnectAttempt(payload)}
	l.ev.Payload, l.ev.Reason = nil, bytes.Clone(ev.Reason)
	p.reapLogs = append(p.reapLogs, l)
}

// reapFailed gives back the slot of a synchronous Dial that failed
// (reapQuiet) when nobody pumps, waiting at most reapWait for the loop to
// publish the final event it is about to publish.
func (p *Pool) reapFailed(slot, gen uint32) {
	deadline := nanotime() + int64(reapWait)
	for p.reapQuiet(slot, gen) && nanotime() < deadline {
		osYield()
	}
}
