//go:build linux && cgo

package talaris

/*
#include "csrc/talaris.h"
*/
import "C"

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Decoder runs the C frame parser synchronously on bytes the caller
// supplies: no loop thread, socket or io_uring. Each Decode call is one cgo
// call for the whole buffer; messages reach fn through the same event ring
// and arena a Pool uses. Use it to replay captured server byte streams or to
// measure the parser. A Decoder is not safe for concurrent use.
type Decoder struct {
	l      *C.struct_tl_loop
	events []C.struct_tl_event
	mask   uint64
	tail   *uint64
	head   *uint64
	pos    uint64
	err    error
	used   C.size_t // out-parameter of tl_decoder_feed; a field so it does not escape per call
}

// NewDecoder makes a Decoder that accepts messages up to maxMessage bytes
// (0: 16 MiB).
func NewDecoder(maxMessage int) (*Decoder, error) {
	if maxMessage <= 0 {
		maxMessage = 16 << 20
	}
	arena := uint64(1 << 20)
	for arena < 2*uint64(maxMessage) {
		arena *= 2
	}
	l := C.tl_decoder_new(C.uint64_t(maxMessage), 1<<12, C.uint64_t(arena))
	if l == nil {
		return nil, fmt.Errorf("%w: decoder of %d bytes", ErrInvalidConfig, maxMessage)
	}
	evr := C.tl_loop_evring(l)
	d := &Decoder{l: l, events: unsafe.Slice(evr.ev, int(evr.size)), mask: uint64(evr.mask),
		tail: (*uint64)(unsafe.Pointer(&evr.tail)), head: (*uint64)(unsafe.Pointer(&evr.head))}
	return d, nil
}

// Decode parses b as the next bytes of a server's frame stream (frames may
// be split anywhere across calls) and calls fn for every complete data
// message; payload is valid only until fn returns. Control frames are
// validated and consumed. It returns the number of messages delivered.
// Once the stream violates RFC 6455 (or a close frame arrives) every call
// returns the same error: a *ConnError matching ErrProtocol,
// ErrInvalidUTF8, ErrMessageTooBig, or ErrClosed after a close frame.
func (d *Decoder) Decode(b []byte, fn DataFunc) (int, error) {
	if d.l == nil {
		return 0, ErrClosed
	}
	n := 0
	for d.err == nil {
		var p *C.uint8_t
		if len(b) > 0 {
			p = (*C.uint8_t)(unsafe.Pointer(&b[0]))
		}
		r := C.tl_decoder_feed(d.l, p, C.size_t(len(b)), &d.used)
		n += d.dispatch(fn)
		b = b[int(d.used):]
		if r == -2 && d.err == nil {
			d.err = ErrClosed
		}
		if r != -1 && len(b) == 0 || r == 0 {
			break
		}
	}
	return n, d.err
}

func (d *Decoder) dispatch(fn DataFunc) int {
	tail := atomic.LoadUint64(d.tail)
	n := 0
	for i := d.pos; i != tail; i++ {
		e := &d.events[i&d.mask]
		switch EventKind(e.kind) {
		case EventText, EventBinary:
			var payload []byte
			if e.len != 0 {
				payload = unsafe.Slice((*byte)(unsafe.Pointer(e.ptr)), int(e.len))
			}
			op := OpBinary
			if EventKind(e.kind) == EventText {
				op = OpText
			}
			fn(Conn{}, op, payload)
			n++
		case EventError:
			d.err = makeErr(int32(e.err), int32(e.aux), int(e.code),
				string(unsafe.Slice((*byte)(unsafe.Pointer(e.ptr)), int(e.len))))
		case EventClose:
			if d.err == nil {
				d.err = &ConnError{Cause: ErrClosed, Code: int(e.code), Detail: "close frame received"}
			}
		}
	}
	d.pos = tail
	atomic.StoreUint64(d.head, tail)
	return n
}

// Close releases the Decoder's C memory.
func (d *Decoder) Close() {
	if d.l != nil {
		C.tl_decoder_free(d.l)
		d.l = nil
	}
}
