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
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

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
	cfg Config // with defaults applied

	// shards are the loops (Config.Loops); shardOf[s] serves global slot s
	shards  []*shard
	shardOf []*shard
	// waitv is the pump's futex_waitv vector over every shard's wakeSeq
	// (Loops > 1), kept here so sleeping allocates nothing.
	waitv []futexWaitv
	// passShare is the most events the pump takes from one loop per pass
	// over them (Loops > 1): Config.MaxConnPendingEvents (dispatchAll).
	passShare uint64

	// per slot send admission (cmdring_linux.go): units accepted (updated
	// under the slot's shard.sendMu), refused sends, and the generation Conn.Close ended
	txAcc       []atomic.Uint64
	txFull      []atomic.Uint64
	txFullTotal atomic.Uint64 // txFull over every connection ever (Metrics.SendQueueFull)
	userClosed  []atomic.Uint32
	direct      []directSlot // direct sends (direct_linux.go)
	maxDirect   int          // largest direct message; -1 when Config.NoDirectSend

	// pub[s] is global slot s's public block in its shard's loop
	pub []*C.struct_tl_conn_pub

	slotMu sync.Mutex
	gens   []uint32
	refs   []int32 // per slot: dialer + loop references; the slot is free at 0

	nconns  atomic.Int32
	pumping atomic.Int32
	// pumpWaiting: a pump call waits for a reaper's claim (enterPump);
	// reapQuiet then takes no new claim and leaves the events to it.
	pumpWaiting atomic.Bool
	// reapLogs belongs to reapQuiet's claim (pumping 3): the lifecycle
	// records it passed, logged once it gave the claim back.
	reapLogs []reapLog
	closed   atomic.Bool
	stopped  atomic.Bool // every tl_loop_stop returned (set by Close)
	freed    atomic.Bool
	closeMu  sync.Mutex

	// Close safety. Every method that reads the loop's shared memory (the
	// public blocks, the stats, the command ring) runs between enter and
	// exit; Close adds closingBias, which refuses new entries, and waits
	// for the calls inside to leave before the loop may be freed. The
	// pump has its own claim (pumping). No lock: one atomic add each way.
	inflight  atomic.Int64
	drained   chan struct{} // closed once inflight reaches closingBias
	drainOnce sync.Once
	// quiet[slot] is the generation of a synchronous Dial's connection
	// that has not opened: if it ends without opening, its final event
	// is consumed without a callback (the caller never got the Conn; Dial
	// returned the error). EventOpen clears it.
	quiet []atomic.Uint32

	// rec folds the stamps of sampled messages into Metrics' histograms
	// (nil when Config.SampleEvery is 0). Written only by the pumper.
	rec   *metricsRecorder
	start time.Time
	// freeMu keeps tl_loop_free from running while a reader of the C
	// counters (Stats, Metrics) is between its freed check and its loads;
	// each shard's final holds its counters as they were when freed.
	freeMu sync.RWMutex

	// lastWait is how long the pump's previous wait for events lasted
	// (WaitAdaptive spins only while it is short); owned by the pumper.
	lastWait time.Duration
	// sched paces the pump's passes through Go's scheduler (pumpsched.go);
	// owned by the pumper.
	sched pumpSched

	// The reply spin (Config.ReplySpin; evring_linux.go, replySpinUntil):
	// replySpin is ReplySpin in ns when either side waits adaptively (0:
	// sends are not stamped). lastSend is the nanotime of the latest
	// accepted send (any goroutine); answered is the lastSend the pump
	// last delivered events after, replyLate that a pump's reply spin
	// ended empty since an answer last came in time (both the pumper's).
	replySpin  int64
	pumpReply  bool // replySpin != 0 and the pump waits adaptively: it takes the spin
	stampSends bool // noteSend on every accepted send: replySpin != 0 or Config.MinWait on
	lastSend   atomic.Int64
	answered   int64
	replyLate  bool
	replySpins atomic.Uint64 // PoolStats.ReplySpins
	replyLates atomic.Uint64 // PoolStats.ReplyLate

	// The pump's doorbell (Config.ReplyDoorbell; evring_linux.go,
	// sleepBell): bellEp is an epoll instance holding bellEfd (the
	// eventfd every loop writes instead of the futex while the pump
	// sleeps there) and each socket a direct send wrote to (added once
	// per socket by the sender, edge-triggered); -1 when off.
	// lastDirect is the nanotime of the latest direct send; bellEvents
	// is epoll_wait's buffer (the pumper's).
	bellEp, bellEfd int
	lastDirect      atomic.Int64
	bellSleeps      atomic.Uint64 // PoolStats.BellSleeps
	bellRings       atomic.Uint64 // PoolStats.BellRings
	bellEvents      [8]unix.EpollEvent

	// inlineAff is the CPU mask the thread of an inline loop had before
	// NewPool pinned it to LoopCPU (nil: not pinned); the loop's own
	// Close restores it before it unlocks the thread.
	inlineAff *unix.CPUSet
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
	cc.loop_wait = C.uint32_t(d.LoopWait)
	cc.spin_ns = C.uint64_t(d.SpinTime)
	if d.LoopWait == WaitAdaptive && d.ReplySpin > 0 {
		cc.reply_spin_ns = C.uint64_t(d.ReplySpin)
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
	if !d.NoTLSRecordLayer {
		cc.tls_record_layer = C.TL_TLSREC_ON
		if d.TLSLibraryGCM {
			cc.tls_record_layer = C.TL_TLSREC_LIB_GCM
		}
	}
	if d.MinWait > 0 {
		cc.min_wait_ns = C.uint64_t(d.MinWait)
		cc.min_wait_nr = C.uint32_t(d.MinWaitCompletions)
	}
	cc.conn_max_events = C.uint32_t(d.MaxConnPendingEvents)
	p := &Pool{}
	if d.InlineLoop {
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
	if d.ReplySpin > 0 && (d.LoopWait == WaitAdaptive || d.ConsumerWait == WaitAdaptive) {
		p.replySpin = int64(d.ReplySpin)
		// An inline loop's pump spins for the answer inside the loop
		// (loop.c, reply_spin), not in Go.
		p.pumpReply = d.ConsumerWait == WaitAdaptive && !d.InlineLoop
	}
	// The loop's batched wait (Config.MinWait) stops at a send, so sends
	// are stamped for it too (loop.c, batch_gate).
	p.stampSends = p.replySpin != 0 || d.MinWait > 0
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
		case i == 0 && len(d.LoopCPUs) == 0:
			cc.loop_cpu = C.int32_t(d.LoopCPU) // -1 unless LoopCPUSet
		}
		sh, err := newShard(p, &cc, base, end-base)
		if err != nil {
			p.freeShards()
			if d.InlineLoop {
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
	p.direct = make([]directSlot, d.MaxConns)
	if !d.NoDirectSend {
		p.maxDirect = min(directMax, p.maxRecord()-wsMaxHdr)
	} else {
		p.maxDirect = -1
	}
	p.bellEp, p.bellEfd = -1, -1
	// (An inline loop's pump never sleeps in Go: it waits inside the loop.)
	if d.ReplyDoorbell && !d.NoDirectSend && d.ConsumerWait == WaitAdaptive && !d.InlineLoop {
		if err := p.openBell(); err != nil {
			p.freeShards()
			return nil, err
		}
	}
	p.gens = make([]uint32, d.MaxConns)
	p.refs = make([]int32, d.MaxConns)
	p.quiet = make([]atomic.Uint32, d.MaxConns)
	p.drained = make(chan struct{})
	return p, nil
}

// pinInline pins the calling thread, which runs an inline loop, to the
// loop's CPU (LoopCPUs[0], else LoopCPU when LoopCPUSet), as a loop
// thread pins itself: the loop and the pump are this one thread. The
// mask it had is kept for unpinInline.
func (p *Pool) pinInline(d Config) error {
	cpu := d.LoopCPU
	if len(d.LoopCPUs) > 0 {
		cpu = d.LoopCPUs[0]
	}
	if cpu < 0 {
		return nil
	}
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return fmt.Errorf("%w: pin the inline loop's thread to CPU %d: %w", ErrInvalidConfig, cpu, err)
	}
	set.Set(cpu) // (ignored past the set's end)
	if set.Count() != 1 {
		return fmt.Errorf("%w: pin the inline loop's thread to CPU %d: no such CPU", ErrInvalidConfig, cpu)
	}
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("%w: pin the inline loop's thread to CPU %d: %w", ErrInvalidConfig, cpu, err)
	}
	p.inlineAff = &old
	return nil
}

