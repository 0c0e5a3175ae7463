//go:build linux && cgo

package talaris

/*
#include "csrc/talaris.h"
*/
import "C"

import (
	"errors"
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
	// busy is set while decode runs: a callback's Close then only sets
	// closing, and decode frees the C memory as it returns (freeing it
	// under consume, which still reads the event ring, would crash).
	busy, closing bool
}

// errDecodeReentrant is Decode's answer when called from its own
// callback: the inner call would consume the events the outer one is
// handing out.
var errDecodeReentrant = errors.New("talaris: decoder: Decode called from its own callback")

func newDecoder(maxMessage, ringSize, arenaSize uint64) (*decoder, error) {
	l := C.tl_decoder_new(C.uint64_t(maxMessage), C.uint32_t(ringSize), C.uint64_t(arenaSize))
	if l == nil {
		return nil, fmt.Errorf("%w: decoder of %d bytes", ErrInvalidConfig, maxMessage)
	}
	d := &decoder{}
	d.l = l
	d.ev = newEvConsumer(l, nil)
	return d, nil
}

func (d *decoder) decode(b []byte, fn DataFunc) (int, error) {
	if d.l == nil || d.closing {
		return 0, ErrClosed
	}
	if d.busy {
		return 0, errDecodeReentrant
	}
	d.busy = true
	n := 0
	pinned := len(b) > 0 && d.ev.err == nil
	if pinned {
		// Every event of this call is consumed below, before the unpin.
		d.pin.Pin(&b[0])
	}
	defer d.endDecode(pinned)
	for d.ev.err == nil && !d.closing {
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
	if d.closing {
		return n, ErrClosed
	}
	return n, d.ev.err
}

// endDecode ends a decode call: unpins the caller's buffer and frees the
// C memory if a callback closed the decoder.
func (d *decoder) endDecode(pinned bool) {
	if pinned {
		d.pin.Unpin()
	}
	d.busy = false
	if d.closing {
		d.closing = false
		d.close()
	}
}

func (d *decoder) close() {
	if d.busy {
		d.closing = true // decode frees it as it returns
		return
	}
	if d.l != nil {
		C.tl_decoder_free(d.l)
		d.l = nil
	}
}
