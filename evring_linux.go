//go:build linux && cgo

package talaris

// The consumer side of the C->Go event ring, shared by Pool and Decoder:
// acquire-load the tail, hand events [pos, tail) to the callbacks, then
// release the whole batch (and the arena bytes and receive slots its
// payloads point into) with one store of head. Then the Pool's pumps.

/*
#include <errno.h>
#include "csrc/talaris.h"
#include "csrc/gcm.h"
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/talaris-go/talaris/internal/testhook"
	"golang.org/x/sys/unix"
)

// evConsumer reads one event ring. It is owned by the goroutine that pumps
// (or decodes); no cgo call, interface call or allocation happens per
// event (TestHandoffCgoCalls, TestPumpAllocs).
type evConsumer struct {
	events []C.struct_tl_event
	mask   uint64
	tail   *uint64 // written by the loop (release)
	head   *uint64 // written by the consumer (release)
	pos    uint64  // local copy of *head

	// pool is the Pool the ring belongs to, nil for a Decoder: Conn
	// handles carry it, and a final event frees its connection's slot.
	pool *Pool
	// base is the global slot of the loop's slot 0 (its shard's; 0 for
	// a Decoder): the loop numbers its own slots from 0.
	base uint32
	// onEvent is the Pool's Config.OnEvent: the non-data events of the
	// pumps that take a DataFunc go to it (nil: consumed silently).
	onEvent EventFunc
	// err is a Decoder's sticky error: the first EventClose, or the
	// latest EventError, seen by a data consume (pool == nil only).
	err error

	// stamps parallels events: the stage stamps of events flagged
	// TL_EVF_STAMPED (nil when sampling is off); rec records them (set
	// whenever stamps is).
	stamps []C.struct_tl_stamp
	rec    *metricsRecorder
}

// newEvConsumer maps the loop's event ring.
func newEvConsumer(l *C.struct_tl_loop, pool *Pool) evConsumer {
	evr := C.tl_loop_evring(l)
	r := evConsumer{events: unsafe.Slice(evr.ev, int(evr.size)), mask: uint64(evr.mask),
		tail: (*uint64)(unsafe.Pointer(&evr.tail)), head: (*uint64)(unsafe.Pointer(&evr.head)), pool: pool}
	if evr.stamps != nil {
		r.stamps = unsafe.Slice(evr.stamps, int(evr.size))
	}
	return r
}

// nanotime is the runtime's monotonic clock: clock_gettime(CLOCK_MONOTONIC)
// through the vDSO on Linux, the clock the C loop stamps with. No syscall,
// no cgo call.
//
//go:linkname nanotime runtime.nanotime
func nanotime() int64

// stampsAt returns the loop's stamps of the event at ring index idx with
// the callback stamp taken now.
func (r *evConsumer) stampsAt(idx uint64) Stamps {
	s := &r.stamps[idx]
	return Stamps{CQE: int64(s.cqe), Plaintext: int64(s.plaintext), Publish: int64(s.publish),
		Wire: int64(s.wire), Callback: nanotime()}
}

// record folds a sampled message's stamps into the histograms.
func (r *evConsumer) record(st *Stamps) {
	r.rec.record(st.CQE, st.Plaintext, st.Publish, st.Callback, st.Wire)
}

// dataSampled calls fd for a sampled message and records its stamps. Kept
// out of consume's loop: sampled messages are the rare case.
//
//go:noinline
func (r *evConsumer) dataSampled(idx uint64, c Conn, op Opcode, payload []byte, fd DataFunc) {
	st := r.stampsAt(idx)
	fd(c, op, payload)
	r.record(&st)
}

// eventSampled is dataSampled for Pump's EventFunc.
//
//go:noinline
func (r *evConsumer) eventSampled(idx uint64, c Conn, ev Event, fe EventFunc) {
	st := r.stampsAt(idx)
	fe(c, ev)
	r.record(&st)
}

// loadTail returns the events published so far (acquire).
func (r *evConsumer) loadTail() uint64 { return atomic.LoadUint64(r.tail) }

// consume hands events [pos, tail) to fd (data messages only) or fe (every
// event), then releases them all with one store of head (a batch longer
// than releaseEvery also every releaseEvery events). It returns the
// number of callbacks made.
//
// Exactly one of fe, fd and fs is non-nil; fs is PumpStamped's callback.
// Events flagged TL_EVF_STAMPED (sampled messages) take a cold path that
// stamps the callback and records the stamps; a pool with a Logger logs
// its lifecycle events (never a data event).
func (r *evConsumer) consume(tail uint64, fe EventFunc, fd DataFunc, fs StampedFunc) int {
	n := 0
	for i := r.pos; i != tail; {
		// The next release point: a multiple of releaseEvery, or tail.
		stop := (i + releaseEvery) &^ (releaseEvery - 1)
		if stop-r.pos > tail-r.pos {
			stop = tail
		}
		if fd != nil {
			n += r.dataRun(i, stop, fd)
		} else {
			for j := i; j != stop; j++ {
				n += r.one(j, fe, nil, fs)
			}
		}
		i = stop
		if i != tail {
			// A long batch gives its first part back early: an awake
			// loop can resume a connection held at its share of the ring
			// (Config.MaxConnPendingEvents) while the rest is still being
			// handed out, so loop and pump keep working at once. (A
			// sleeping loop is woken once, when the batch ends.)
			atomic.StoreUint64(r.head, i)
		}
	}
	r.pos = tail
	atomic.StoreUint64(r.head, tail)
	return n
}

// dataRun hands events [i, stop) to the DataFunc fd (PumpData, PumpSpin,
// PumpNowait, Decoder) and returns the callbacks made. The per-message
// path: a data event without flags goes straight to fd (one load of the
// record, two compares, the call: no bounds check, no stamp or logger
// test); anything else - control and lifecycle events, a sampled message,
// a final event - goes through one, the general path.
func (r *evConsumer) dataRun(i, stop uint64, fd DataFunc) int {
	n := 0
	// Locals: the callback could write *r.
	evs, mask, pool, base := unsafe.Pointer(unsafe.SliceData(r.events)), r.mask, r.pool, r.base
	for ; i != stop; i++ {
		// i&mask < len(r.events) (mask = len-1, a power of two): the
		// record is read without the bounds check an index would cost.
		e := (*C.struct_tl_event)(unsafe.Add(evs, uintptr(i&mask)*unsafe.Sizeof(C.struct_tl_event{})))
		// kind and flags together (adjacent bytes: the compiler makes it
		// one load on little-endian targets): anything but text or binary
		// without flags is out of range.
		kf := (uint16(e.kind) | uint16(e.flags)<<8) - C.TL_EV_TEXT
		if kf > C.TL_EV_BINARY-C.TL_EV_TEXT {
			n += r.one(i, nil, fd, nil)
			continue
		}
		var c Conn // a Decoder's callbacks get the zero Conn
		if pool != nil {
			c = Conn{p: pool, slot: uint32(e.slot) + base, gen: uint32(e.gen)}
		}
		var payload []byte
		if e.len != 0 {
			// The loop's pointer and length, as a slice without
			// unsafe.Slice's overflow and nil checks (neither can fail).
			payload = *(*[]byte)(unsafe.Pointer(&sliceHeader{unsafe.Pointer(e.ptr), int(e.len), int(e.len)}))
		}
		fd(c, Opcode(kf)+OpText, payload)
		n++
	}
	return n
}

// sliceHeader is a []byte's layout (dataRun builds payloads with it).
type sliceHeader struct {
	data     unsafe.Pointer
	len, cap int
}

// one hands event i to fd (data messages only), fe (every event) or fs
// (PumpStamped: data messages with their stamps) and returns the callbacks
// made (0 or 1). Every kind of event, flags included: the general path of
// consume and dataRun.
func (r *evConsumer) one(i uint64, fe EventFunc, fd DataFunc, fs StampedFunc) int {
	n := 0
	pool := r.pool
	e := &r.events[i&r.mask]
	slot := uint32(e.slot) + r.base
	var c Conn // a Decoder's callbacks get the zero Conn
	if pool != nil {
		c = Conn{p: pool, slot: slot, gen: uint32(e.gen)}
	}
	var payload []byte
	if e.len != 0 {
		payload = unsafe.Slice((*byte)(unsafe.Pointer(e.ptr)), int(e.len))
	}
	kind := EventKind(e.kind)
	if kind == EventText || kind == EventBinary {
		switch {
		case fd != nil:
			if e.flags&C.TL_EVF_STAMPED == 0 {
				fd(c, Opcode(kind-EventText)+OpText, payload)
			} else {
				r.dataSampled(i&r.mask, c, Opcode(kind-EventText)+OpText, payload, fd)
			}
		case fs != nil:
			var st Stamps
			if e.flags&C.TL_EVF_STAMPED != 0 {
				st = r.stampsAt(i & r.mask)
			}
			fs(c, Opcode(kind-EventText)+OpText, payload, st)
			if st.CQE != 0 {
				r.record(&st)
			}
		default:
			ev := Event{Kind: kind, Payload: payload}
			if e.flags&C.TL_EVF_STAMPED == 0 {
				fe(c, ev)
			} else {
				r.eventSampled(i&r.mask, c, ev, fe)
			}
		}
		n++
	} else if pool == nil {
		if fe != nil {
			fe(c, r.event(e, slot, kind, payload))
			n++
		} else {
			r.noteEnd(e, kind, payload)
		}
	} else if quiet := pool.quietEvent(e, slot, kind); (pool.cfg.Logger != nil) || (!quiet && (fe != nil || r.onEvent != nil)) {
		// A quiet event (a failed synchronous Dial) is still logged.
		ev := r.event(e, slot, kind, payload)
		if pool.cfg.Logger != nil {
			if pool.pumping.Load() == pumpReaping {
				pool.deferLog(c, &ev, payload) // no user code under reapQuiet's claim
			} else {
				pool.logEvent(c, &ev, payload)
			}
		}
		switch {
		case quiet: // Dial returned this error; the caller never had the Conn
		case fe != nil:
			fe(c, ev)
			n++
		case r.onEvent != nil:
			r.onEvent(c, ev)
			n++
		}
	}
	if pool != nil && e.flags&C.TL_EVF_FINAL != 0 {
		pool.nconns.Add(-1)
		pool.unref(slot)
	}
	return n
}

// logEvent logs a lifecycle event (Config.Logger). Cold path: non-data
// events only.
//
//go:noinline
func (p *Pool) logEvent(c Conn, ev *Event, payload []byte) {
	p.logRecord(c, ev, reconnectAttempt(payload))
}

// logRecord logs ev; attempt is an EventReconnecting's attempt number.
func (p *Pool) logRecord(c Conn, ev *Event, attempt int) {
	switch ev.Kind {
	case EventOpen, EventClose, EventError:
		logLifecycle(p.cfg.Logger, p.cfg.Name, c, ev)
	case EventReconnecting:
		logReconnecting(p.cfg.Logger, p.cfg.Name, c, ev.Err, ev.Delay, attempt)
	}
}

// event builds the Event of a non-data record of global slot slot (the
// cold path: an EventError's Err is built here).
func (r *evConsumer) event(e *C.struct_tl_event, slot uint32, kind EventKind, payload []byte) Event {
	ev := Event{Kind: kind, Payload: payload}
	switch kind {
	case EventClose:
		ev.Code = int(e.code)
		ev.Reason = payload
		ev.Payload = nil
	case EventError:
		ev.Code = int(e.code)
		ev.Err = makeErr(int32(e.err), int32(e.aux), int(e.code), string(payload))
		if r.pool != nil && int32(e.err) == cErrHTTP {
			ev.Err = r.pool.handshakeErr(slot, uint32(e.gen), ev.Err)
		}
		ev.Payload = nil
	case EventOpen:
		ev.Reconnects = int(e.aux)
	case EventReconnecting:
		reconnectingEvent(&ev, e, payload)
	}
	return ev
}

// reconnectingEvent fills ev from an EventReconnecting record. The
// payload is the delay (uint64), the number of the attempt that follows
// counted since the last open (uint32) and 4 zero bytes, host order, then
// the error detail or, when the server closed (err 0), its close reason.
// Err is a plain ConnError even for a refused upgrade: the loop still owns
// the slot, so the response it kept cannot be read (HandshakeError comes
// with the final EventError). Cold path.
func reconnectingEvent(ev *Event, e *C.struct_tl_event, payload []byte) {
	ev.Payload = nil
	ev.Code = int(e.code)
	if len(payload) < 16 {
		ev.Err = &ConnError{Cause: errInternal, Detail: "short reconnecting event"}
		return
	}
	ev.Delay = time.Duration(binary.NativeEndian.Uint64(payload))
	rest := payload[16:]
	if e.err == 0 {
		ev.Reason = rest
		ev.Err = &ConnError{Cause: ErrClosed, Code: int(e.code), Detail: "the server closed the connection"}
		return
	}
	ev.Err = makeErr(int32(e.err), int32(e.aux), int(e.code), string(rest))
}

// reconnectAttempt returns the attempt number an EventReconnecting payload
// carries (for Config.Logger).
func reconnectAttempt(payload []byte) int {
	if len(payload) < 16 {
		return 0
	}
	return int(binary.NativeEndian.Uint32(payload[8:]))
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

// noteEnd records a Decoder's sticky error from an EventError (the latest
// wins) or EventClose (unless an error came first). Kept out of consume's
// loop: it is the cold path.
func (r *evConsumer) noteEnd(e *C.struct_tl_event, kind EventKind, payload []byte) {
	switch kind {
	case EventError:
		r.err = makeErr(int32(e.err), int32(e.aux), int(e.code), string(payload))
	case EventClose:
		if r.err == nil {
			r.err = &ConnError{Cause: ErrClosed, Code: int(e.code), Detail: "close frame received"}
		}
	}
}

// dispatch consumes the shard's events up to tail and wakes its loop if
// it waits for the room just released.
func (sh *shard) dispatch(tail uint64, fe EventFunc, fd DataFunc, fs StampedFunc) int {
	n := sh.ev.consume(tail, fe, fd, fs)
	sh.wakeForSpace()
	return n
}

// dispatchAll passes over the loops once, in order, dispatching each one's
// pending events (each batch released by its own head store). With several
// loops it takes at most passShare events of each per pass: a connection
// alone on its loop is never held there (conn_held: counting is per loop),
// so its flood may fill that loop's whole ring, and without the cap a
// message on another loop would wait behind all of it. With the cap it
// waits behind at most one share (Config.MaxConnPendingEvents) of each
// other loop, as it would behind a flood on its own loop. It returns the
// callbacks made and whether any loop had events. It stops early once a
// callback closed the pool: the other loops' events are dropped with their
// connections.
func (p *Pool) dispatchAll(fe EventFunc, fd DataFunc, fs StampedFunc) (int, bool) {
	n, saw := 0, false
	for _, sh := range p.shards {
		if tail := sh.ev.loadTail(); tail != sh.ev.pos {
			saw = true
			if len(p.shards) > 1 && tail-sh.ev.pos > p.passShare {
				tail = sh.ev.pos + p.passShare
			}
			n += sh.dispatch(tail, fe, fd, fs)
			if p.closed.Load() {
				break
			}
		}
	}
	return n, saw
}

// idle reports whether no loop has events pending.
func (p *Pool) idle() bool {
	for _, sh := range p.shards {
		if sh.ev.loadTail() != sh.ev.pos {
			return false
		}
	}
	return true
}

// releaseEvery is how many events of a batch consume passes before it
// releases them (one store of head), a power of two: one store per this
// many events, and a held connection waits for at most this many.
const releaseEvery = 256

// wakeForSpace wakes the loop when it sleeps waiting for the room just
// released (loop_wants_space: a stalled or held connection).
func (sh *shard) wakeForSpace() {
	if atomic.LoadUint32(sh.wantsSpace) != 0 && atomic.CompareAndSwapUint32(sh.wantsSpace, 1, 0) {
		sh.wakeLoop()
	}
}

// enterPump claims the pool for one pumping goroutine.
func (p *Pool) enterPump() error {
	if p.drained == nil {
		return ErrPoolClosed // a zero Pool, not made by NewPool
	}
	for !p.pumping.CompareAndSwap(0, 1) {
		switch p.pumping.Load() {
		case 0:
			continue // released meanwhile
		case pumpReaping:
			// A failed Dial passing its quiet events: microseconds. No new
			// reaper starts meanwhile (reapQuiet leaves the events to this
			// pump call), so failing Dials in a loop cannot starve it.
			p.pumpWaiting.Store(true)
			osYield()
			continue
		case 2:
			return ErrPoolClosed
		}
		p.pumpWaiting.Store(false)
		if p.closed.Load() {
			return ErrPoolClosed
		}
		return ErrConcurrentPump
	}
	p.pumpWaiting.Store(false)
	return nil
}

// pumpReaping is the pump claim of reapQuiet (0 free, 1 a pump call, 2
// freed at Close).
const pumpReaping = 3

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
		if p.pumping.CompareAndSwap(0, pumpReaping) {
			break
		}
		if c := p.pumping.Load(); c != pumpReaping && c != 0 || passed() {
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

// leavePump publishes the samples the pump call recorded (so Metrics is
// exact whenever no pump call runs), gives the claim back and, after
// Close, frees the loop.
func (p *Pool) leavePump() {
	if p.rec != nil {
		p.rec.flush()
	}
	p.pumping.Store(0)
	if p.closed.Load() {
		p.release()
	}
}

// closedErr is ErrPoolClosed once Close ran (a callback may have called
// it: the pump returns what it delivered and this error), else nil.
func (p *Pool) closedErr() error {
	if p.closed.Load() {
		return ErrPoolClosed
	}
	return nil
}

// pumpBlocking dispatches at least one callback-worthy batch, sleeping
// when the ring is empty. How long it spins first is ConsumerWait's:
// never (WaitBlock), always (WaitSpin), SpinTime (WaitSpinThenBlock), or
// SpinTime only while the previous wait ended within SpinTime
// (WaitAdaptive: spinning pays only while events come close together).
func (p *Pool) pumpBlocking(fe EventFunc, fd DataFunc, fs StampedFunc) (int, error) {
	if err := p.enterPump(); err != nil {
		return 0, err
	}
	defer p.leavePump()
	if p.cfg.InlineLoop {
		return p.pumpInline(fe, fd, fs, C.TL_INLINE_BLOCK, -1)
	}
	var spinFor time.Duration
	switch p.cfg.ConsumerWait {
	case WaitSpinThenBlock:
		spinFor = p.cfg.SpinTime
	case WaitAdaptive:
		if p.lastWait <= p.cfg.SpinTime {
			spinFor = p.cfg.SpinTime
		}
	}
	var replyUntil int64 // nanotime the reply spin ends (0: none)
	if p.pumpReply {
		replyUntil = p.replySpinUntil()
	}
	var start time.Time // when the ring was first found empty
	var spinFrom time.Time
	for {
		for i := 0; ; i++ {
			if p.closed.Load() {
				return 0, ErrPoolClosed
			}
			var sent int64 // the send these events may answer (not one a callback makes)
			if p.pumpReply {
				sent = p.lastSend.Load()
			}
			if n, saw := p.dispatchAll(fe, fd, fs); saw {
				if n > 0 {
					p.lastWait = 0 // events were waiting: traffic is dense
					if !start.IsZero() {
						p.lastWait = time.Since(start)
					}
					if sent != p.answered {
						p.noteAnswer(sent)
					}
					return n, p.closedErr()
				}
				i = 0
				continue
			}
			if fd != nil && p.nconns.Load() == 0 {
				// Nothing pending and no connection left to deliver
				// anything: the last final event was just consumed (it
				// woke us), or there never was one.
				return 0, ErrNoConns
			}
			if p.cfg.ConsumerWait == WaitSpin {
				if i&255 == 255 {
					runtime.Gosched()
				}
				continue
			}
			if i&63 == 0 {
				if start.IsZero() {
					start = time.Now()
					spinFrom = start
					if replyUntil != 0 {
						p.replySpins.Add(1)
					}
				}
				if time.Since(spinFrom) >= spinFor {
					if replyUntil == 0 || nanotime() >= replyUntil {
						if replyUntil != 0 {
							p.replyLate = true // the answer did not come in time
							p.replyLates.Add(1)
							replyUntil = 0
						}
						break
					}
				}
				if i != 0 && p.cfg.ConsumerWait == WaitAdaptive {
					// Let the loop thread run if it waits for this CPU
					// (a busy machine): it is what we spin for.
					osYield()
				}
			}
		}
		// Sleep: announce, recheck, then wait on the futex word. Samples
		// go out first: Metrics must not wait for the next message.
		if p.rec != nil {
			p.rec.flush()
		}
		spinFor = 0 // after a sleep, look once per wake-up
		// Pass through Go's scheduler now and then (pumpsched.go): a
		// goroutine that only ever sleeps in syscalls keeps sysmon awake.
		now := nanotime()
		if p.sched.beforeSleep(now) {
			continue // the rings, once more, before the sleep
		}
		if p.bellEp >= 0 && now-p.lastDirect.Load() < int64(bellWindow) {
			if p.sleepBell() {
				// A socket rang: its data woke us while it wakes the
				// loop, which will publish it shortly; spin for that
				// (yielding: the loop may be woken on this very CPU)
				// rather than sleep into a second wake-up.
				spinFor, spinFrom = bellSpinTimes*p.cfg.SpinTime, time.Now()
			}
			continue
		}
		p.sleep()
	}
}

// replySpinUntil is when the pump's reply spin (Config.ReplySpin) ends:
// ReplySpin after the latest send while that send is unanswered and
// answers have been coming in time; 0 when there is nothing to spin for.
// Spinning then spares the answer a wake-up of the pump (on a machine
// whose idle CPUs halt, tens of microseconds); it yields as it goes, and
// the loop spins for the answer's completion the same way (loop.c,
// reply_spin).
func (p *Pool) replySpinUntil() int64 {
	ls := p.lastSend.Load()
	if ls == 0 || ls == p.answered || p.replyLate {
		return 0
	}
	return ls + p.replySpin
}

// noteAnswer runs when the pump delivers events after a send it has not
// yet seen answered (sent, loaded before the callbacks ran, so a send they
// make waits for its own answer): an answer within ReplySpin of its send
// turns the reply spin (back) on, a later one leaves it off.
func (p *Pool) noteAnswer(sent int64) {
	p.answered = sent
	p.replyLate = nanotime()-sent > p.replySpin
}

// sleepBell is sleep on the doorbell (Config.ReplyDoorbell), taken for
// a while after a direct send, when a reply is likely: the pump waits in
// epoll on the sockets it sent on and on bellEfd, which every loop writes
// instead of the futex while cons_sleeping is 2. The reply's data then
// wakes this thread and the loop thread at once, instead of the loop's
// publish waking it after the loop has run: on a machine whose idle CPUs
// halt, the two wake-ups overlap rather than add up. Dekker per loop as in
// sleep (cons_sleeping 2, then the tail). It reports whether a socket
// (not the eventfd) woke it. A stale edge (data the loop already
// published while we were awake) only makes one spurious round.
func (p *Pool) sleepBell() bool {
	for _, sh := range p.shards {
		atomic.StoreUint32(sh.consSleeping, 2)
	}
	rang := false
	if p.idle() && !p.closed.Load() {
		atomic.AddUint64((*uint64)(unsafe.Pointer(&p.shards[0].cstats.pump_sleeps)), 1)
		n, _ := unix.EpollWait(p.bellEp, p.bellEvents[:], 100)
		p.bellSleeps.Add(1)
		for i := 0; i < n; i++ {
			if int(p.bellEvents[i].Fd) != p.bellEfd {
				rang = true
			}
		}
		if rang {
			p.bellRings.Add(1)
		}
	}
	for _, sh := range p.shards {
		atomic.StoreUint32(sh.consSleeping, 0)
	}
	return rang
}

// sleep waits until a loop publishes events (or Close, or 100 ms): it
// announces on every loop's ring (cons_sleeping), rechecks them all, then
// waits on their wake words at once, each loop's wake bumping its own
// (one futex with one loop; futex_waitv over all with several, so nothing
// in the C loop changes). Dekker per loop: our store of cons_sleeping,
// then the load of its tail; its store of the tail, then the load of
// cons_sleeping.
func (p *Pool) sleep() {
	if len(p.shards) == 1 {
		sh := p.shards[0]
		seq := atomic.LoadUint32(sh.wakeSeq)
		atomic.StoreUint32(sh.consSleeping, 1)
		if sh.ev.loadTail() == sh.ev.pos && !p.closed.Load() {
			atomic.AddUint64((*uint64)(unsafe.Pointer(&sh.cstats.pump_sleeps)), 1)
			futexWait(sh.wakeSeq, seq, 100*time.Millisecond)
		}
		atomic.StoreUint32(sh.consSleeping, 0)
		return
	}
	for i, sh := range p.shards {
		p.waitv[i].val = uint64(atomic.LoadUint32(sh.wakeSeq))
		atomic.StoreUint32(sh.consSleeping, 1)
	}
	if p.idle() && !p.closed.Load() {
		atomic.AddUint64((*uint64)(unsafe.Pointer(&p.shards[0].cstats.pump_sleeps)), 1)
		futexWaitAny(p.waitv, 100*time.Millisecond)
	}
	for _, sh := range p.shards {
		atomic.StoreUint32(sh.consSleeping, 0)
	}
}

// pumpOnce polls the ring up to iters times and dispatches the first
// batch found.
func (p *Pool) pumpOnce(fd DataFunc, fe EventFunc, iters int) (int, error) {
	if err := p.enterPump(); err != nil {
		return 0, err
	}
	defer p.leavePump()
	if p.cfg.InlineLoop {
		return p.pumpInline(fe, fd, nil, C.TL_INLINE_NOWAIT, iters)
	}
	for i := 0; i < iters; i++ {
		if n, saw := p.dispatchAll(fe, fd, nil); saw {
			return n, p.closedErr()
		}
		if p.closed.Load() {
			return 0, ErrPoolClosed
		}
	}
	return 0, nil
}

// pumpInline is the pumps of an inline loop (Config.InlineLoop): it
// dispatches what the loop published and, when nothing is pending, runs
// the loop itself on this goroutine's thread - one cgo call, which returns
// once it published events (mode TL_INLINE_BLOCK: after waiting in the
// kernel as long as there is nothing to do) or after one iteration
// (TL_INLINE_NOWAIT, at most iters times; iters < 0: no limit). The
// events themselves are dispatched as with a loop thread: no cgo call per
// message, one per batch. The caller holds the pump claim.
func (p *Pool) pumpInline(fe EventFunc, fd DataFunc, fs StampedFunc, mode C.int, iters int) (int, error) {
	loop := p.shards[0].loop
	for i := 0; iters < 0 || i <= iters; i++ {
		if p.closed.Load() {
			return 0, ErrPoolClosed
		}
		if n, saw := p.dispatchAll(fe, fd, fs); saw {
			if n > 0 || mode == C.TL_INLINE_NOWAIT {
				return n, p.closedErr()
			}
			continue
		}
		if mode == C.TL_INLINE_BLOCK && fd != nil && p.nconns.Load() == 0 {
			if C.tl_loop_inline_owner(loop) == 0 {
				return 0, ErrNotLoopThread // (the cold path: the drive below says it otherwise)
			}
			return 0, ErrNoConns
		}
		if i == iters {
			break
		}
		if mode == C.TL_INLINE_BLOCK && p.rec != nil {
			p.rec.flush() // Metrics must not wait for the next message
		}
		switch rc := C.tl_loop_inline_run(loop, mode); {
		case rc == -C.EPERM:
			return 0, ErrNotLoopThread
		case rc < 0 || rc == C.TL_INLINE_STOPPED:
			// Stopped: Close ran (from another goroutine, which marked
			// the loop dead, or a stop request this call finished).
			// What it published is dropped with the pool.
			if p.closed.Load() {
				return 0, ErrPoolClosed
			}
			return 0, ErrNotLoopThread
		}
	}
	return 0, nil
}

// pumpStamped is PumpStamped.
func (p *Pool) pumpStamped(fs StampedFunc) (int, error) { return p.pumpBlocking(nil, nil, fs) }

// testhook's Origin* values mirror TL_ORIGIN_* (talaris.h): a negative
// array length fails to compile unless the two sides are equal.
type (
	_ [C.TL_ORIGIN_ARENA - testhook.OriginArena]byte
	_ [testhook.OriginArena - C.TL_ORIGIN_ARENA]byte
	_ [C.TL_ORIGIN_SLOT - testhook.OriginSlot]byte
	_ [testhook.OriginSlot - C.TL_ORIGIN_SLOT]byte
	_ [C.TL_ORIGIN_PLAINTEXT - testhook.OriginPlaintext]byte
	_ [testhook.OriginPlaintext - C.TL_ORIGIN_PLAINTEXT]byte
)

func init() {
	testhook.PumpClaim = func(p any) int32 { return p.(*Pool).pumping.Load() }
	testhook.OwnGCM = func() bool { return C.tl_gcm_supported() != 0 }
	testhook.ConnLoop = func(p any, slot int) int {
		pool := p.(*Pool)
		return slices.Index(pool.shards, pool.shardOf[slot])
	}
	testhook.PayloadOrigin = func(p any, b []byte) int {
		if len(b) == 0 {
			return testhook.OriginOther
		}
		for _, sh := range p.(*Pool).shards {
			if o := int(C.tl_loop_payload_origin(sh.loop, unsafe.Pointer(&b[0]))); o != testhook.OriginOther {
				return o
			}
		}
		return testhook.OriginOther
	}
}
