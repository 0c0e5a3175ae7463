//go:build linux && cgo

package talaris

/*
#include "csrc/talaris.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

type decoder struct {
	l    *C.struct_tl_loop
	ev   evConsumer // pool nil: ev.err is the sticky error
	used C.size_t   // out-parameter of tl_decoder_feed; a field so it does not escape per call
	// pin keeps the caller's buffer in place while events point into it:
	// tl_decoder_feed delivers whole frames in place (no arena copy), so
	// the event ring (C memory) holds pointers into b until decode has
	// consumed them, which cgo allows only for pinned memory.
	pin runtime.Pinner
}

func newDecoder(maxMessage, ringSize, arenaSize uint64) (*Decoder, error) {
	l := C.tl_decoder_new(C.uint64_t(maxMessage), C.uint32_t(ringSize), C.uint64_t(arenaSize))
	if l == nil {
		return nil, fmt.Errorf("%w: decoder of %d bytes", ErrInvalidConfig, maxMessage)
	}
	d := &Decoder{}
	d.l = l
	d.ev = newEvConsumer(l, nil)
	return d, nil
}

func (d *Decoder) decode(b []byte, fn DataFunc) (int, error) {
	if d.l == nil {
		return 0, ErrClosed
	}
	n := 0
	if len(b) > 0 && d.ev.err == nil {
		// Every event of this call is consumed below, before the unpin.
		d.pin.Pin(&b[0])
		defer d.pin.Unpin()
	}
	for d.ev.err == nil {
		var p *C.uint8_t
		if len(b) > 0 {
			p = (*C.uint8_t)(unsafe.Pointer(&b[0]))
		}
		r := C.tl_decoder_feed(d.l, p, C.size_t(len(b)), &d.used)
		n += d.ev.consume(d.ev.loadTail(), nil, fn, nil)
		b = b[int(d.used):]
		if r == -2 && d.ev.err == nil {
			d.ev.err = ErrClosed
		}
		if r != -1 && len(b) == 0 || r == 0 {
			break
		}
	}
	return n, d.ev.err
}

func (d *Decoder) close() {
	if d.l != nil {
		C.tl_decoder_free(d.l)
		d.l = nil
	}
}
