//go:build linux && cgo

package talaris

// The Pool's life (create, close, free), its connection slots and dialing:
// the cgo marshalling of Config and DialOptions into the C core.

/*
#include <stdlib.h>
#include "csrc/talaris.h"
*/
import "C"

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

type pool struct {
	loop *C.struct_tl_loop
	cfg  Config // with defaults applied

	// event ring (consumer side), owned by the pumper
	ev           evConsumer
	consSleeping *uint32
	wakeSeq      *uint32
	wantsSpace   *uint32

	// command ring (producer side), guarded by sendMu
	sendMu       sync.Mutex
	cmdBuf       []byte
	cmdSize      uint64
	cmdTail      *uint64
	cmdHead      *uint64
	loopSleeping *uint32
	efd          int
	tail         uint64 // local copy of *cmdTail
	headCache    uint64

	pub    []C.struct_tl_conn_pub
	cstats *C.struct_tl_pool_stats

	slotMu sync.Mutex
	free   []uint32
	gens   []uint32
	refs   []int32 // per slot: dialer + loop references; the slot is free at 0

	nconns  atomic.Int32
	pumping atomic.Int32
	closed  atomic.Bool
	stopped atomic.Bool // tl_loop_stop returned (set by Close)
	freed   atomic.Bool
	closeMu sync.Mutex
	users   atomic.Int32 // dialers touching the loop's C memory (useC); the last one out after Close frees it

	// rec folds the stamps of sampled messages into Metrics' histograms
	// (nil when Config.SampleEvery is 0). Written only by the pumper.
	rec   *metricsRecorder
	start time.Time
	// freeMu keeps tl_loop_free from running while a reader of the C
	// counters (Stats, Metrics) is between its freed check and its loads;
	// final holds the counters as they were when the loop was freed.
	freeMu sync.RWMutex
	final  C.struct_tl_pool_stats
}

func newPool(cfg Config) (*Pool, error) {
	d, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var cc C.struct_tl_config
	cc.sq_entries = C.uint32_t(d.SQEntries)
	cc.cq_entries = C.uint32_t(d.CQEntries)
	cc.ring_flags = C.uint32_t(d.RingFlags)
	cc.sq_thread_idle_ms = C.uint32_t(d.SQPollIdle / time.Millisecond)
	cc.sq_thread_cpu = -1
	if d.RingFlags&RingSQAff != 0 {
		cc.sq_thread_cpu = C.int32_t(d.SQPollCPU)
	}
	cc.ring_flags &^= C.uint32_t(RingSQAff)
	cc.buf_size = C.uint32_t(d.BufSize)
	cc.buf_count = C.uint32_t(d.BufCount)
	cc.loop_cpu = C.int32_t(d.LoopCPU)
	cc.loop_wait = C.uint32_t(d.LoopWait)
	cc.spin_ns = C.uint64_t(d.SpinTime)
	cc.event_ring_size = C.uint32_t(d.EventRingSize)
	cc.arena_size = C.uint64_t(d.ArenaSize)
	cc.cmd_ring_size = C.uint64_t(d.CmdRingSize)
	cc.max_conns = C.uint32_t(d.MaxConns)
	cc.max_message = C.uint64_t(d.MaxMessageSize)
	cc.handshake_timeout_ns = C.uint64_t(d.HandshakeTimeout)
	cc.close_timeout_ns = C.uint64_t(d.CloseTimeout)
	cc.max_send_queue = C.uint64_t(d.MaxSendQueue)
	cc.sample_every = C.uint32_t(d.SampleEvery)

	var cerr C.int
	var msg [160]C.char
	loop := C.tl_loop_new(&cc, &cerr, &msg[0], C.size_t(len(msg)))
	if loop == nil {
		return nil, fmt.Errorf("%w: %s (%w)", ErrInvalidConfig, C.GoString(&msg[0]), unix.Errno(-cerr))
	}
	p := &Pool{}
	p.loop, p.cfg = loop, d
	p.start = time.Now()
	if d.SampleEvery != 0 {
		p.rec = newMetricsRecorder()
	}
	p.ev = newEvConsumer(loop, p)
	p.ev.rec = p.rec
	evr := C.tl_loop_evring(loop)
	p.consSleeping = (*uint32)(unsafe.Pointer(&evr.cons_sleeping))
	p.wakeSeq = (*uint32)(unsafe.Pointer(&evr.wake_seq))
	p.wantsSpace = (*uint32)(unsafe.Pointer(&evr.loop_wants_space))
	cmr := C.tl_loop_cmdring(loop)
	p.cmdBuf = unsafe.Slice((*byte)(unsafe.Pointer(cmr.buf)), int(cmr.size))
	p.cmdSize = uint64(cmr.size)
	p.cmdTail = (*uint64)(unsafe.Pointer(&cmr.tail))
	p.cmdHead = (*uint64)(unsafe.Pointer(&cmr.head))
	p.loopSleeping = (*uint32)(unsafe.Pointer(&cmr.loop_sleeping))
	p.efd = int(cmr.efd)
	p.pub = unsafe.Slice(C.tl_loop_conns(loop), int(d.MaxConns))
	p.cstats = C.tl_loop_stats(loop)
	p.free = make([]uint32, 0, d.MaxConns)
	for i := int(d.MaxConns) - 1; i >= 0; i-- {
		p.free = append(p.free, uint32(i))
	}
	p.gens = make([]uint32, d.MaxConns)
	p.refs = make([]int32, d.MaxConns)
	return p, nil
}