// unpinInline gives the calling thread (the inline loop's) the mask it
// had before pinInline, before the thread goes back to the scheduler.
func (p *Pool) unpinInline() {
	if p.inlineAff != nil {
		unix.SchedSetaffinity(0, p.inlineAff) // best effort: the mask was this thread's
		p.inlineAff = nil
	}
}

// openBell creates the pump's doorbell (Config.ReplyDoorbell): an
// epoll instance with an eventfd in it, edge-triggered (never read: each
// write of a loop is an edge), whose number every loop's ring carries
// (cons_efd) for the wake-ups it gives while the pump sleeps there.
func (p *Pool) openBell() error {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("talaris: epoll_create1: %w", err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(ep)
		return fmt.Errorf("talaris: eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(efd)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, efd, &ev); err != nil {
		unix.Close(efd)
		unix.Close(ep)
		return fmt.Errorf("talaris: epoll_ctl: %w", err)
	}
	p.bellEp, p.bellEfd = ep, efd
	for _, sh := range p.shards {
		atomic.StoreInt32(sh.consEfd, int32(efd))
	}
	return nil
}

// closeBell closes the doorbell once the loops are gone (release).
func (p *Pool) closeBell() {
	if p.bellEp >= 0 { // (the numbers stay: nothing reads them once the loops are freed)
		unix.Close(p.bellEp)
		unix.Close(p.bellEfd)
	}
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
	var stops sync.WaitGroup
	if p.cfg.InlineLoop {
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
		if p.cfg.InlineLoop {
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
	if p.pumping.CompareAndSwap(0, 2) {
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

func (p *Pool) connCount() int {
	if p.closed.Load() {
		return 0 // every connection ended with the loop; their events were dropped
	}
	return int(p.nconns.Load())
}

// loadStats sums the loops' counters: live ones with atomic loads, the
// final copies once the loops are freed. (Every field is a count.)
func (p *Pool) loadStats() C.struct_tl_pool_stats {
	p.freeMu.RLock()
	defer p.freeMu.RUnlock()
	var out C.struct_tl_pool_stats
	dst := unsafe.Slice((*uint64)(unsafe.Pointer(&out)), unsafe.Sizeof(out)/8)
	freed := p.freed.Load()
	for _, sh := range p.shards {
		if freed {
			src := unsafe.Slice((*uint64)(unsafe.Pointer(&sh.final)), len(dst))
			for i := range src {
				dst[i] += src[i]
			}
			continue
		}
		src := unsafe.Slice((*uint64)(unsafe.Pointer(sh.cstats)), len(dst))
		for i := range src {
			dst[i] += atomic.LoadUint64(&src[i])
		}
	}
	return out
}

func (p *Pool) poolStats() PoolStats {
	s := p.loadStats()
	return PoolStats{
		Events: uint64(s.events), Batches: uint64(s.batches), CQEs: uint64(s.cqes), Rearms: uint64(s.rearms),
		NoBufs: uint64(s.nobufs), Stalls: uint64(s.stalls), LoopWakes: uint64(s.loop_wakes),
		PumpSleeps:       uint64(s.pump_sleeps),
		Reconnects:       uint64(s.reconnects),
		FairHolds:        uint64(s.fair_holds),
		TLSRecords:       uint64(s.tls_records),
		TLSRecordsOwnGCM: uint64(s.tls_records_gcm),
		MinWaits:         uint64(s.min_waits),
		RecvRevived:      uint64(s.recv_revived),
		BellSleeps:       p.bellSleeps.Load(),
		BellRings:        p.bellRings.Load(),
		ReplySpins:       p.replySpins.Load(),
		ReplyLate:        p.replyLates.Load(),
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
	m.SendQueueFull, m.Reconnects = uint64(s.sendq_full)+p.txFullTotal.Load(), uint64(s.reconnects)
	m.RecvRevived = uint64(s.recv_revived)
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
	d := &p.direct[s]
	d.sends.Store(0)
	d.handoffs.Store(0)
	d.bytes.Store(0)
	d.wire.Store(0)
	d.bellKey.Store(0)
	sh.sendMu.Unlock()
	return s, p.gens[s], nil
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
		set(&dp.sess_key, &dp.sess_key_len, pol.sessionKey(t.addrs[0].String(), t.serverName))
		dp.min_version, dp.max_version = C.uint32_t(pol.minVersion), C.uint32_t(pol.maxVersion)
	}
	set(&dp.subscribe, &dp.subscribe_len, sub)
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
	sh := p.shardOf[slot]
	if rc := C.tl_dial_prepare(sh.loop, C.uint32_t(slot-sh.base), &dp); rc != 0 {
		p.nconns.Add(-1)
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
	pb := p.pub[slot]
	stp := (*uint32)(unsafe.Pointer(&pb.state))
	var cancelled error
	// When ctx ends, the dial is aborted unless it opened meanwhile (then
	// the loop ignores the command and Dial returns the open connection:
	// the caller must not miss a Conn whose events it will see). Either
	// way the loop changes the state word, which wakes the wait below
	// without a lost wake-up. Never after Dial returned: the command needs
	// Dial's enter (and its slot reference).
	var abortMu sync.Mutex
	waiting, refused := true, false
	stop := context.AfterFunc(ctx, func() {
		abortMu.Lock()
		if waiting {
			// Fails once the pool closes; and on an inline loop's full
			// ring (this is never the loop's goroutine): a wait there
			// would keep Dial past its context. Another goroutine's
			// Dial then claims the connection (below), which aborts it
			// at the latest when it would open; the loop's goroutine's
			// Dial sends the abort itself.
			refused = p.commandOr(cmdClose, cmdfIfDialing, 1000, slot, gen, nil, true) == errRingFull
		}
		abortMu.Unlock()
	})
	defer func() {
		stop()
		abortMu.Lock()
		waiting = false
		abortMu.Unlock()
	}()
	// wss: log "TLS done" once the state passed the TLS handshake (the
	// upgrade started; a later state may be all Dial sees).
	tlsPending := p.cfg.Logger != nil && req.tls
	for {
		s := atomic.LoadUint32(stp)
		if tlsPending && (s == uint32(StateUpgrading) || s == uint32(StateOpen) ||
			atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.opened))) != 0) {
			tlsPending = false
			logTLSDone(p.cfg.Logger, p.cfg.Name, c)
		}
		if s == uint32(StateOpen) || s >= uint32(StateClosing) {
			// A connection that opened and then already ended (a short
			// stream, a drop) is still a successful dial: its events,
			// EventOpen first, are in the ring.
			if s == uint32(StateOpen) || s == uint32(StateClosing) ||
				atomic.LoadUint32((*uint32)(unsafe.Pointer(&pb.opened))) != 0 {
				// The caller has the Conn now: none of its events is
				// quiet (a pump without OnEvent does not clear it).
				p.quiet[slot].CompareAndSwap(gen, 0)
				return c, nil
			}
			if !p.closed.Load() {
				p.reapFailed(slot, gen)
			}
			ferr := atomic.LoadInt32((*int32)(unsafe.Pointer(&pb.err)))
			if cancelled == nil && ferr == cErrAborted {
				cancelled = ctx.Err() // aborted by the context before Dial looked
			}
			// A refusal that waited for its body when the context ended
			// is reported as the refusal (the loop ended the wait for
			// the abort): its status and Retry-After are what happened.
			if cancelled != nil && ferr != cErrHTTP {
				err := fmt.Errorf("%w: %w", ErrTimeout, cancelled)
				logDialFailed(p.cfg.Logger, p.cfg.Name, rawURL, err)
				return Conn{}, err
			}
			if p.closed.Load() {
				return Conn{}, ErrPoolClosed
			}
			if err := p.connErr(slot, gen); err != nil {
				return Conn{}, err
			}
			return Conn{}, ErrClosed // not reached: a failed dial records why
		}
		if p.closed.Load() {
			return Conn{}, ErrPoolClosed
		}
		if cancelled == nil {
			cancelled = ctx.Err() // the abort is on its way (above)
		}
		if p.cfg.InlineLoop {
			if p.runInline(C.TL_INLINE_ONCE) {
				if cancelled != nil {
					abortMu.Lock()
					if refused {
						refused = false
						p.command(cmdClose, cmdfIfDialing, 1000, slot, gen, nil) // (it runs the loop for room)
					}
					abortMu.Unlock()
				}
				continue
			}
			// Another goroutine's Dial on an inline pool: the loop runs
			// only when the pool's goroutine drives it (which may be
			// never, or only after a callback that waits for this Dial
			// returned), so the abort may wait in the command ring
			// while the upgrade completes. Dial returns at once and
			// claims the connection as abandoned: the loop then aborts
			// it where it would open (tl_pub_claim_open), so no event of
			// a Conn its caller never got surfaces. The claim fails only
			// when the loop opened it first: Dial returns it (the wait
			// below sees the open), as with a loop thread.
			if cancelled != nil && atomic.CompareAndSwapUint32((*uint32)(unsafe.Pointer(&pb.dial_claim)), C.TL_CLAIM_NONE, C.TL_CLAIM_ABANDONED) {
				err := fmt.Errorf("%w: %w", ErrTimeout, cancelled)
				logDialFailed(p.cfg.Logger, p.cfg.Name, rawURL, err)
				return Conn{}, err
			}
		}
		// Woken by the loop's state change (the handshake, the abort) or
		// by Close; the timeout is only a defence.
		futexWait(stp, s, 100*time.Millisecond)
	}
}

// reapFailed gives back the slot of a synchronous Dial that failed
// (reapQuiet) when nobody pumps, waiting at most reapWait for the loop to
// publish the final event it is about to publish.
func (p *Pool) reapFailed(slot, gen uint32) {
	deadline := nanotime() + int64(reapWait)
	for p.reapQuiet(slot, gen) && nanotime() < deadline {
		osYield()
	}
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
	return err
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

// runInline runs one iteration of an inline loop (Config.InlineLoop) in
// mode (TL_INLINE_NOWAIT or TL_INLINE_ONCE) when the caller is the loop's
// goroutine: one that waits for the loop - a Dial for its connection, a
// send for room - must run it itself (a call from a pump callback too:
// the callback is outside the pump's cgo call), since no other thread
// can. It reports whether it ran one: false on another goroutine (that
// one waits for the loop's goroutine as with a loop thread) or once the
// loop stopped. A wait in it is bounded (TL_INLINE_CAP_NS), so the
// caller looks at its context and Close again.
func (p *Pool) runInline(mode C.int) bool {
	rc := C.tl_loop_inline_run(p.shards[0].loop, mode)
	return rc >= 0 && rc != C.TL_INLINE_STOPPED
}
