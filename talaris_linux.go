//go:build linux && cgo

package talaris

/*
#cgo CFLAGS: -O2 -std=gnu11 -Wall
#cgo amd64,!talaris_openssl CFLAGS: -I/usr/include/android
#cgo amd64,!talaris_openssl LDFLAGS: -L/usr/lib/x86_64-linux-gnu/android -Wl,-rpath,/usr/lib/x86_64-linux-gnu/android -lssl -lcrypto
#cgo arm64,!talaris_openssl CFLAGS: -I/usr/include/android
#cgo arm64,!talaris_openssl LDFLAGS: -L/usr/lib/aarch64-linux-gnu/android -Wl,-rpath,/usr/lib/aarch64-linux-gnu/android -lssl -lcrypto
#cgo talaris_openssl CFLAGS: -DTL_OPENSSL
#cgo talaris_openssl LDFLAGS: -lssl -lcrypto
#cgo LDFLAGS: -l:liburing.a -lpthread
#include <stdlib.h>
#include <string.h>
#include "csrc/talaris.h"
#include "csrc/http.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Pool owns one C loop thread, its io_uring, its rings and a set of
// connections. Create it with NewPool; one goroutine pumps it.
type Pool struct {
	loop *C.struct_tl_loop
	cfg  Config

	// event ring (consumer side)
	events       []C.struct_tl_event
	evMask       uint64
	evTail       *uint64
	evHead       *uint64
	consSleeping *uint32
	wakeSeq      *uint32
	wantsSpace   *uint32
	head         uint64 // local copy of *evHead, owned by the pumper

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

	pub   []C.struct_tl_conn_pub
	stats *C.struct_tl_pool_stats

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
}

func (c *Config) withDefaults() (Config, error) {
	d := *c
	if d.SQEntries == 0 {
		d.SQEntries = 256
	}
	if d.CQEntries == 0 {
		d.CQEntries = 4 * d.SQEntries
	}
	if d.RingFlags == 0 {
		d.RingFlags = RingSingleIssuer | RingDeferTaskrun
	}
	if d.RingFlags&RingFlagsNone != 0 {
		d.RingFlags = 0
	}
	if d.SQPollIdle == 0 {
		d.SQPollIdle = time.Millisecond
	}
	if d.BufSize == 0 {
		d.BufSize = 16 << 10
	}
	if d.BufCount == 0 {
		d.BufCount = 1024
	}
	if !d.LoopCPUSet {
		d.LoopCPU = -1
	}
	if d.LoopWait == WaitDefault {
		d.LoopWait = defaultWait()
	}
	if d.ConsumerWait == WaitDefault {
		d.ConsumerWait = defaultWait()
	}
	if d.SpinTime == 0 {
		d.SpinTime = 50 * time.Microsecond
	}
	if d.EventRingSize == 0 {
		d.EventRingSize = 1 << 16
	}
	if d.MaxMessageSize == 0 {
		d.MaxMessageSize = 16 << 20
	}
	if d.ArenaSize == 0 {
		d.ArenaSize = 64 << 20
		for d.ArenaSize < 2*d.MaxMessageSize {
			d.ArenaSize *= 2
		}
	}
	if d.CmdRingSize == 0 {
		d.CmdRingSize = 4 << 20
	}
	if d.MaxConns == 0 {
		d.MaxConns = 1024
	}
	if d.HandshakeTimeout == 0 {
		d.HandshakeTimeout = 10 * time.Second
	}
	if d.CloseTimeout == 0 {
		d.CloseTimeout = 5 * time.Second
	}
	if d.MaxSendQueue == 0 {
		d.MaxSendQueue = 64 << 20
	}
	pow2 := func(v uint64) bool { return v != 0 && v&(v-1) == 0 }
	switch {
	case !pow2(uint64(d.BufSize)) || !pow2(uint64(d.BufCount)) || d.BufCount > 32768:
		return d, fmt.Errorf("%w: BufSize and BufCount must be powers of two, BufCount <= 32768", ErrInvalidConfig)
	case !pow2(uint64(d.EventRingSize)) || !pow2(d.ArenaSize) || !pow2(uint64(d.CmdRingSize)):
		return d, fmt.Errorf("%w: EventRingSize, ArenaSize and CmdRingSize must be powers of two", ErrInvalidConfig)
	case d.MaxMessageSize > d.ArenaSize/2:
		return d, fmt.Errorf("%w: MaxMessageSize must be at most ArenaSize/2", ErrInvalidConfig)
	case d.CmdRingSize < 4096:
		return d, fmt.Errorf("%w: CmdRingSize must be at least 4096", ErrInvalidConfig)
	case d.MaxConns > 1<<20:
		return d, fmt.Errorf("%w: MaxConns must be at most 1<<20", ErrInvalidConfig)
	}
	return d, nil
}

// defaultWait picks the wait strategy for WaitDefault (measured with
// `talaris bench` on a 2-core machine: spinning there doubled p50 latency).
func defaultWait() WaitStrategy {
	if runtime.NumCPU() <= 2 {
		return WaitBlock
	}
	return WaitSpinThenBlock
}

// NewPool starts a C loop thread configured by cfg.
func NewPool(cfg Config) (*Pool, error) {
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

	var cerr C.int
	var msg [160]C.char
	loop := C.tl_loop_new(&cc, &cerr, &msg[0], C.size_t(len(msg)))
	if loop == nil {
		return nil, fmt.Errorf("%w: %s (%w)", ErrInvalidConfig, C.GoString(&msg[0]), unix.Errno(-cerr))
	}
	p := &Pool{loop: loop, cfg: d}
	evr := C.tl_loop_evring(loop)
	p.events = unsafe.Slice(evr.ev, int(evr.size))
	p.evMask = uint64(evr.mask)
	p.evTail = (*uint64)(unsafe.Pointer(&evr.tail))
	p.evHead = (*uint64)(unsafe.Pointer(&evr.head))
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
	p.stats = C.tl_loop_stats(loop)
	p.free = make([]uint32, 0, d.MaxConns)
	for i := int(d.MaxConns) - 1; i >= 0; i-- {
		p.free = append(p.free, uint32(i))
	}
	p.gens = make([]uint32, d.MaxConns)
	p.refs = make([]int32, d.MaxConns)
	return p, nil
}

// Close shuts the loop down: open connections get a 1001 close frame and
// their sockets are closed. Pending events are dropped. A Pump in progress
// returns ErrPoolClosed. Close is idempotent.
func (p *Pool) Close() error {
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

func (p *Pool) release() {
	if !p.stopped.Load() {
		return // Close has not stopped the loop yet; it releases itself
	}
	if p.pumping.CompareAndSwap(0, 2) {
		if !p.freed.Swap(true) {
			C.tl_loop_free(p.loop)
		}
	}
}

// ConnCount returns the number of connections of the pool that have not
// yet delivered their final event.
func (p *Pool) ConnCount() int { return int(p.nconns.Load()) }

// Stats returns the pool's counters.
func (p *Pool) Stats() PoolStats {
	if p.freed.Load() {
		return PoolStats{}
	}
	s := p.stats
	ld := func(v *C.uint64_t) uint64 { return atomic.LoadUint64((*uint64)(unsafe.Pointer(v))) }
	return PoolStats{
		Events: ld(&s.events), Batches: ld(&s.batches), CQEs: ld(&s.cqes), Rearms: ld(&s.rearms),
		NoBufs: ld(&s.nobufs), Stalls: ld(&s.stalls), LoopWakes: ld(&s.loop_wakes), PumpSleeps: ld(&s.pump_sleeps),
	}
}

// ---- futex and eventfd helpers (no cgo: plain syscalls) ----

func futexWait(addr *uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(futexWaitPrivate),
		uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

func futexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(futexWakePrivate),
		1<<30, 0, 0, 0)
}

// linux/futex.h: FUTEX_WAIT=0, FUTEX_WAKE=1, FUTEX_PRIVATE_FLAG=128.
const (
	futexWaitPrivate = 0 | 128
	futexWakePrivate = 1 | 128
)

var one = [8]byte{1, 0, 0, 0, 0, 0, 0, 0}

func (p *Pool) wakeLoop() {
	unix.Write(p.efd, one[:])
}

// ---- command ring ----

const (
	cmdPad      = 0
	cmdDial     = 1
	cmdSend     = 2
	cmdPing     = 3
	cmdPong     = 4
	cmdClose    = 5
	cmdShutdown = 6
	cmdInject   = 7

	cmdfFin    = 0x10
	cmdfCont   = 0x20
	cmdfMemory = 0x1

	cmdHdr = 16
)

// maxRecord is the largest payload one command record carries; bigger sends
// become several fragments of one message.
func (p *Pool) maxRecord() int {
	return int(p.cmdSize / 4)
}

// reserve waits until n bytes (a whole record) fit contiguously and
// returns the offset to write at. Called with sendMu held.
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

func (p *Pool) kick() {
	if atomic.LoadUint32(p.loopSleeping) != 0 && atomic.CompareAndSwapUint32(p.loopSleeping, 1, 0) {
		p.wakeLoop()
	}
}

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

func (p *Pool) command(op, flags uint8, code uint16, slot, gen uint32, payload []byte) error {
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	if err := p.putRecord(op, flags, code, slot, gen, payload); err != nil {
		return err
	}
	p.publish()
	return nil
}

// ---- connections ----

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

func (p *Pool) unref(slot uint32) {
	p.slotMu.Lock()
	p.refs[slot]--
	if p.refs[slot] == 0 {
		p.free = append(p.free, slot)
	}
	p.slotMu.Unlock()
}

type target struct {
	tls        bool
	addr       unix.Sockaddr
	host, path string
	serverName string
}

func parseTarget(ctx context.Context, rawURL string, opts *DialOptions) (*target, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadURL, err)
	}
	t := &target{}
	port := u.Port()
	switch strings.ToLower(u.Scheme) {
	case "ws":
		if port == "" {
			port = "80"
		}
	case "wss":
		t.tls = true
		if port == "" {
			port = "443"
		}
	default:
		return nil, fmt.Errorf("%w: scheme %q is not ws or wss", ErrBadURL, u.Scheme)
	}
	hostname := u.Hostname()
	if hostname == "" {
		return nil, fmt.Errorf("%w: no host in %q", ErrBadURL, rawURL)
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("%w: fragment not allowed in a websocket URL", ErrBadURL)
	}
	pn, err := strconv.Atoi(port)
	if err != nil || pn <= 0 || pn > 65535 {
		return nil, fmt.Errorf("%w: bad port %q", ErrBadURL, port)
	}
	t.host = u.Host
	if (t.tls && port == "443") || (!t.tls && port == "80") {
		t.host = hostname
		if strings.Contains(hostname, ":") {
			t.host = "[" + hostname + "]"
		}
	}
	t.path = u.RequestURI()
	if t.path == "" {
		t.path = "/"
	}
	t.serverName = hostname
	if opts != nil && opts.TLS.ServerName != "" {
		t.serverName = opts.TLS.ServerName
	}
	ip := net.ParseIP(hostname)
	if ip == nil {
		ips, err := net.DefaultResolver.LookupIPAddr(ctx, hostname)
		if err != nil || len(ips) == 0 {
			return nil, fmt.Errorf("%w: %s: %v", ErrResolve, hostname, err)
		}
		ip = ips[0].IP
		for _, a := range ips { // prefer IPv4: loopback feeds usually listen there
			if a.IP.To4() != nil {
				ip = a.IP
				break
			}
		}
	}
	if v4 := ip.To4(); v4 != nil {
		sa := &unix.SockaddrInet4{Port: pn}
		copy(sa.Addr[:], v4)
		t.addr = sa
	} else {
		sa := &unix.SockaddrInet6{Port: pn}
		copy(sa.Addr[:], ip.To16())
		t.addr = sa
	}
	return t, nil
}

func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("()<>@,;:\\\"/[]?={}", c) >= 0 {
			return false
		}
	}
	return true
}

func headerBlock(h http.Header) (string, string, error) {
	var b strings.Builder
	hostOverride := ""
	for name, vals := range h {
		if !validToken(name) {
			return "", "", fmt.Errorf("%w: bad header name %q", ErrBadURL, name)
		}
		switch strings.ToLower(name) {
		case "upgrade", "connection", "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
			"sec-websocket-protocol", "content-length", "transfer-encoding":
			return "", "", fmt.Errorf("%w: header %q is set by the client itself", ErrBadURL, name)
		case "host":
			if len(vals) > 0 {
				hostOverride = vals[0]
			}
			continue
		}
		for _, v := range vals {
			if strings.ContainsAny(v, "\r\n\x00") {
				return "", "", fmt.Errorf("%w: header %q value has CR, LF or NUL", ErrBadURL, name)
			}
			b.WriteString(name)
			b.WriteString(": ")
			b.WriteString(v)
			b.WriteString("\r\n")
		}
	}
	if strings.ContainsAny(hostOverride, "\r\n\x00") {
		return "", "", fmt.Errorf("%w: Host has CR, LF or NUL", ErrBadURL)
	}
	return b.String(), hostOverride, nil
}

// cstr copies s to C memory; the caller frees it.
func cstr(s string) (*C.char, C.size_t) {
	if s == "" {
		return nil, 0
	}
	return C.CString(s), C.size_t(len(s))
}

func (p *Pool) prepare(ctx context.Context, rawURL string, opts *DialOptions) (uint32, uint32, error) {
	if p.closed.Load() {
		return 0, 0, ErrPoolClosed
	}
	if opts == nil {
		opts = &DialOptions{}
	}
	t, err := parseTarget(ctx, rawURL, opts)
	if err != nil {
		return 0, 0, err
	}
	headers, hostOverride, err := headerBlock(opts.Header)
	if err != nil {
		return 0, 0, err
	}
	if hostOverride != "" {
		t.host = hostOverride
	}
	for _, sp := range opts.Subprotocols {
		if !validToken(sp) {
			return 0, 0, fmt.Errorf("%w: bad subprotocol %q", ErrBadURL, sp)
		}
	}
	if t.tls && TLSBackend() == "none" {
		return 0, 0, fmt.Errorf("%w: this build has no TLS backend", ErrTLS)
	}
	var dp C.struct_tl_dial_params
	switch sa := t.addr.(type) {
	case *unix.SockaddrInet4:
		raw := (*unix.RawSockaddrInet4)(unsafe.Pointer(&dp.addr))
		raw.Family = unix.AF_INET
		raw.Port = uint16(sa.Port>>8) | uint16(sa.Port&0xff)<<8
		raw.Addr = sa.Addr
		dp.addr_len = C.uint32_t(unix.SizeofSockaddrInet4)
	case *unix.SockaddrInet6:
		raw := (*unix.RawSockaddrInet6)(unsafe.Pointer(&dp.addr))
		raw.Family = unix.AF_INET6
		raw.Port = uint16(sa.Port>>8) | uint16(sa.Port&0xff)<<8
		raw.Addr = sa.Addr
		dp.addr_len = C.uint32_t(unix.SizeofSockaddrInet6)
	}
	if t.tls {
		dp.tls = 1
	}
	if opts.TLS.InsecureSkipVerify {
		dp.insecure = 1
	}
	dp.handshake_timeout_ns = C.uint64_t(opts.HandshakeTimeout)
	var frees []*C.char
	set := func(dst **C.char, dl *C.size_t, s string) {
		*dst, *dl = cstr(s)
		if *dst != nil {
			frees = append(frees, *dst)
		}
	}
	set(&dp.host, &dp.host_len, t.host)
	set(&dp.path, &dp.path_len, t.path)
	set(&dp.headers, &dp.headers_len, headers)
	set(&dp.protocols, &dp.protocols_len, strings.Join(opts.Subprotocols, ", "))
	set(&dp.server_name, &dp.server_name_len, t.serverName)
	set(&dp.ca_file, &dp.ca_file_len, opts.TLS.RootCAFile)
	set(&dp.ca_pem, &dp.ca_pem_len, string(opts.TLS.RootCAPEM))
	defer func() {
		for _, f := range frees {
			C.free(unsafe.Pointer(f))
		}
	}()
	refs := int32(1)
	slot, gen, err := p.allocSlot(refs)
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

// Dial connects, upgrades and returns an open connection, or the reason it
// could not. The connection's events (EventOpen first) also reach Pump.
// ctx bounds the whole dial; cancelling it aborts the connection.
func (p *Pool) Dial(ctx context.Context, rawURL string, opts *DialOptions) (Conn, error) {
	if ctx == nil {
		ctx = context.Background()
	}
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
	for {
		s := atomic.LoadUint32(stp)
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
			return Conn{}, fmt.Errorf("%w: %w", ErrTimeout, err)
		}
		if p.closed.Load() {
			return Conn{}, ErrPoolClosed
		}
		futexWait(stp, s, 20*time.Millisecond)
	}
}

// DialAsync starts a dial and returns at once. EventOpen or EventError for
// the returned Conn follows through Pump. A host name is resolved before
// it returns; use an IP address to avoid that wait.
func (p *Pool) DialAsync(rawURL string, opts *DialOptions) (Conn, error) {
	slot, gen, err := p.prepare(context.Background(), rawURL, opts)
	if err != nil {
		return Conn{}, err
	}
	if err := p.command(cmdDial, 0, 0, slot, gen, nil); err != nil {
		return Conn{}, err
	}
	return Conn{p: p, slot: slot, gen: gen}, nil
}

// DialMemory opens a socketless connection whose server bytes come from
// Conn.Inject instead of a socket: it runs the same C frame parser, ring
// and pump path as a network connection. Use it to benchmark the decode
// path or to replay a captured feed.
func (p *Pool) DialMemory() (Conn, error) {
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

// ConnError is the error of a failed connection: Is matches the sentinel
// of the cause (and ErrHandshake or ErrTLS for their sub-causes).
type ConnError struct {
	Cause  error  // the most specific sentinel
	Parent error  // ErrHandshake, ErrTLS or nil
	Code   int    // close code sent or observed, or HTTP status
	Detail string // what the loop saw
}

func (e *ConnError) Error() string {
	if e.Detail == "" {
		return e.Cause.Error()
	}
	return e.Cause.Error() + ": " + e.Detail
}

// Is reports whether target is the cause or its parent category.
func (e *ConnError) Is(target error) bool {
	return target == e.Cause || (e.Parent != nil && target == e.Parent)
}

// Unwrap returns the cause.
func (e *ConnError) Unwrap() error { return e.Cause }

func makeErr(e, aux int32, code int, detail string) error {
	var cause, parent error
	switch e {
	case C.TL_E_NONE:
		return nil
	case C.TL_E_DIAL:
		cause = ErrDial
	case C.TL_E_TIMEOUT:
		cause = ErrTimeout
	case C.TL_E_HTTP:
		parent = ErrHandshake
		switch aux {
		case C.TL_HTTP_ERR_STATUS:
			cause = ErrBadStatus
		case C.TL_HTTP_ERR_ACCEPT:
			cause = ErrBadAccept
		case C.TL_HTTP_ERR_PROTOCOL:
			cause = ErrBadSubprotocol
		case C.TL_HTTP_ERR_EXTENSION:
			cause = ErrBadExtension
		case C.TL_HTTP_ERR_TOO_LARGE:
			cause = ErrHeaderTooLarge
		default:
			cause, parent = ErrHandshake, nil
		}
	case C.TL_E_PROTOCOL:
		cause = ErrProtocol
	case C.TL_E_UTF8:
		cause = ErrInvalidUTF8
	case C.TL_E_TOO_BIG:
		cause = ErrMessageTooBig
	case C.TL_E_LOST:
		cause = ErrConnectionLost
	case C.TL_E_CLOSE_TIMEOUT:
		cause = ErrCloseTimeout
	case C.TL_E_TLS:
		parent = ErrTLS
		switch aux {
		case C.TL_TLS_UNKNOWN_CA:
			cause = ErrTLSUnknownCA
		case C.TL_TLS_HOSTNAME:
			cause = ErrTLSHostname
		case C.TL_TLS_EXPIRED:
			cause = ErrTLSExpired
		case C.TL_TLS_ALPN:
			cause = ErrTLSALPN
		case C.TL_TLS_NOT_TLS:
			cause = ErrTLSNotTLS
		default:
			cause, parent = ErrTLS, nil
		}
	case C.TL_E_ABORTED:
		cause = ErrClosed
	case C.TL_E_SHUTDOWN:
		cause = ErrPoolClosed
	default:
		cause = errors.New("talaris: internal error")
	}
	return &ConnError{Cause: cause, Parent: parent, Code: code, Detail: detail}
}

// ---- Conn methods (platform half) ----

func (c Conn) live() bool {
	if c.p == nil || c.p.closed.Load() || c.slot >= uint32(len(c.p.pub)) {
		return false
	}
	pb := &c.p.pub[c.slot]
	// The slot keeps the generation after the final event until it is
	// reused: a closed connection is dead too (Conn's documented contract).
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.gen))) == c.gen &&
		atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.state))) < uint32(StateClosed)
}

func (c Conn) send(op Opcode, b []byte) error {
	if !c.live() {
		return ErrClosed
	}
	p := c.p
	maxr := p.maxRecord()
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	first := true
	for {
		chunk := b
		fin := true
		if len(chunk) > maxr {
			chunk, fin = b[:maxr], false
		}
		flags := uint8(op)
		if !first {
			flags = cmdfCont
		}
		if fin {
			flags |= cmdfFin
		}
		if err := p.putRecord(cmdSend, flags, 0, c.slot, c.gen, chunk); err != nil {
			return err
		}
		b = b[len(chunk):]
		first = false
		if fin {
			break
		}
		p.publish() // let the loop start on a large message
	}
	p.publish()
	return nil
}

func (c Conn) control(op uint8, b []byte) error {
	if len(b) > 125 {
		return ErrControlTooLong
	}
	if !c.live() {
		return ErrClosed
	}
	return c.p.command(op, 0, 0, c.slot, c.gen, b)
}

func (c Conn) closeConn(code int, reason string) error {
	if !c.live() {
		return ErrClosed
	}
	return c.p.command(cmdClose, 0, uint16(code), c.slot, c.gen, []byte(reason))
}

func (c Conn) inject(b []byte) error {
	if !c.live() {
		return ErrClosed
	}
	p := c.p
	maxr := p.maxRecord()
	p.sendMu.Lock()
	defer p.sendMu.Unlock()
	for len(b) > 0 {
		chunk := b
		if len(chunk) > maxr {
			chunk = b[:maxr]
		}
		if err := p.putRecord(cmdInject, 0, 0, c.slot, c.gen, chunk); err != nil {
			return err
		}
		b = b[len(chunk):]
	}
	p.publish()
	return nil
}

func (c Conn) state() State {
	if c.p == nil || c.p.freed.Load() || c.slot >= uint32(len(c.p.pub)) {
		return StateIdle
	}
	pb := &c.p.pub[c.slot]
	if atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.gen))) != c.gen {
		return StateClosed
	}
	return State(atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.state))))
}

func (c Conn) stats() ConnStats {
	if c.p == nil || c.p.freed.Load() || c.slot >= uint32(len(c.p.pub)) {
		return ConnStats{}
	}
	pb := &c.p.pub[c.slot]
	if atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.gen))) != c.gen {
		return ConnStats{}
	}
	ld := func(v *C.uint64_t) uint64 { return atomic.LoadUint64((*uint64)(unsafe.Pointer(v))) }
	return ConnStats{
		MsgsIn: ld(&pb.msgs_in), BytesIn: ld(&pb.bytes_in), MsgsOut: ld(&pb.msgs_out), BytesOut: ld(&pb.bytes_out),
		PingsIn: ld(&pb.pings_in), PongsIn: ld(&pb.pongs_in), WireIn: ld(&pb.wire_in), WireOut: ld(&pb.wire_out),
	}
}

func (c Conn) subprotocol() string {
	if !c.live() {
		return ""
	}
	return C.GoString(&c.p.pub[c.slot].proto[0])
}

// ---- pumping ----

const (
	modeEvents = iota
	modeData
)

// dispatch hands events [head, tail) to the callbacks and then releases
// them all with one store. Returns the number of callbacks made.
func (p *Pool) dispatch(tail uint64, fe EventFunc, fd DataFunc) int {
	n := 0
	head := p.head
	for i := head; i != tail; i++ {
		e := &p.events[i&p.evMask]
		c := Conn{p: p, slot: uint32(e.slot), gen: uint32(e.gen)}
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
			}
			fe(c, ev)
			n++
		}
		if e.flags&C.TL_EVF_FINAL != 0 {
			p.nconns.Add(-1)
			p.unref(uint32(e.slot))
		}
	}
	p.head = tail
	atomic.StoreUint64(p.evHead, tail)
	if atomic.LoadUint32(p.wantsSpace) != 0 && atomic.CompareAndSwapUint32(p.wantsSpace, 1, 0) {
		p.wakeLoop()
	}
	return n
}

func (p *Pool) enterPump() error {
	if !p.pumping.CompareAndSwap(0, 1) {
		if p.pumping.Load() == 2 || p.closed.Load() {
			return ErrPoolClosed
		}
		return ErrConcurrentPump
	}
	return nil
}

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
			tail := atomic.LoadUint64(p.evTail)
			if tail != p.head {
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
		if atomic.LoadUint64(p.evTail) == p.head && !p.closed.Load() {
			s := &p.stats.pump_sleeps
			atomic.AddUint64((*uint64)(unsafe.Pointer(s)), 1)
			futexWait(p.wakeSeq, seq, 100*time.Millisecond)
		}
		atomic.StoreUint32(p.consSleeping, 0)
	}
}

func (p *Pool) pumpOnce(fd DataFunc, fe EventFunc, iters int) (int, error) {
	if err := p.enterPump(); err != nil {
		return 0, err
	}
	defer p.leavePump()
	for i := 0; i < iters; i++ {
		tail := atomic.LoadUint64(p.evTail)
		if tail != p.head {
			return p.dispatch(tail, fe, fd), nil
		}
		if p.closed.Load() {
			return 0, ErrPoolClosed
		}
	}
	return 0, nil
}

func tlsBackend() string { return C.GoString(C.tl_tls_backend()) }

// PinCurrentThreadTo locks the calling goroutine to its OS thread and pins
// that thread to cpu.
func PinCurrentThreadTo(cpu int) error {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("talaris: pin to CPU %d: %w", cpu, err)
	}
	return nil
}