func (p *Pool) close() error {
	p.closeMu.Lock()
	defer p.closeMu.Unlock()
	if p.closed.Swap(true) {
		return nil
	}
	p.sendMu.Lock() // no producer may be writing to the ring now
	C.tl_loop_stop(p.loop)
	p.sendMu.Unlock()
	// Only now may release free the loop: a pumper that saw closed and
	// left early must not run tl_loop_free (and a second pthread_join)
	// while tl_loop_stop above is still joining the thread.
	p.stopped.Store(true)
	// Wake a sleeping pumper so it sees closed.
	atomic.AddUint32(p.wakeSeq, 1)
	futexWake(p.wakeSeq)
	// Free C memory once nobody pumps; a pumper that is inside a callback
	// frees on its way out.
	// (pumping is 2 once a pumper leaving after Close has freed it.)
	for i := 0; i < 2000 && p.pumping.Load() == 1; i++ {
		time.Sleep(time.Millisecond)
	}
	p.release()
	return nil
}

// release frees the C loop once Close stopped it and nobody pumps or
// dials.
func (p *Pool) release() {
	if !p.stopped.Load() {
		return // Close has not stopped the loop yet; it releases itself
	}
	if p.users.Load() != 0 {
		return // a dialer still reads the slot's public block; it releases on its way out
	}
	if p.pumping.CompareAndSwap(0, 2) {
		p.freeMu.Lock()
		if !p.freed.Load() {
			p.final = *p.cstats // the loop thread has exited: plain reads are fine
			p.freed.Store(true)
			C.tl_loop_free(p.loop)
		}
		p.freeMu.Unlock()
	}
}

// useC registers a goroutine that touches the loop's C memory outside the
// command ring (a dial resets its slot's public block, hands the C core
// its parameters and waits on the slot's state word), so that a
// concurrent Close leaves the memory to the last such goroutine to free.
// It returns false, registering nothing, once the Pool is closed. closed
// is stored before Close releases, so either release sees this user or
// this user sees closed.
func (p *Pool) useC() bool {
	p.users.Add(1)
	if p.closed.Load() {
		p.doneC()
		return false
	}
	return true
}

// doneC ends a useC section; the last one after Close frees the loop.
func (p *Pool) doneC() {
	if p.users.Add(-1) == 0 && p.closed.Load() {
		p.release()
	}
}

func (p *Pool) connCount() int { return int(p.nconns.Load()) }

// loadStats copies the loop's counters: live ones with atomic loads, the
// final copy once the loop is freed.
func (p *Pool) loadStats() C.struct_tl_pool_stats {
	p.freeMu.RLock()
	defer p.freeMu.RUnlock()
	if p.freed.Load() {
		return p.final
	}
	var out C.struct_tl_pool_stats
	src := unsafe.Slice((*uint64)(unsafe.Pointer(p.cstats)), unsafe.Sizeof(out)/8)
	dst := unsafe.Slice((*uint64)(unsafe.Pointer(&out)), unsafe.Sizeof(out)/8)
	for i := range src {
		dst[i] = atomic.LoadUint64(&src[i])
	}
	return out
}

func (p *Pool) poolStats() PoolStats {
	s := p.loadStats()
	return PoolStats{
		Events: uint64(s.events), Batches: uint64(s.batches), CQEs: uint64(s.cqes), Rearms: uint64(s.rearms),
		NoBufs: uint64(s.nobufs), Stalls: uint64(s.stalls), LoopWakes: uint64(s.loop_wakes),
		PumpSleeps: uint64(s.pump_sleeps),
		Reconnects: uint64(s.reconnects),
	}
}

