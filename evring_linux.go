//go:build linux && cgo

package talaris

// The consumer side of the C->Go event ring, shared by Pool and the synchronous decoder (decoder.go):
// acquire-load the tail, hand events [pos, tail) to the callbacks, then
// release the whole batch (and the arena bytes and receive slots its
// payloads point into) with one store of head.

/*
#include <errno.h>
#include "csrc/talaris.h"
#include "csrc/crypto/gcm.h"
*/
import "C"

import (
	"encoding/binary"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/talaris-go/talaris/internal/testhook"
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

	// pool is the Pool the ring belongs to, nil for the decoder: Conn
	// handles carry it, and a final event frees its connection's slot.
	pool *Pool
	// base is the global slot of the loop's slot 0 (its shard's; 0 for
	// the decoder): the loop numbers its own slots from 0.
	base uint32
	// onEvent is the Pool's Config.OnEvent: the non-data events of the
	// pumps that take a DataFunc go to it (nil: consumed silently).
	onEvent EventFunc
	// err is the decoder's sticky error: the first EventClose, or the
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
		wire: int64(s.wire), Callback: nanotime()}
}

// record folds a sampled message's stamps into the histograms.
func (r *evConsumer) record(st *Stamps) {
	r.rec.record(st.CQE, st.Plaintext, st.Publish, st.Callback, st.wire)
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

// releaseEvery is how many events of a batch consume passes before it
// releases them (one store of head), a power of two: one store per this
// many events, and a held connection waits for at most this many.
const releaseEvery = 256

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
			// (testhook.Knobs.MaxConnPendingEvents) while the rest is still being
			// handed out, so loop and pump keep working at once. (A
			// sleeping loop is woken once, when the batch ends.)
			atomic.StoreUint64(r.head, i)
		}
	}
	r.pos = tail
	atomic.StoreUint64(r.head, tail)
	return n
}

// dataRun hands events [i, stop) to the DataFunc fd (PumpData,
// PumpDataNowait, the decoder) and returns the callbacks made. The per-message
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
		var c Conn // the decoder's callbacks get the zero Conn
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
	var c Conn // the decoder's callbacks get the zero Conn
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
		pool.uncount(slot, uint32(e.gen))
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
	if r.pool != nil && ev.Err != nil {
		ev.Err = proxyErr(ev.Err, r.pool.proxyOf(slot, uint32(e.gen)))
	}
	if r.pool != nil && (kind == EventClose || kind == EventError || kind == EventReconnecting) {
		if ev.SendDropped = r.pool.dropsSince(slot); ev.SendDropped != 0 {
			ev.Err = withDropped(ev.Err, ev.SendDropped)
		}
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

// noteEnd records the decoder's sticky error from an EventError (the latest
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
