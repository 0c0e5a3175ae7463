//go:build linux && cgo

package talaris

// The producer side of the Go->C command ring: 16-byte-aligned records
// (a struct tl_cmd header and an inline payload) that Go appends under
// Pool.sendMu and the loop drains. Go is the only producer, so the ring
// stays single-producer even though any goroutine may send.

/*
#include "csrc/talaris.h"
*/
import "C"

import (
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"
)

// Record flags and the header size (TL_CMDF_* and sizeof(struct tl_cmd)).
const (
	cmdfFin    = 0x10 // with cmdSend: the last fragment of a message
	cmdfCont   = 0x20 // with cmdSend: a continuation fragment
	cmdfMemory = 0x1  // with cmdDial: a socketless connection fed by cmdInject
	// with cmdClose: abort the connection only if it has not opened yet
	// (Dial's context ended; an open connection is Dial's result).
	cmdfIfDialing = 0x2

	cmdHdr = 16
)

// The header must be struct tl_cmd's size (see cgo_linux.go for the
// trick). The op and flag values mirror csrc/ring.h by number: the C side
// keeps them stable as part of the ring's layout.
type (
	_ [unsafe.Sizeof(C.struct_tl_cmd{}) - cmdHdr]byte
	_ [cmdHdr - unsafe.Sizeof(C.struct_tl_cmd{})]byte
)

// maxRecord is the largest payload one command record carries; bigger sends
// become several fragments of one message.
func (p *Pool) maxRecord() int {
	return int(p.cmdSize / 4)
}

// reserve waits until n bytes (a whole record) fit contiguously and
// returns the offset to write at. Called with sendMu held. It waits as
// long as the loop does not consume (see Config on MaxSendQueue) and
// returns ErrPoolClosed once the pool closes.
func (p *Pool) reserve(n uint64) (uint64, error) {
	spins := 0
	for {
		if p.closed.Load() {
			return 0, ErrPoolClosed
		}
		off := p.tail & (p.cmdSize - 1)
		pad := uint64(0)
		if off+n > p.cmdSize {
			pad = p.cmdSize - off
		}
		if p.tail+pad+n-p.headCache <= p.cmdSize {
			if pad > 0 {
				h := (*C.struct_tl_cmd)(unsafe.Pointer(&p.cmdBuf[off]))
				*h = C.struct_tl_cmd{len: C.uint32_t(pad - cmdHdr), op: cmdPad}
				p.tail += pad
				off = 0
			}
			return off, nil
		}
		p.headCache = atomic.LoadUint64(p.cmdHead)
		if p.tail+pad+n-p.headCache <= p.cmdSize {
			continue
		}
		// The loop is behind (or waits for a socket): let it run.
		p.kick()
		spins++
		if spins < 64 {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
}

// publish makes records up to p.tail visible and wakes the loop if it
// announced that it sleeps.
func (p *Pool) publish() {
	atomic.StoreUint64(p.cmdTail, p.tail)
	p.kick()
}

// kick wakes the loop if it announced that it sleeps.
func (p *Pool) kick() {
	if atomic.LoadUint32(p.loopSleeping) != 0 && atomic.CompareAndSwapUint32(p.loopSleeping, 1, 0) {
		p.wakeLoop()
	}
}

// putRecord appends one record without publishing it. Called with sendMu
// held.
func (p *Pool) putRecord(op, flags uint8, code uint16, slot, gen uint32, payload []byte) error {
	n := cmdHdr + (uint64(len(payload))+15)&^15
	off, err := p.reserve(n)
	if err != nil {
		return err
	}
	h := (*C.struct_tl_cmd)(unsafe.Pointer(&p.cmdBuf[off]))
	*h = C.struct_tl_cmd{len: C.uint32_t(len(payload)), op: C.uint8_t(op), flags: C.uint8_t(flags),
		code: C.uint16_t(code), slot: C.uint32_t(slot), gen: C.uint32_t(gen)}
	copy(p.cmdBuf[off+cmdHdr:], payload)
	p.tail += n
	return nil
}

// command appends and publishes one record.
func (p *Pool) command(op, flags uint8, code uint16, slot, gen uint32, payload []byte) error {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if err := p.putRecord(op, flags, code, slot, gen, payload); err != nil {
		return err
	}
	p.publish()
	return nil
}

// send queues one data message, split into fragments of at most
// maxRecord bytes.
func (c Conn) send(op Opcode, b []byte) error {
	if !c.enter() {
		return c.endedErr()
	}
	defer c.p.exit()
	return c.putChunks(cmdSend, op, b)
}

// endedErr is the error of a call refused by enter: the zero Conn's is
// ErrClosed, a closing pool's ErrPoolClosed.
func (c Conn) endedErr() error {
	if c.p == nil {
		return ErrClosed
	}
	return ErrPoolClosed
}

// inject queues b for a memory connection in records of at most maxRecord
// bytes (the loop parses across record boundaries).
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
	return c.putChunks(cmdInject, 0, b)
}

// putChunks appends b as records of op cmd of at most maxRecord bytes,
// publishing after each so the loop can start on a large one. For cmdSend
// the records are the fragments of one message of opcode op. The caller
// is inside p.enter.
func (c Conn) putChunks(cmd uint8, op Opcode, b []byte) error {
	if !c.live() {
		return ErrClosed
	}
	p := c.p
	maxr := p.maxRecord()
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
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
		}
		if err := p.putRecord(cmd, flags, 0, c.slot, c.gen, chunk); err != nil {
			return err
		}
		b = b[len(chunk):]
		p.publish()
		if fin {
			return nil
		}
	}
}

func (c Conn) control(op uint8, b []byte) error {
	if len(b) > 125 {
		return ErrControlTooLong
	}
	if !c.enter() {
		return c.endedErr()
	}
	defer c.p.exit()
	if !c.live() {
		return ErrClosed
	}
	return c.p.command(op, 0, 0, c.slot, c.gen, b)
}

func (c Conn) abort() error {
	if !c.enter() {
		return c.endedErr()
	}
	defer c.p.exit()
	if !c.live() {
		return ErrClosed
	}
	return c.p.command(cmdAbort, 0, 0, c.slot, c.gen, nil)
}

func (c Conn) closeConn(code int, reason string) error {
	if !c.enter() {
		return c.endedErr()
	}
	defer c.p.exit()
	if !c.live() {
		return ErrClosed
	}
	return c.p.command(cmdClose, 0, uint16(code), c.slot, c.gen, []byte(reason))
}