// metrics is Metrics (reset false) or MetricsInterval (reset true).
func (p *Pool) metrics(reset bool) Metrics {
	var m Metrics
	if p.rec != nil {
		m = p.rec.snapshot(reset)
	} else {
		m.Elapsed = time.Since(p.start)
	}
	s := p.loadStats()
	m.Messages, m.Bytes, m.WireBytes = uint64(s.msgs), uint64(s.bytes), uint64(s.wire_bytes)
	m.Events, m.Completions, m.Rearms = uint64(s.events), uint64(s.cqes), uint64(s.rearms)
	m.NoBufs, m.Stalls, m.Batches = uint64(s.nobufs), uint64(s.stalls), uint64(s.batches)
	m.PumpSleeps, m.LoopWakes = uint64(s.pump_sleeps), uint64(s.loop_wakes)
	m.SendQueueFull, m.Reconnects = uint64(s.sendq_full), uint64(s.reconnects)
	return m
}

func (p *Pool) name() string { return p.cfg.Name }

// allocSlot takes a free connection slot with refs references and a new
// generation.
func (p *Pool) allocSlot(refs int32) (uint32, uint32, error) {
	p.slotMu.Lock()
	defer p.slotMu.Unlock()
	if p.closed.Load() {
		return 0, 0, ErrPoolClosed
	}
	if len(p.free) == 0 {
		return 0, 0, ErrTooManyConns
	}
	s := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.gens[s]++
	if p.gens[s] == 0 {
		p.gens[s] = 1
	}
	p.refs[s] = refs
	p.nconns.Add(1)
	// The loop is done with this slot (its final event was consumed):
	// reset what Go reads of it before the dial command goes out.
	p.pub[s] = C.struct_tl_conn_pub{}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&p.pub[s].gen)), p.gens[s])
	return s, p.gens[s], nil
}

