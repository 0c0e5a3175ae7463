//go:build linux && cgo

package talaris

// Metrics' gauges (ConnsOpen, SendQueuedBytes, SendQueuedMessages, Conns):
// a scan of the connection slots when a snapshot is taken, and the
// per-slot DialOptions.Label they are grouped by.

/*
#include "csrc/talaris.h"
*/
import "C"

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

// connLabels is what the gauge scan keeps per slot beside the loop's
// public block: the label of the dial that took the slot.
type connLabels struct {
	once  sync.Once
	slots []atomic.Pointer[slotLabel] // per slot; made on first use
}

// slotLabel is one dial's label (often ""), stamped with the generation
// of the slot it was stored for. prepare stores it after allocSlot has
// reset the slot's send admission, so a scan that finds the slot's
// current generation here reads txAcc as the new connection's. Immutable
// once stored.
type slotLabel struct {
	gen   uint32
	label string
	proxy string // DialOptions.Proxy's URL (password removed), "" when direct
}

// proxyOf returns the proxy slot's connection of generation gen dials
// through ("" when direct): what ProxyError.Proxy names.
func (p *Pool) proxyOf(slot, gen uint32) string {
	if l := p.labelSlots()[slot].Load(); l != nil && l.gen == gen {
		return l.proxy
	}
	return ""
}

// labelSlots returns the per-slot labels, made on the first call (so that
// a pool nobody labels or scans pays nothing but the slice).
func (p *Pool) labelSlots() []atomic.Pointer[slotLabel] {
	p.labels.once.Do(func() { p.labels.slots = make([]atomic.Pointer[slotLabel], len(p.pub)) })
	return p.labels.slots
}

// setConnLabel records the label (and proxy) of slot's connection of generation gen,
// after allocSlot and before the handle exists (DialMemory's label is "").
func (p *Pool) setConnLabel(slot, gen uint32, label, proxy string) {
	p.labelSlots()[slot].Store(&slotLabel{gen: gen, label: label, proxy: proxy})
}

// gauges fills m's gauges from the live connections, or leaves them zero
// once Close started. A slot counts while ConnCount counts its
// connection (counted holds its generation) and its state is not closed.
// Each is read as Conn.stats reads one: its generation, then its state
// and send units, then the generation again; a slot reused in between (a
// new dial resets what we read) is skipped.
// A slot whose label is not stored for its generation yet is a dial
// between allocSlot and prepare's setConnLabel: no handle exists, so
// nothing is queued and it is not open; skipping it loses nothing.
func (p *Pool) gauges(m *Metrics) {
	if !p.enter() {
		return
	}
	defer p.exit()
	labels := p.labelSlots()
	ld := func(v *C.uint32_t) uint32 { return atomic.LoadUint32((*uint32)(unsafe.Pointer(v))) }
	for s, pb := range p.pub {
		// counted first: a dense Go slice, so a free slot costs one load
		// and its public block is not touched.
		gen := p.counted[s].Load()
		if gen == 0 || ld(&pb.gen) != gen {
			continue // free, its connection left ConnCount, or being reused
		}
		lb := labels[s].Load()
		if lb == nil || lb.gen != gen {
			continue
		}
		st := State(ld(&pb.state))
		if st >= StateClosed {
			continue
		}
		q := Conn{p: p, slot: uint32(s), gen: gen}.queued(p.txAcc[s].Load())
		if ld(&pb.gen) != gen {
			continue // reused while we read
		}
		open := uint64(0)
		if st == StateOpen {
			open = 1
		}
		bytes, msgs := q&unitBytes, q/unitMsg
		m.ConnsOpen += open
		m.SendQueuedBytes += bytes
		m.SendQueuedMessages += msgs
		if lb.label != "" {
			m.Conns = append(m.Conns, ConnGauge{Label: lb.label, ConnsOpen: open, SendQueuedBytes: bytes, SendQueuedMessages: msgs})
		}
	}
	m.Conns = mergeConnGauges(m.Conns)
}
