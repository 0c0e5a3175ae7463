//go:build linux && cgo

package talaris

// Dialing: a slot for the connection, the cgo marshalling of the URL,
// DialOptions and addresses into the C core's dial request, and the wait
// for a synchronous Dial's outcome.

/*
#include <stdlib.h>
#include "csrc/talaris.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// slotTable is who holds each connection slot: its generation and its
// references (the dialer's and the loop's).
type slotTable struct {
	slotMu sync.Mutex
	gens   []uint32
	refs   []int32 // per slot: dialer + loop references; the slot is free at 0
}

// allocSlot takes a free connection slot with refs references and a new
// generation.
func (p *Pool) allocSlot(refs int32) (uint32, uint32, error) {
	p.slotMu.Lock()
	defer p.slotMu.Unlock()
	if p.closed.Load() {
		return 0, 0, ErrPoolClosed
	}
	// The loop with the fewest connections (the first among equals).
	var sh *shard
	for _, c := range p.shards {
		if len(c.free) != 0 && (sh == nil || c.used < sh.used) {
			sh = c
		}
	}
	if sh == nil {
		return 0, 0, ErrTooManyConns
	}
	s := sh.free[len(sh.free)-1]
	sh.free = sh.free[:len(sh.free)-1]
	sh.used++
	p.gens[s]++
	if p.gens[s] == 0 {
		p.gens[s] = 1
	}
	p.refs[s] = refs
	p.counted[s].Store(p.gens[s])
	p.nconns.Add(1)
	// The loop is done with this slot (its final event was consumed):
	// reset what Go reads of it before the dial command goes out.
	*p.pub[s] = C.struct_tl_conn_pub{}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&p.pub[s].gen)), p.gens[s])
	// A new handle reports StateConnecting at once, before the loop has
	// taken the dial command (StateIdle means a dead handle).
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&p.pub[s].state)), uint32(StateConnecting))
	// Send admission starts over; sendMu orders it against senders that
	// still hold the slot's previous Conn (they fail its live check).
	sh.lockSend()
	p.txAcc[s].Store(0)
	p.txFull[s].Store(0)
	p.dropSeen[s].Store(0)
	p.flushDrops[s].Store(0)
	p.rcPolicy[s].Store(false)
	d := &p.direct[s]
	d.sends.Store(0)
	d.handoffs.Store(0)
	d.bytes.Store(0)
	d.wire.Store(0)
	d.bellKey.Store(0)
	sh.sendMu.Unlock()
	return s, p.gens[s], nil
}

// uncount takes slot's connection of generation gen out of ConnCount,
// once: the first of its final event and its failed Dial does.
func (p *Pool) uncount(slot, gen uint32) {
	if p.counted[slot].CompareAndSwap(gen, 0) {
		p.nconns.Add(-1)
	}
}

// unref drops one reference to slot; the last frees it.
func (p *Pool) unref(slot uint32) {
	p.slotMu.Lock()
	p.refs[slot]--
	if p.refs[slot] == 0 {
		sh := p.shardOf[slot]
		sh.free = append(sh.free, slot)
		sh.used--
	}
	p.slotMu.Unlock()
}

// cstr copies s to C memory; the caller frees it.
func cstr(s string) (*C.char, C.size_t) {
	if s == "" {
		return nil, 0
	}
	return C.CString(s), C.size_t(len(s))
}

// putSockaddr writes ap as a sockaddr_in or sockaddr_in6 into ss and
// returns its length.
func putSockaddr(ss *C.struct_sockaddr_storage, ap netip.AddrPort) int {
	port := ap.Port()
	if a := ap.Addr(); a.Is4() {
		raw := (*unix.RawSockaddrInet4)(unsafe.Pointer(ss))
		raw.Family = unix.AF_INET
		raw.Port = port>>8 | port<<8 // network byte order
		raw.Addr = a.As4()
		return unix.SizeofSockaddrInet4
	}
	raw := (*unix.RawSockaddrInet6)(unsafe.Pointer(ss))
	raw.Family = unix.AF_INET6
	raw.Port = port>>8 | port<<8
	raw.Addr = ap.Addr().As16()
	return unix.SizeofSockaddrInet6
}

// request validates a dial and resolves its host. It reads no pool
// memory, so it runs before enter: a slow name lookup never holds Close
// up.
func (p *Pool) request(ctx context.Context, rawURL string, opts *DialOptions) (*dialRequest, *DialOptions, error) {
	if p.closed.Load() {
		return nil, nil, ErrPoolClosed
	}
	if opts == nil {
		d := dialDefaults // a copy: nothing may write the table
		opts = &d
	}
	if err := opts.checkHeartbeat(); err != nil {
		return nil, nil, err
	}
	// TLS options are checked for ws:// too: a bad value is a bug to hear
	// about at once, not when the URL changes scheme.
	pol, err := opts.TLS.policy()
	if err != nil {
		return nil, nil, err
	}
	t, err := newDialRequest(ctx, rawURL, opts)
	if err != nil {
		return nil, nil, err
	}
	t.pol = pol
	return t, opts, nil
}

// logDial logs a dial that starts (err nil) or could not start to
// Config.Logger.
func (p *Pool) logDial(rawURL string, slot, gen uint32, err error) {
	if l := p.cfg.Logger; l != nil {
		if err != nil {
			logDialFailed(l, p.cfg.Name, rawURL, err)
		} else {
			logDialing(l, p.cfg.Name, Conn{p: p, slot: slot, gen: gen}, rawURL)
		}
	}
}

// prepare takes a slot for a validated dial and hands its parameters to
// the C core; the caller (inside enter) then sends cmdDial.
func (p *Pool) prepare(t *dialRequest, opts *DialOptions) (uint32, uint32, error) {
	var dp C.struct_tl_dial_params
	dp.addr_len = C.uint32_t(putSockaddr(&dp.addr, t.addrs[0]))
	if t.local.IsValid() {
		dp.local_len = C.uint32_t(putSockaddr(&dp.local, t.local))
	}
	if more := t.addrs[1:]; len(more) > 0 {
		alt := (*C.struct_sockaddr_storage)(C.calloc(C.size_t(len(more)), C.size_t(unsafe.Sizeof(dp.addr))))
		if alt == nil {
			return 0, 0, fmt.Errorf("%w: preparing the dial: %w", ErrDial, unix.ENOMEM)
		}
		defer C.free(unsafe.Pointer(alt))
		alts := unsafe.Slice(alt, len(more))
		for i := range more {
			putSockaddr(&alts[i], more[i])
		}
		dp.alt, dp.nalt = alt, C.uint32_t(len(more))
	}
	if t.tls {
		dp.tls = 1
	}
	if opts.TLS.InsecureSkipVerify {
		dp.insecure = 1
	}
	dp.handshake_timeout_ns = C.uint64_t(opts.HandshakeTimeout)
	dp.close_timeout_ns = C.uint64_t(opts.CloseTimeout)
	dp.ping_interval_ns = C.uint64_t(opts.PingInterval)
	dp.read_timeout_ns = C.uint64_t(opts.ReadTimeout)
	if opts.Reconnect != nil {
		rp, err := opts.Reconnect.withDefaults()
		if err != nil {
			return 0, 0, err
		}
		dp.rc_enabled = 1
		dp.rc_min_ns = C.uint64_t(rp.MinDelay)
		dp.rc_max_ns = C.uint64_t(rp.MaxDelay)
		dp.rc_max_attempts = C.uint32_t(min(rp.MaxAttempts, 1<<31))
	}
	sub, err := subscribeBlob(opts.Subscribe)
	if err != nil {
		return 0, 0, err
	}
	var frees []*C.char
	set := func(dst **C.char, dl *C.size_t, s string) {
		*dst, *dl = cstr(s)
		if *dst != nil {
			frees = append(frees, *dst)
		}
	}
	set(&dp.host, &dp.host_len, t.host)
	set(&dp.path, &dp.path_len, t.path)
	set(&dp.headers, &dp.headers_len, t.headers)
	set(&dp.protocols, &dp.protocols_len, t.protocols)
	set(&dp.server_name, &dp.server_name_len, t.serverName)
	set(&dp.ca_file, &dp.ca_file_len, opts.TLS.RootCAFile)
	set(&dp.ca_pem, &dp.ca_pem_len, string(opts.TLS.RootCAPEM))
	if t.tls {
		pol := t.pol
		set(&dp.client_cert, &dp.client_cert_len, pol.clientCert)
		set(&dp.client_key, &dp.client_key_len, pol.clientKey)
		set(&dp.ciphers12, &dp.ciphers12_len, pol.ciphers12)
		set(&dp.ciphers13, &dp.ciphers13_len, pol.ciphers13)
		var pins *C.char
		set(&pins, &dp.pins_len, string(pol.pins))
		dp.pins = (*C.uint8_t)(unsafe.Pointer(pins))
		at := t.addrs[0].String()
		if t.proxy != nil { // the address is the proxy's: the session is the target's
			at = t.proxy.name + " " + t.host
		}
		set(&dp.sess_key, &dp.sess_key_len, pol.sessionKey(at, t.serverName))
		dp.min_version, dp.max_version = C.uint32_t(pol.minVersion), C.uint32_t(pol.maxVersion)
	}
	set(&dp.subscribe, &dp.subscribe_len, sub)
	proxyName := ""
	if pl := t.proxy; pl != nil {
		proxyName = pl.name
		dp.proxy = C.int32_t(pl.kind)
		set(&dp.proxy_req, &dp.proxy_req_len, pl.req)
		set(&dp.proxy_auth, &dp.proxy_auth_len, pl.auth)
	}
	defer func() {
		for _, f := range frees {
			C.free(unsafe.Pointer(f))
		}
	}()
	slot, gen, err := p.allocSlot(1)
	if err == ErrTooManyConns {
		// A failed Dial's slot may still wait for its final event to be
		// passed (reapFailed waits at most reapWait for the loop to
		// publish it): pass what is there, then look again.
		p.reapAll()
		slot, gen, err = p.allocSlot(1)
	}
	if err != nil {
		return 0, 0, err
	}
	p.rcPolicy[slot].Store(opts.Reconnect != nil)
	p.setConnLabel(slot, gen, opts.Label, proxyName) // after allocSlot's reset: the gauges read the slot from here on
	sh := p.shardOf[slot]
	if rc := C.tl_dial_prepare(sh.loop, C.uint32_t(slot-sh.base), &dp); rc != 0 {
		p.uncount(slot, gen)
		p.unref(slot)
		return 0, 0, fmt.Errorf("%w: preparing the dial: %w", ErrDial, unix.Errno(-rc))
	}
	return slot, gen, nil
}

// startDial validates and resolves a dial (outside enter: a slow lookup
// never holds Close up), then, inside enter, takes its slot and hands the
// parameters to the C core, logging either outcome. On success the caller
// is inside enter and must call p.exit.
func (p *Pool) startDial(ctx context.Context, rawURL string, opts *DialOptions) (*dialRequest, uint32, uint32, error) {
	req, opts, err := p.request(ctx, rawURL, opts)
	if err != nil {
		p.logDial(rawURL, 0, 0, err)
		return nil, 0, 0, err
	}
	if !p.enter() {
		return nil, 0, 0, ErrPoolClosed
	}
	slot, gen, err := p.prepare(req, opts)
	p.logDial(rawURL, slot, gen, err)
	if err != nil {
		p.exit()
		return nil, 0, 0, err
	}
	return req, slot, gen, nil
}

func (p *Pool) dial(ctx context.Context, rawURL string, opts *DialOptions) (Conn, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	req, slot, gen, err := p.startDial(ctx, rawURL, opts)
	if err != nil {
		return Conn{}, err
	}
	defer p.exit()
	p.slotMu.Lock()
	p.refs[slot]++ // the dialer reads the slot's public state below
	p.slotMu.Unlock()
	defer p.unref(slot)
	// Until it opens, the connection is the dialer's alone: a failure is
	// Dial's error, not an event (see quiet).
	p.quiet[slot].Store(gen)
	c := Conn{p: p, slot: slot, gen: gen}
	if err := p.command(cmdDial, 0, 0, slot, gen, nil); err != nil {
		return Conn{}, err
	}
	w := &dialWait{p: p, ctx: ctx, rawURL: rawURL, c: c, pb: p.pub[slot], waiting: true}
	w.stp = (*uint32)(unsafe.Pointer(&w.pb.state))
	defer w.abortOnDone()()
	// wss: log "TLS done" once the state passed the TLS handshake (the
	// upgrade started; a later state may be all Dial sees).
	w.tlsPending = p.cfg.Logger != nil && req.tls
	return w.wait()
}

// dialWait is a synchronous Dial waiting for its connection to open or
// fail, on the slot's public state word, while its context may abort it.
type dialWait struct {
	p      *Pool
	ctx    context.Context
	rawURL string
	c      Conn
	pb     *C.struct_tl_conn_pub
	stp    *uint32 // &pb.state, the word the loop changes and wakes
	// cancelled is the context's error once the wait saw it end.
	cancelled  error
	tlsPending bool // "TLS done" is still to be logged

	abortMu sync.Mutex
	waiting bool // Dial has not returned: the context may still abort
	refused bool // the abort found an inline loop's ring full: the wait sends it
}

// abortOnDone arms the context's abort and returns its disarm, for Dial's
// return. When ctx ends, the dial is aborted unless it opened meanwhile
// (then the loop ignores the command and Dial returns the open
// connection: the caller must not miss a Conn whose events it will see).
// Either way the loop changes the state word, which wakes the wait
// without a lost wake-up. Never after Dial returned: the command needs
// Dial's enter (and its slot reference).
func (w *dialWait) abortOnDone() (disarm func()) {
	stop := context.AfterFunc(w.ctx, func() {
		w.abortMu.Lock()
		if w.waiting {
			// Fails once the pool closes; and on an inline loop's full
			// ring (this is never the loop's goroutine): a wait there
			// would keep Dial past its context. Another goroutine's
			// Dial then claims the connection (wait), which aborts it
			// at the latest when it would open; the loop's goroutine's
			// Dial sends the abort itself.
			w.refused = w.p.commandOr(cmdClose, cmdfIfDialing, 1000, w.c.slot, w.c.gen, nil, true) == errRingFull
		}
		w.abortMu.Unlock()
	})
	return func() {
		stop()
		w.abortMu.Lock()
		w.waiting = false
		w.abortMu.Unlock()
	}
}

// wait returns the Conn once it opened, or why it did not.
func (w *dialWait) wait() (Conn, error) {
	p := w.p
	for {
		s := atomic.LoadUint32(w.stp)
		if w.tlsPending && (s == uint32(StateUpgrading) || s == uint32(StateOpen) || w.opened()) {
			w.tlsPending = false
			logTLSDone(p.cfg.Logger, p.cfg.Name, w.c)
		}
		if s == uint32(StateOpen) || s >= uint32(StateClosing) {
			return w.outcome(s)
		}
		if p.closed.Load() {
			return Conn{}, ErrPoolClosed
		}
		if w.cancelled == nil {
			w.cancelled = w.ctx.Err() // the abort is on its way (abortOnDone)
		}
		if p.cfg.Tuning.InlineLoop {
			if p.runInline(C.TL_INLINE_ONCE) {
				w.sendRefusedAbort()
				continue
			}
			if w.abandon() {
				return Conn{}, w.timedOut()
			}
		}
		// Woken by the loop's state change (the handshake, the abort) or
		// by Close; the timeout is only a defence.
		futexWait(w.stp, s, 100*time.Millisecond)
	}
}

func (w *dialWait) opened() bool {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&w.pb.opened))) != 0
}

// timedOut logs and returns Dial's error for a context that ended first.
func (w *dialWait) timedOut() error {
	err := fmt.Errorf("%w: %w", ErrTimeout, w.cancelled)
	logDialFailed(w.p.cfg.Logger, w.p.cfg.Name, w.rawURL, err)
	return err
}

// outcome is Dial's result once the state word reached s, StateOpen or
// later.
func (w *dialWait) outcome(s uint32) (Conn, error) {
	p, slot, gen := w.p, w.c.slot, w.c.gen
	// A connection that opened and then already ended (a short stream, a
	// drop) is still a successful dial: its events, EventOpen first, are
	// in the ring.
	if s == uint32(StateOpen) || s == uint32(StateClosing) || w.opened() {
		// The caller has the Conn now: none of its events is quiet (a
		// pump without OnEvent does not clear it).
		p.quiet[slot].CompareAndSwap(gen, 0)
		return w.c, nil
	}
	// The connection ended for the caller with this error: ConnCount no
	// longer holds it, even while its quiet events wait for a pump.
	p.uncount(slot, gen)
	if !p.closed.Load() {
		p.reapFailed(slot, gen)
	}
	ferr := atomic.LoadInt32((*int32)(unsafe.Pointer(&w.pb.err)))
	if w.cancelled == nil && ferr == cErrAborted {
		w.cancelled = w.ctx.Err() // aborted by the context before Dial looked
	}
	// A refusal that waited for its body when the context ended is
	// reported as the refusal (the loop ended the wait for the abort): its
	// status and Retry-After are what happened.
	if w.cancelled != nil && ferr != cErrHTTP {
		return Conn{}, w.timedOut()
	}
	if p.closed.Load() {
		return Conn{}, ErrPoolClosed
	}
	if err := p.connErr(slot, gen); err != nil {
		return Conn{}, err
	}
	return Conn{}, ErrClosed // not reached: a failed dial records why
}

// sendRefusedAbort sends, from the inline loop's goroutine, the abort the
// context's callback found no room for.
func (w *dialWait) sendRefusedAbort() {
	if w.cancelled == nil {
		return
	}
	w.abortMu.Lock()
	if w.refused {
		w.refused = false
		w.p.command(cmdClose, cmdfIfDialing, 1000, w.c.slot, w.c.gen, nil) // (it runs the loop for room)
	}
	w.abortMu.Unlock()
}

// abandon claims, for another goroutine's Dial on an inline pool whose
// context ended, the connection as abandoned. The loop runs only when the
// pool's goroutine drives it (which may be never, or only after a
// callback that waits for this Dial returned), so the abort may wait in
// the command ring while the upgrade completes. Dial returns at once: the
// loop then aborts the connection where it would open
// (tl_pub_claim_open), so no event of a Conn its caller never got
// surfaces. The claim fails only when the loop opened it first: Dial
// returns it (the wait sees the open), as with a loop thread.
func (w *dialWait) abandon() bool {
	return w.cancelled != nil && atomic.CompareAndSwapUint32((*uint32)(unsafe.Pointer(&w.pb.dial_claim)), C.TL_CLAIM_NONE, C.TL_CLAIM_ABANDONED)
}

func (p *Pool) dialAsync(rawURL string, opts *DialOptions) (Conn, error) {
	_, slot, gen, err := p.startDial(context.Background(), rawURL, opts)
	if err != nil {
		return Conn{}, err
	}
	defer p.exit()
	if err := p.command(cmdDial, 0, 0, slot, gen, nil); err != nil {
		return Conn{}, err
	}
	return Conn{p: p, slot: slot, gen: gen}, nil
}

func (p *Pool) dialMemory() (Conn, error) {
	if !p.enter() {
		return Conn{}, ErrPoolClosed
	}
	defer p.exit()
	slot, gen, err := p.allocSlot(1)
	if err != nil {
		return Conn{}, err
	}
	p.setConnLabel(slot, gen, "", "")
	if err := p.command(cmdDial, cmdfMemory, 0, slot, gen, nil); err != nil {
		return Conn{}, err
	}
	return Conn{p: p, slot: slot, gen: gen}, nil
}

// connErr builds the error a failed connection reported (a
// *HandshakeError for a refused upgrade). The caller owns the ended slot.
func (p *Pool) connErr(slot, gen uint32) error {
	pb := p.pub[slot]
	e := int32(atomic.LoadInt32((*int32)(unsafe.Pointer(&pb.err))))
	aux := int32(pb.aux)
	code := int(pb.code)
	detail := C.GoString(&pb.detail[0])
	err := makeErr(e, aux, code, detail)
	if e == cErrHTTP {
		err = p.handshakeErr(slot, gen, err)
	}
	return proxyErr(err, p.proxyOf(slot, gen))
}

// handshakeErr wraps the ConnError of a refused upgrade in a
// HandshakeError built from the response the loop kept. Cold path: one
// cgo call. The caller owns the ended slot.
func (p *Pool) handshakeErr(slot, gen uint32, err error) error {
	ce, ok := err.(*ConnError)
	if !ok {
		return err
	}
	buf := make([]byte, C.TL_FAIL_HEAD_MAX)
	sh := p.shardOf[slot]
	n := C.tl_loop_fail_head(sh.loop, C.uint32_t(slot-sh.base), C.uint32_t(gen), (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	code := 0
	if errors.Is(ce, ErrBadStatus) {
		code = ce.Code
	}
	return newHandshakeError(ce, code, buf[:n], time.Now())
}