// unref drops one reference to slot; the last frees it.
func (p *Pool) unref(slot uint32) {
	p.slotMu.Lock()
	p.refs[slot]--
	if p.refs[slot] == 0 {
		p.free = append(p.free, slot)
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

// prepare validates a dial, takes a slot for it and hands its parameters
// to the C core; the caller then sends cmdDial. It logs the dial (or why
// it could not start) to Config.Logger.
func (p *Pool) prepare(ctx context.Context, rawURL string, opts *DialOptions) (uint32, uint32, error) {
	slot, gen, err := p.prepareDial(ctx, rawURL, opts)
	if l := p.cfg.Logger; l != nil {
		if err != nil {
			logDialFailed(l, p.cfg.Name, rawURL, err)
		} else {
			logDialing(l, p.cfg.Name, Conn{p: p, slot: slot, gen: gen}, rawURL)
		}
	}
	return slot, gen, err
}

func (p *Pool) prepareDial(ctx context.Context, rawURL string, opts *DialOptions) (uint32, uint32, error) {
	if p.closed.Load() {
		return 0, 0, ErrPoolClosed
	}
	if opts == nil {
		opts = &DialOptions{}
	}
	t, err := newDialRequest(ctx, rawURL, opts)
	if err != nil {
		return 0, 0, err
	}
	// TLS options are checked for ws:// too: a bad value is a bug to hear
	// about at once, not when the URL changes scheme.
	tlsPol, err := opts.TLS.policy()
	if err != nil {
		return 0, 0, err
	}
	var dp C.struct_tl_dial_params
	port := t.addr.Port()
	if a := t.addr.Addr(); a.Is4() {
		raw := (*unix.RawSockaddrInet4)(unsafe.Pointer(&dp.addr))
		raw.Family = unix.AF_INET
		raw.Port = port>>8 | port<<8 // network byte order
		raw.Addr = a.As4()
		dp.addr_len = C.uint32_t(unix.SizeofSockaddrInet4)
	} else {
		raw := (*unix.RawSockaddrInet6)(unsafe.Pointer(&dp.addr))
		raw.Family = unix.AF_INET6
		raw.Port = port>>8 | port<<8
		raw.Addr = a.As16()
		dp.addr_len = C.uint32_t(unix.SizeofSockaddrInet6)
	}
	if t.tls {
		dp.tls = 1
	}
	if opts.TLS.InsecureSkipVerify {
		dp.insecure = 1
	}
	dp.handshake_timeout_ns = C.uint64_t(opts.HandshakeTimeout)
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
		set(&dp.client_cert, &dp.client_cert_len, tlsPol.clientCert)
		set(&dp.client_key, &dp.client_key_len, tlsPol.clientKey)
		set(&dp.ciphers12, &dp.ciphers12_len, tlsPol.ciphers12)
		set(&dp.ciphers13, &dp.ciphers13_len, tlsPol.ciphers13)
		var pins *C.char
		set(&pins, &dp.pins_len, string(tlsPol.pins))
		dp.pins = (*C.uint8_t)(unsafe.Pointer(pins))
		set(&dp.sess_key, &dp.sess_key_len, tlsPol.sessionKey(t.addr.String(), t.serverName))
		dp.min_version, dp.max_version = C.uint32_t(tlsPol.minVersion), C.uint32_t(tlsPol.maxVersion)
	}
	set(&dp.subscribe, &dp.subscribe_len, sub)
	defer func() {
		for _, f := range frees {
			C.free(unsafe.Pointer(f))
		}
	}()
	slot, gen, err := p.allocSlot(1)
	if err != nil {
		return 0, 0, err
	}
	if rc := C.tl_dial_prepare(p.loop, C.uint32_t(slot), &dp); rc != 0 {
		p.nconns.Add(-1)
		p.unref(slot)
		return 0, 0, fmt.Errorf("%w: preparing the dial: %w", ErrDial, unix.Errno(-rc))
	}
	return slot, gen, nil
}

func (p *Pool) dial(ctx context.Context, rawURL string, opts *DialOptions) (Conn, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if !p.useC() {
		return Conn{}, ErrPoolClosed
	}
	defer p.doneC()
	slot, gen, err := p.prepare(ctx, rawURL, opts)
	if err != nil {
		return Conn{}, err
	}
	p.slotMu.Lock()
	p.refs[slot]++ // the dialer reads the slot's public state below
	p.slotMu.Unlock()
	defer p.unref(slot)
	c := Conn{p: p, slot: slot, gen: gen}
	if err := p.command(cmdDial, 0, 0, slot, gen, nil); err != nil {
		return Conn{}, err
	}
	st := &p.pub[slot].state
	stp := (*uint32)(unsafe.Pointer(st))
	// wss: log "TLS done" once the state passed the TLS handshake (the
	// upgrade started; a later state may be all Dial sees).
	tlsPending := p.cfg.Logger != nil && len(rawURL) >= 4 && strings.EqualFold(rawURL[:4], "wss:")
	for {
		s := atomic.LoadUint32(stp)
		if tlsPending && (s == uint32(StateUpgrading) || s == uint32(StateOpen) ||
			atomic.LoadUint32((*uint32)(unsafe.Pointer(&p.pub[slot].opened))) != 0) {
			tlsPending = false
			logTLSDone(p.cfg.Logger, p.cfg.Name, c)
		}
		if s == uint32(StateOpen) || s >= uint32(StateClosing) {
			// A connection that opened and then already ended (a short
			// stream, a drop) is still a successful dial: its events,
			// EventOpen first, are in the ring.
			if s == uint32(StateOpen) || s == uint32(StateClosing) ||
				atomic.LoadUint32((*uint32)(unsafe.Pointer(&p.pub[slot].opened))) != 0 {
				return c, nil
			}
			if err := p.connErr(slot); err != nil {
				return Conn{}, err
			}
			return Conn{}, ErrClosed // not reached: a failed dial records why
		}
		if err := ctx.Err(); err != nil {
			p.command(cmdClose, 0, 1000, slot, gen, nil)
			err = fmt.Errorf("%w: %w", ErrTimeout, err)
			logDialFailed(p.cfg.Logger, p.cfg.Name, rawURL, err)
			return Conn{}, err
		}
		if p.closed.Load() {
			return Conn{}, ErrPoolClosed
		}
		futexWait(stp, s, 20*time.Millisecond)
	}
}

func (p *Pool) dialAsync(rawURL string, opts *DialOptions) (Conn, error) {
	if !p.useC() {
		return Conn{}, ErrPoolClosed
	}
	defer p.doneC()
	slot, gen, err := p.prepare(context.Background(), rawURL, opts)
	if err != nil {
		return Conn{}, err
	}
	if err := p.command(cmdDial, 0, 0, slot, gen, nil); err != nil {
		return Conn{}, err
	}
	return Conn{p: p, slot: slot, gen: gen}, nil
}

func (p *Pool) dialMemory() (Conn, error) {
	if !p.useC() {
		return Conn{}, ErrPoolClosed
	}
	defer p.doneC()
	slot, gen, err := p.allocSlot(1)
	if err != nil {
		return Conn{}, err
	}
	if err := p.command(cmdDial, cmdfMemory, 0, slot, gen, nil); err != nil {
		return Conn{}, err
	}
	return Conn{p: p, slot: slot, gen: gen}, nil
}

// connErr builds the error a failed connection reported.
func (p *Pool) connErr(slot uint32) error {
	pb := &p.pub[slot]
	e := int32(atomic.LoadInt32((*int32)(unsafe.Pointer(&pb.err))))
	aux := int32(pb.aux)
	code := int(pb.code)
	detail := C.GoString(&pb.detail[0])
	return makeErr(e, aux, code, detail)
}
