//go:build linux && cgo

package talaris

// The Linux half: the package's one cgo preamble with build flags (the C
// core is compiled from talaris_core.c with these flags and csrc_hash.go's
// fingerprint; the other cgo files only #include the headers they read),
// and the Pool's life: its struct, NewPool's loops and Close.

/*
#cgo CFLAGS: -O2 -std=gnu11 -Wall -I${SRCDIR}/csrc -include ${SRCDIR}/csrc/tls_lib.h
#cgo pkg-config: liburing
#cgo LDFLAGS: -lpthread
#cgo amd64,!talaris_openssl,!talaris_boringssl_custom CFLAGS: -I/usr/include/android
#cgo amd64,!talaris_openssl,!talaris_boringssl_custom LDFLAGS: -L/usr/lib/x86_64-linux-gnu/android -Wl,-rpath,/usr/lib/x86_64-linux-gnu/android -lssl -lcrypto
#cgo arm64,!talaris_openssl,!talaris_boringssl_custom CFLAGS: -I/usr/include/android
#cgo arm64,!talaris_openssl,!talaris_boringssl_custom LDFLAGS: -L/usr/lib/aarch64-linux-gnu/android -Wl,-rpath,/usr/lib/aarch64-linux-gnu/android -lssl -lcrypto
#cgo talaris_openssl CFLAGS: -DTL_TLS_LIB_OPENSSL
#cgo talaris_openssl pkg-config: libssl libcrypto
#cgo talaris_boringssl_custom,!talaris_openssl CFLAGS: -DTL_TLS_LIB_CUSTOM
#cgo talaris_boringssl_custom,!talaris_openssl LDFLAGS: -lssl -lcrypto
#include <stdlib.h>
#include <string.h>
#include "csrc/talaris.h"
#include "csrc/codec/http.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/talaris-go/talaris/internal/testhook"
)

// The C codes mirrored in errors.go and talaris.go: each pair of array types
// has a negative length, and fails to compile, unless the two sides are
// equal.
type (
	_ [C.TL_E_NONE - cErrNone]byte
	_ [cErrNone - C.TL_E_NONE]byte
	_ [C.TL_E_DIAL - cErrDial]byte
	_ [cErrDial - C.TL_E_DIAL]byte
	_ [C.TL_E_TIMEOUT - cErrTimeout]byte
	_ [cErrTimeout - C.TL_E_TIMEOUT]byte
	_ [C.TL_E_HTTP - cErrHTTP]byte
	_ [cErrHTTP - C.TL_E_HTTP]byte
	_ [C.TL_E_PROTOCOL - cErrProtocol]byte
	_ [cErrProtocol - C.TL_E_PROTOCOL]byte
	_ [C.TL_E_UTF8 - cErrUTF8]byte
	_ [cErrUTF8 - C.TL_E_UTF8]byte
	_ [C.TL_E_TOO_BIG - cErrTooBig]byte
	_ [cErrTooBig - C.TL_E_TOO_BIG]byte
	_ [C.TL_E_LOST - cErrLost]byte
	_ [cErrLost - C.TL_E_LOST]byte
	_ [C.TL_E_CLOSE_TIMEOUT - cErrCloseTimeout]byte
	_ [cErrCloseTimeout - C.TL_E_CLOSE_TIMEOUT]byte
	_ [C.TL_E_TLS - cErrTLS]byte
	_ [cErrTLS - C.TL_E_TLS]byte
	_ [C.TL_E_ABORTED - cErrAborted]byte
	_ [cErrAborted - C.TL_E_ABORTED]byte
	_ [C.TL_E_SHUTDOWN - cErrShutdown]byte
	_ [cErrShutdown - C.TL_E_SHUTDOWN]byte
	_ [C.TL_E_READ_TIMEOUT - cErrReadTimeout]byte
	_ [cErrReadTimeout - C.TL_E_READ_TIMEOUT]byte
	_ [C.TL_CMD_ABORT - cmdAbort]byte
	_ [cmdAbort - C.TL_CMD_ABORT]byte
	_ [C.TL_CMD_DIRECT - cmdDirect]byte
	_ [cmdDirect - C.TL_CMD_DIRECT]byte

	_ [C.TL_TLS_UNKNOWN_CA - cTLSUnknownCA]byte
	_ [cTLSUnknownCA - C.TL_TLS_UNKNOWN_CA]byte
	_ [C.TL_TLS_HOSTNAME - cTLSHostname]byte
	_ [cTLSHostname - C.TL_TLS_HOSTNAME]byte
	_ [C.TL_TLS_EXPIRED - cTLSExpired]byte
	_ [cTLSExpired - C.TL_TLS_EXPIRED]byte
	_ [C.TL_TLS_ALPN - cTLSALPN]byte
	_ [cTLSALPN - C.TL_TLS_ALPN]byte
	_ [C.TL_TLS_NOT_TLS - cTLSNotTLS]byte
	_ [cTLSNotTLS - C.TL_TLS_NOT_TLS]byte
	_ [C.TL_TLS_PIN - cTLSPin]byte
	_ [cTLSPin - C.TL_TLS_PIN]byte

	_ [C.TL_HTTP_ERR_TOO_LARGE - cHTTPTooLarge]byte
	_ [cHTTPTooLarge - C.TL_HTTP_ERR_TOO_LARGE]byte
	_ [C.TL_HTTP_ERR_STATUS - cHTTPStatus]byte
	_ [cHTTPStatus - C.TL_HTTP_ERR_STATUS]byte
	_ [C.TL_HTTP_ERR_ACCEPT - cHTTPAccept]byte
	_ [cHTTPAccept - C.TL_HTTP_ERR_ACCEPT]byte
	_ [C.TL_HTTP_ERR_PROTOCOL - cHTTPProtocol]byte
	_ [cHTTPProtocol - C.TL_HTTP_ERR_PROTOCOL]byte
	_ [C.TL_HTTP_ERR_EXTENSION - cHTTPExtension]byte
	_ [cHTTPExtension - C.TL_HTTP_ERR_EXTENSION]byte
)

func tlsBackend() string { return C.GoString(C.tl_tls_backend()) }

func pinCurrentThreadTo(cpu int) error {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("talaris: pin to CPU %d: %w", cpu, err)
	}
	return nil
}

// shard is one loop thread and what Go holds of it: its rings, its public
// blocks and counters, and the global slots [base, base+n) it serves.
// Config.Loops of them make a Pool; a connection lives on one for its
// whole life (slot s on shardOf[s]).
type shard struct {
	p    *Pool
	loop *C.struct_tl_loop
	base uint32 // global slot of the loop's slot 0
	n    uint32 // slots the loop holds

	// event ring (consumer side), owned by the pumper
	ev           evConsumer
	consSleeping *uint32
	wakeSeq      *uint32
	wantsSpace   *uint32
	consEfd      *int32 // the pump's doorbell eventfd (Pool.bellEfd) for this loop

	// command ring (producer side), guarded by sendMu
	sendMu       sync.Mutex
	cmdBuf       []byte
	cmdSize      uint64
	cmdTail      *uint64
	cmdHead      *uint64
	loopSleeping *uint32
	sentNs       *uint64 // tl_cmdring.sent_ns: the latest accepted send, for the loop's reply spin
	efd          int
	tail         uint64 // local copy of *cmdTail
	headCache    uint64
	spaceSeq     *uint32 // futex word the loop bumps after a drain while prodWaiting
	prodWaiting  *uint32

	cstats *C.struct_tl_pool_stats
	final  C.struct_tl_pool_stats // the counters when the loop was freed (under Pool.freeMu)
	// gone: tl_loop_stop returned, nothing reads the command ring any
	// more (a direct send's rest is queued until then; cmdring_linux.go).
	gone atomic.Bool

	// under Pool.slotMu: the free slots (global numbers) and how many are
	// taken (a dial picks the shard with the fewest)
	free []uint32
	used int
}

type pool struct {
	cfg settings // with defaults applied and the knobs resolved

	// shards are the loops (Config.Loops); shardOf[s] serves global slot s
	shards  []*shard
	shardOf []*shard
	// waitv is the pump's futex_waitv vector over every shard's wakeSeq
	// (Loops > 1), kept here so sleeping allocates nothing.
	waitv []futexWaitv
	// passShare is the most events the pump takes from one loop per pass
	// over them (Loops > 1): testhook.Knobs.MaxConnPendingEvents (dispatchAll).
	passShare uint64

	// pub[s] is global slot s's public block in its shard's loop
	pub []*C.struct_tl_conn_pub

	// nconns is ConnCount: the connections that have not ended. counted[s]
	// is the generation slot s is counted for (0: not counted), so that a
	// connection leaves the count once (uncount), whichever comes first:
	// its final event consumed, or its synchronous Dial returning the error.
	nconns  atomic.Int32
	counted []atomic.Uint32
	pumping atomic.Int32

	// inlineAff is the CPU mask the thread of an inline loop had before
	// NewPool pinned it to LoopCPU (nil: not pinned); the loop's own
	// Close restores it before it unlocks the thread.
	inlineAff *unix.CPUSet

	sendAdmission // per-slot send admission (cmdring_linux.go)
	slotTable     // slot generations and references (dial_linux.go)
	failedDials   // failed synchronous Dials (reap_linux.go)
	lifecycle     // Close safety (below)
	poolMetrics   // sampled-message histograms (metrics_linux.go)
	pumpWait      // the pumper's wait state (pump_linux.go)
	doorbell      // the reply doorbell (wake_linux.go)
}

// lifecycle is the Pool's close state: Close's flags and the entry
// count that keeps the loops' memory alive for the calls inside.
type lifecycle struct {
	closed  atomic.Bool
	stopped atomic.Bool // every tl_loop_stop returned (set by Close)
	freed   atomic.Bool
	closeMu sync.Mutex

	// Close safety. Every method that reads the loop's shared memory (the
	// public blocks, the stats, the command ring) runs between enter and
	// exit; Close adds closingBias, which refuses new entries, and waits
	// for the calls inside to leave before the loop may be freed. The
	// pump has its own claim (pumping). No lock: one atomic add each way.
	inflight  atomic.Int64
	drained   chan struct{} // closed once inflight reaches closingBias
	drainOnce sync.Once
	// freeMu keeps tl_loop_free from running while a reader of the C
	// counters (Stats, Metrics) is between its freed check and its loads;
	// each shard's final holds its counters as they were when freed.
	freeMu sync.RWMutex
}

// closingBias is added to inflight by Close: far above any real count.
const closingBias = 1 << 40

// enter admits a call that reads the loop's shared memory; false once
// Close started. A true enter must be paired with exit.
func (p *Pool) enter() bool {
	if p.drained == nil {
		return false // a zero Pool, not made by NewPool: as a closed one
	}
	if p.inflight.Add(1) >= closingBias {
		p.exit()
		return false
	}
	return true
}

// exit ends a call admitted by enter; the last one out after Close
// started lets Close go on.
func (p *Pool) exit() {
	if p.inflight.Add(-1) == closingBias {
		p.drainOnce.Do(func() { close(p.drained) })
	}
}

func newPool(cfg Config) (*Pool, error) {
	d, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if testhook.NoTLSRecordLayer {
		d.Tuning.NoTLSRecordLayer = true // the test suite's pass with the library's SSL_read only
	}
	var cc C.struct_tl_config
	cc.sq_entries = C.uint32_t(d.SQEntries)
	cc.cq_entries = C.uint32_t(d.CQEntries)
	cc.ring_flags = C.uint32_t(d.RingFlags)
	cc.sq_thread_idle_ms = C.uint32_t(d.SQPollIdle / time.Millisecond)
	cc.sq_thread_cpu = -1
	if d.RingFlags&testhook.RingSQAff != 0 {
		cc.sq_thread_cpu = C.int32_t(d.SQPollCPU)
	}
	cc.ring_flags &^= C.uint32_t(testhook.RingSQAff)
	cc.buf_size = C.uint32_t(d.BufSize)
	cc.buf_count = C.uint32_t(d.BufCount)
	cc.loop_wait = d.loopWait.c()
	cc.spin_ns = C.uint64_t(d.SpinTime)
	if d.loopWait == WaitAdaptive && d.Tuning.ReplySpin > 0 {
		cc.reply_spin_ns = C.uint64_t(d.Tuning.ReplySpin)
	}
	cc.event_ring_size = C.uint32_t(d.EventRingSize)
	cc.arena_size = C.uint64_t(d.ArenaSize)
	cc.cmd_ring_size = C.uint64_t(d.CmdRingSize)
	cc.max_message = C.uint64_t(d.MaxMessageSize)
	cc.handshake_timeout_ns = C.uint64_t(d.HandshakeTimeout)
	cc.close_timeout_ns = C.uint64_t(d.CloseTimeout)
	cc.max_send_queue = C.uint64_t(d.MaxSendQueue)
	cc.sample_every = C.uint32_t(d.SampleEvery)
	if !d.NoRecvBundle {
		cc.recv_bundle = 1
	}
	if d.NoRecvProbe {
		cc.no_recv_probe = 1
	}
	if !d.Tuning.NoTLSRecordLayer {
		cc.tls_record_layer = C.TL_TLSREC_ON
		if d.Tuning.NoOwnGCM {
			cc.tls_record_layer = C.TL_TLSREC_LIB_GCM
		}
	}
	if d.Tuning.MinWait > 0 {
		cc.min_wait_ns = C.uint64_t(d.Tuning.MinWait)
		cc.min_wait_nr = C.uint32_t(d.MinWaitCompletions)
	}
	cc.conn_max_events = C.uint32_t(d.MaxConnPendingEvents)
	if d.Tuning.Prefault {
		cc.prefault = 1
	}
	p := &Pool{}
	if d.Tuning.InlineLoop {
		cc.inline_loop = 1
		// The ring is created on this thread, which alone may run it:
		// this goroutine stays on it until Close.
		runtime.LockOSThread()
		if err := p.pinInline(d); err != nil {
			runtime.UnlockOSThread()
			return nil, err
		}
	}
	cc.conn_max_bytes = C.uint64_t(d.MaxConnPendingBytes)

	p.cfg = d
	if d.Tuning.ReplySpin > 0 && (d.loopWait == WaitAdaptive || d.consumerWait == WaitAdaptive) {
		p.replySpin = int64(d.Tuning.ReplySpin)
		// An inline loop's pump spins for the answer inside the loop
		// (loop/wait.c, reply_spin), not in Go.
		p.pumpReply = d.consumerWait == WaitAdaptive && !d.Tuning.InlineLoop
	}
	// The loop's batched wait (Config.Tuning.MinWait) stops at a send, so sends
	// are stamped for it too (loop/wait.c, batch_gate).
	p.stampSends = p.replySpin != 0 || d.Tuning.MinWait > 0
	p.start = time.Now()
	if d.SampleEvery != 0 {
		p.rec = newMetricsRecorder()
	}
	p.pub = make([]*C.struct_tl_conn_pub, d.MaxConns)
	p.shardOf = make([]*shard, d.MaxConns)
	for i := 0; i < d.Loops; i++ {
		// Loop i serves slots [MaxConns*i/Loops, MaxConns*(i+1)/Loops).
		base := uint32(uint64(d.MaxConns) * uint64(i) / uint64(d.Loops))
		end := uint32(uint64(d.MaxConns) * uint64(i+1) / uint64(d.Loops))
		cc.max_conns = C.uint32_t(end - base)
		cc.loop_cpu = -1
		switch {
		case i < len(d.LoopCPUs):
			cc.loop_cpu = C.int32_t(d.LoopCPUs[i])
		}
		sh, err := newShard(p, &cc, base, end-base)
		if err != nil {
			p.freeShards()
			if d.Tuning.InlineLoop {
				p.unpinInline()
				runtime.UnlockOSThread()
			}
			return nil, err
		}
		p.shards = append(p.shards, sh)
	}
	p.passShare = uint64(d.MaxConnPendingEvents)
	if d.Loops > 1 {
		p.waitv = make([]futexWaitv, d.Loops)
		for i, sh := range p.shards {
			p.waitv[i].uaddr = uint64(uintptr(unsafe.Pointer(sh.wakeSeq)))
			p.waitv[i].flags = futex2Size32 | futex2Private
		}
	}
	p.txAcc = make([]atomic.Uint64, d.MaxConns)
	p.txFull = make([]atomic.Uint64, d.MaxConns)
	p.userClosed = make([]atomic.Uint32, d.MaxConns)
	p.rcPolicy = make([]atomic.Bool, d.MaxConns)
	p.dropSeen = make([]atomic.Uint64, d.MaxConns)
	p.flushDrops = make([]atomic.Uint64, d.MaxConns)
	p.direct = make([]directSlot, d.MaxConns)
	if !d.NoDirectSend {
		p.maxDirect = min(directMax, p.maxRecord()-wsMaxHdr)
	} else {
		p.maxDirect = -1
	}
	p.bellEp, p.bellEfd = -1, -1
	// (An inline loop's pump never sleeps in Go: it waits inside the loop.)
	if d.ReplyDoorbell && !d.NoDirectSend && d.consumerWait == WaitAdaptive && !d.Tuning.InlineLoop {
		if err := p.openBell(); err != nil {
			p.freeShards()
			return nil, err
		}
	}
	p.gens = make([]uint32, d.MaxConns)
	p.refs = make([]int32, d.MaxConns)
	p.quiet = make([]atomic.Uint32, d.MaxConns)
	p.counted = make([]atomic.Uint32, d.MaxConns)
	p.drained = make(chan struct{})
	if cc.tls_record_layer == C.TL_TLSREC_ON {
		// Run the own AES-GCM's power-on self-test and speed race now
		// (once per process, about 2 ms), not inside the first TLS
		// handshake, and say so if either ruled it out: every record is
		// then opened with the library's.
		if C.tl_gcm_supported() == 0 && d.Logger != nil {
			if C.tl_gcm_selftest_failed() != 0 {
				d.Logger.Warn("talaris: own AES-GCM failed its power-on self-test; the TLS library's AES-GCM opens every record",
					"pool", d.Name)
			} else if C.tl_gcm_library_faster() != 0 {
				d.Logger.Info("talaris: the TLS library's AES-GCM measured faster than the own on this CPU; it opens every record",
					"pool", d.Name)
			}
		}
	}
	return p, nil
}

// newShard starts one loop for the global slots [base, base+n) and maps
// its rings and blocks.
func newShard(p *Pool, cc *C.struct_tl_config, base, n uint32) (*shard, error) {
	var cerr C.int
	var msg [160]C.char
	loop := C.tl_loop_new(cc, &cerr, &msg[0], C.size_t(len(msg)))
	if loop == nil {
		return nil, fmt.Errorf("%w: %s (%w)", ErrInvalidConfig, C.GoString(&msg[0]), unix.Errno(-cerr))
	}
	sh := &shard{p: p, loop: loop, base: base, n: n}
	sh.ev = newEvConsumer(loop, p)
	sh.ev.base = base
	sh.ev.rec = p.rec
	sh.ev.onEvent = p.cfg.OnEvent
	evr := C.tl_loop_evring(loop)
	sh.consSleeping = (*uint32)(unsafe.Pointer(&evr.cons_sleeping))
	sh.wakeSeq = (*uint32)(unsafe.Pointer(&evr.wake_seq))
	sh.wantsSpace = (*uint32)(unsafe.Pointer(&evr.loop_wants_space))
	sh.consEfd = (*int32)(unsafe.Pointer(&evr.cons_efd))
	cmr := C.tl_loop_cmdring(loop)
	sh.cmdBuf = unsafe.Slice((*byte)(unsafe.Pointer(cmr.buf)), int(cmr.size))
	sh.cmdSize = uint64(cmr.size)
	sh.cmdTail = (*uint64)(unsafe.Pointer(&cmr.tail))
	sh.cmdHead = (*uint64)(unsafe.Pointer(&cmr.head))
	sh.sentNs = (*uint64)(unsafe.Pointer(&cmr.sent_ns))
	sh.loopSleeping = (*uint32)(unsafe.Pointer(&cmr.loop_sleeping))
	sh.efd = int(cmr.efd)
	sh.spaceSeq = (*uint32)(unsafe.Pointer(&cmr.space_seq))
	sh.prodWaiting = (*uint32)(unsafe.Pointer(&cmr.prod_waiting))
	sh.cstats = C.tl_loop_stats(loop)
	pub := unsafe.Slice(C.tl_loop_conns(loop), int(n))
	sh.free = make([]uint32, 0, n)
	for i := int(n) - 1; i >= 0; i-- {
		s := base + uint32(i)
		p.pub[s] = &pub[i]
		p.shardOf[s] = sh
		sh.free = append(sh.free, s)
	}
	return sh, nil
}

// freeShards stops and frees the loops of a Pool that failed to start.
func (p *Pool) freeShards() {
	for _, sh := range p.shards {
		C.tl_loop_stop(sh.loop)
		C.tl_loop_free(sh.loop)
	}
	p.shards = nil
}

func (p *Pool) close() error {
	if p.drained == nil {
		return nil // a zero Pool: nothing to close (its calls say ErrPoolClosed)
	}
	p.closeMu.Lock()
	defer p.closeMu.Unlock()
	if p.closed.Swap(true) {
		return nil
	}
	// Refuse new calls; the ones inside see closed and leave promptly (a
	// Dial's wait, a Send waiting for ring room, a SendContext).
	if p.inflight.Add(closingBias) == closingBias {
		p.drainOnce.Do(func() { close(p.drained) })
	}
	// Producers see closed and queue nothing more, except the rest of a
	// direct send's short write (handoff): the loop, finishing its close
	// handshakes, waits for that rest before its close frame, so the rest
	// must get in while the loop runs (holding sendMu across the stop
	// kept it out, and the close waited for CloseTimeout). Once a loop is
	// gone nothing reads its ring: a rest still waiting for room there
	// gives up (the bump wakes it). The loops stop at once, each on its
	// own goroutine (tl_loop_stop joins a thread that may be finishing
	// close handshakes for up to CloseTimeout: in turn, N loops would take
	// N times that).
	// A producer inside sendMu finishes its records (a batch goes in
	// whole, rest): once each lock has been taken and let go, everything
	// accepted is in the rings, and the loop runs it before it starts to
	// shut down (loop_top). An inline loop's tl_loop_stop runs its
	// commands the same way; a batch there is never half-put (SendBatch
	// checks it fits first: inlineBatchFits).
	if !p.cfg.Tuning.InlineLoop {
		for _, sh := range p.shards {
			sh.sendMu.Lock()
			sh.sendMu.Unlock() // (empty: a barrier behind the producers inside)
		}
	}
	var stops sync.WaitGroup
	if p.cfg.Tuning.InlineLoop {
		// No thread to join: on the loop's own thread (this goroutine
		// made the pool) the stop runs the close handshakes here, so it
		// must not move to another goroutine; on another thread it waits
		// until the loop's thread is out of the loop (inline_stop).
		sh := p.shards[0]
		atomic.AddUint32(sh.spaceSeq, 1)
		futexWake(sh.spaceSeq)
		if C.tl_loop_inline_owner(sh.loop) != 0 {
			defer runtime.UnlockOSThread()
			defer p.unpinInline()
		}
		C.tl_loop_stop(sh.loop)
		sh.gone.Store(true)
		atomic.AddUint32(sh.spaceSeq, 1)
		futexWake(sh.spaceSeq)
	}
	for _, sh := range p.shards {
		if p.cfg.Tuning.InlineLoop {
			break
		}
		// A producer asleep waiting for ring room holds sendMu: wake it
		// (it sees closed and lets go).
		atomic.AddUint32(sh.spaceSeq, 1)
		futexWake(sh.spaceSeq)
		stops.Go(func() {
			C.tl_loop_stop(sh.loop)
			sh.gone.Store(true)
			atomic.AddUint32(sh.spaceSeq, 1)
			futexWake(sh.spaceSeq)
		})
	}
	stops.Wait()
	// Wake the dialers. The loop is gone, so Go may write the public
	// blocks: a dialer's slot is marked closed first (its command may
	// still have been in the ring, and a wake without a change could be
	// lost between its check and its sleep).
	p.slotMu.Lock()
	for s, r := range p.refs {
		if r > 1 {
			st := (*uint32)(unsafe.Pointer(&p.pub[s].state))
			if atomic.LoadUint32(st) < uint32(StateClosed) {
				atomic.StoreUint32(st, uint32(StateClosed))
			}
			futexWake(st)
		}
	}
	p.slotMu.Unlock()
	// Wake every SendContext (each sees closed and returns): the bump
	// changes the word it sleeps on, so none can miss it.
	for i := range p.pub {
		seq := (*uint32)(unsafe.Pointer(&p.pub[i].tx_seq))
		atomic.AddUint32(seq, 1)
		futexWake(seq)
	}
	<-p.drained
	// Wake a sleeping pumper so it sees closed. A pumper inside a
	// callback (Close may be called from one) frees the loop on its way
	// out: Close does not wait for it. Before stopped: once it is set, a
	// pumper leaving may free the loop's wake words and close the
	// doorbell under these wakes.
	for _, sh := range p.shards {
		atomic.AddUint32(sh.wakeSeq, 1)
		futexWake(sh.wakeSeq)
	}
	if p.bellEfd >= 0 { // or one asleep on its doorbell
		unix.Write(p.bellEfd, one[:])
	}
	// Only now may release free the loop: a pumper that saw closed and
	// left early must not run tl_loop_free (and a second pthread_join)
	// while tl_loop_stop above is still joining the thread, nor while a
	// call above still read the loop's memory.
	p.stopped.Store(true)
	p.release()
	return nil
}

// release frees the C loop once Close stopped it and nobody pumps.
func (p *Pool) release() {
	if !p.stopped.Load() {
		return // Close has not stopped the loop yet; it releases itself
	}
	if p.pumping.CompareAndSwap(pumpFree, pumpFreed) {
		p.freeMu.Lock()
		if !p.freed.Load() {
			for _, sh := range p.shards {
				sh.final = *sh.cstats // the loop thread has exited: plain reads are fine
			}
			p.freed.Store(true)
			for _, sh := range p.shards {
				C.tl_loop_free(sh.loop)
			}
			p.closeBell() // no loop writes it, no pumper waits on it, no sender adds to it
		}
		p.freeMu.Unlock()
	}
}

// c returns w's number in the C loop's TL_WAIT_* codes (the Go values
// differ: WaitAdaptive, the default, is Go's zero).
func (w WaitStrategy) c() C.uint32_t {
	switch w {
	case WaitBlock:
		return C.TL_WAIT_BLOCK
	case WaitSpin:
		return C.TL_WAIT_SPIN
	case WaitSpinThenBlock:
		return C.TL_WAIT_SPIN_THEN_BLOCK
	}
	return C.TL_WAIT_ADAPTIVE
}
