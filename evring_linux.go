//go:build linux && cgo

package talaris

// The consumer side of the C->Go event ring, shared by Pool and Decoder:
// acquire-load the tail, hand events [pos, tail) to the callbacks, then
// release the whole batch (and the arena bytes and receive slots its
// payloads point into) with one store of head. Then the Pool's pumps.

/*
#include "csrc/talaris.h"
*/
import "C"

import (
	"encoding/binary"
	"runtime"
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

	// pool is the Pool the ring belongs to, nil for a Decoder: Conn
	// handles carry it, and a final event frees its connection's slot.
	pool *Pool
	// err is a Decoder's sticky error: the first EventClose, or the
	// latest EventError, seen by a data consume (pool == nil only).
	err error
}

// newEvConsumer maps the loop's event ring.
func newEvConsumer(l *C.struct_tl_loop, pool *Pool) evConsumer {
	evr := C.tl_loop_evring(l)
	return evConsumer{events: unsafe.Slice(evr.ev, int(evr.size)), mask: uint64(evr.mask),
		tail: (*uint64)(unsafe.Pointer(&evr.tail)), head: (*uint64)(unsafe.Pointer(&evr.head)), pool: pool}
}

// loadTail returns the events published so far (acquire).
func (r *evConsumer) loadTail() uint64 { return atomic.LoadUint64(r.tail) }

// consume hands events [pos, tail) to fd (data messages only) or fe (every
// event), then releases them all with one store of head. It returns the
// number of callbacks made.
func (r *evConsumer) consume(tail uint64, fe EventFunc, fd DataFunc) int {
	n := 0
	events, mask, pool := r.events, r.mask, r.pool // locals: the callbacks could write *r
	for i := r.pos; i != tail; i++ {
		e := &events[i&mask]
		var c Conn // a Decoder's callbacks get the zero Conn
		if pool != nil {
			c = Conn{p: pool, slot: uint32(e.slot), gen: uint32(e.gen)}
		}
		var payload []byte
		if e.len != 0 {
			payload = unsafe.Slice((*byte)(unsafe.Pointer(e.ptr)), int(e.len))
		}
		kind := EventKind(e.kind)
		if fd != nil {
			if kind == EventText {
				fd(c, OpText, payload)
				n++
			} else if kind == EventBinary {
				fd(c, OpBinary, payload)
				n++
			} else if pool == nil {
				r.noteEnd(e, kind, payload)
			}
		} else {
			ev := Event{Kind: kind, Payload: payload}
			switch kind {
			case EventClose:
				ev.Code = int(e.code)
				ev.Reason = payload
				ev.Payload = nil
			case EventError:
				ev.Code = int(e.code)
				ev.Err = makeErr(int32(e.err), int32(e.aux), int(e.code), string(payload))
				ev.Payload = nil
			case EventOpen:
				ev.Reconnects = int(e.aux)
			case EventReconnecting:
				reconnectingEvent(&ev, e, payload)
			}
			fe(c, ev)
			n++
		}
		if pool != nil && e.flags&C.TL_EVF_FINAL != 0 {
			pool.nconns.Add(-1)
			pool.unref(uint32(e.slot))
		}
	}
	r.pos = tail
	atomic.StoreUint64(r.head, tail)
	return n
}

// reconnectingEvent fills ev from an EventReconnecting record: the
// payload is the delay (8 bytes, host order) then the error detail or,
// when the server closed (err 0), its close reason. Cold path.
func reconnectingEvent(ev *Event, e *C.struct_tl_event, payload []byte) {
	ev.Payload = nil
	ev.Code = int(e.code)
	if len(payload) < 8 {
		ev.Err = &ConnError{Cause: errInternal, Detail: "short reconnecting event"}
		return
	}
	ev.Delay = time.Duration(binary.NativeEndian.Uint64(payload))
	rest := payload[8:]
	if e.err == 0 {
		ev.Reason = rest
		ev.Err = &ConnError{Cause: ErrClosed, Code: int(e.code), Detail: "the server closed the connection"}
		return
	}
	ev.Err = makeErr(int32(e.err), int32(e.aux), int(e.code), string(rest))
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

// dispatch consumes events up to tail and wakes the loop if it waits for
// the room just released.
func (p *Pool) dispatch(tail uint64, fe EventFunc, fd DataFunc) int {
	n := p.ev.consume(tail, fe, fd)
	if atomic.LoadUint32(p.wantsSpace) != 0 && atomic.CompareAndSwapUint32(p.wantsSpace, 1, 0) {
		p.wakeLoop()
	}
	return n
}

// enterPump claims the pool for one pumping goroutine.
func (p *Pool) enterPump() error {
	if !p.pumping.CompareAndSwap(0, 1) {
		if p.pumping.Load() == 2 || p.closed.Load() {
			return ErrPoolClosed
		}
		return ErrConcurrentPump
	}
	return nil
}

// leavePump gives the claim back and, after Close, frees the loop.
func (p *Pool) leavePump() {
	p.pumping.Store(0)
	if p.closed.Load() {
		p.release()
	}
}

// pumpBlocking dispatches at least one callback-worthy batch, sleeping
// when the ring is empty.
func (p *Pool) pumpBlocking(fe EventFunc, fd DataFunc) (int, error) {
	if err := p.enterPump(); err != nil {
		return 0, err
	}
	defer p.leavePump()
	spin := p.cfg.ConsumerWait != WaitBlock
	spinFor := p.cfg.SpinTime
	for {
		var start time.Time
		for i := 0; ; i++ {
			if p.closed.Load() {
				return 0, ErrPoolClosed
			}
			tail := p.ev.loadTail()
			if tail != p.ev.pos {
				if n := p.dispatch(tail, fe, fd); n > 0 {
					return n, nil
				}
				i = 0
				continue
			}
			if p.cfg.ConsumerWait == WaitSpin {
				if i&255 == 255 {
					runtime.Gosched()
				}
				continue
			}
			if !spin {
				break
			}
			if i&63 == 0 {
				if start.IsZero() {
					start = time.Now()
				} else if time.Since(start) > spinFor {
					break
				}
			}
		}
		// Sleep: announce, recheck, then wait on the futex word.
		seq := atomic.LoadUint32(p.wakeSeq)
		atomic.StoreUint32(p.consSleeping, 1)
		if p.ev.loadTail() == p.ev.pos && !p.closed.Load() {
			s := &p.cstats.pump_sleeps
			atomic.AddUint64((*uint64)(unsafe.Pointer(s)), 1)
			futexWait(p.wakeSeq, seq, 100*time.Millisecond)
		}
		atomic.StoreUint32(p.consSleeping, 0)
	}
}

// pumpOnce polls the ring up to iters times and dispatches the first
// batch found.
func (p *Pool) pumpOnce(fd DataFunc, fe EventFunc, iters int) (int, error) {
	if err := p.enterPump(); err != nil {
		return 0, err
	}
	defer p.leavePump()
	for i := 0; i < iters; i++ {
		tail := p.ev.loadTail()
		if tail != p.ev.pos {
			return p.dispatch(tail, fe, fd), nil
		}
		if p.closed.Load() {
			return 0, ErrPoolClosed
		}
	}
	return 0, nil
}

func init() {
	testhook.PumpClaim = func(p any) int32 { return p.(*Pool).pumping.Load() }
}
