/* loop/wait.c - the loop's wait between iterations: look, spin or block
 * per cfg.loop_wait (the adaptive spins for a command or an answer),
 * announce the sleep to Go (loop_sleeping, loop_wants_space, the eventfd
 * read), bound the sleep by timers and the sweep tick, and batch waits
 * behind a flood (min_wait_usec). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/internal.h"

#include <errno.h>
#include <sched.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static void arm_efd(struct tl_loop *l)
{
	struct io_uring_sqe *sqe;
	if (l->efd_armed)
		return;
	sqe = tl_uring_sqe(l);
	if (!sqe)
		return;
	io_uring_prep_read(sqe, l->efd, &l->efd_val, sizeof(l->efd_val), 0);
	io_uring_sqe_set_data64(sqe, tl_ud(TL_OPK_EFD, 0, 0));
	l->efd_armed = 1;
}

/* spin_look is one look of the adaptive spins (adaptive_spin,
 * reply_spin): at a command or a stop request, or every 8th look at a
 * completion or freed space, it returns 1 (work); otherwise it pauses
 * and returns 0. The command ring is a load; completions cost a syscall under
 * DEFER_TASKRUN, so they are looked at less often. The yield hands the
 * CPU to a thread waiting to run on this one (a busy 2-CPU machine: the
 * pump or the peer): spinning over it delayed the very answer spun for by
 * the whole spin (measured: p50 + spin_ns). *i counts the looks. */
static inline int spin_look(struct tl_loop *l, unsigned *i)
{
	if (tl_cmdq_pending(&l->cmdq) || (!l->stop_done && __atomic_load_n(&l->stop_req, __ATOMIC_RELAXED)))
		return 1;
	if ((++*i & 7) == 0) {
		if (loop_defers(l))
			io_uring_get_events(&l->ring);
		if (io_uring_cq_ready(&l->ring) || space_freed(l))
			return 1;
		sched_yield();
	}
	__builtin_ia32_pause();
	return 0;
}

/* adaptive_spin is TL_WAIT_ADAPTIVE's spin for a command. Right after the loop
 * published events a command often follows at once: the pump's callback
 * answers a message (an order acknowledged, the next order sent). While the
 * last answer came within spin_ns of its publish, the loop spins until
 * spin_ns after this publish, looking for a command (and completions)
 * rather than sleeping: the sender then finds it awake and writes no
 * eventfd, and the loop is spared a wake-up. A spin that ends empty stops
 * the spinning until an answer is seen in time again (measured on the
 * wake-up that answer causes), so a pool that only reads, or an idle one,
 * does not spin. Nothing spins while waiting for the network: on a small
 * machine the peer (or the feed) needs that CPU. Returns 1 when work
 * turned up, 0 when the caller should block. */
static int adaptive_spin(struct tl_loop *l)
{
	uint64_t until;
	unsigned i = 0;

	if (!l->pub_ns || l->reply_gap_ns > l->cfg.spin_ns)
		return 0;
	until = l->pub_ns + l->cfg.spin_ns;
	while (tl_timer_now_ns() < until)
		if (spin_look(l, &i))
			return 1;
	l->reply_gap_ns = UINT64_MAX;
	return 0;
}

/* reply_spin is TL_WAIT_ADAPTIVE's spin for the network, taken while
 * Go's latest send (tl_cmdring.sent_ns) is unanswered and within
 * cfg.reply_spin_ns: an order waits for its acknowledgement. On a machine
 * whose idle CPUs halt, the answer's completion then finds the loop
 * running instead of waking it (tens of microseconds per round trip).
 * Right after a publish to an awake pump it also waits up to spin_ns for
 * such a send: a callback answering a message sends directly, without a
 * command the loop would see (adaptive_spin waits for commands). It stops
 * at the first command, stop request or completion, and it yields as it
 * goes: the peer on the same machine may need this CPU to answer. A spin
 * for an answer that ends empty turns it off (reply_late) until an answer
 * again comes within reply_spin_ns of its send (tl_loop_note_answer), so a pool
 * that sends into silence does not spin on every send. Returns 1 when
 * work turned up, 0 when the caller should block. */
static int reply_spin(struct tl_loop *l)
{
	uint64_t sent, until;
	unsigned i = 0;
	int waited;

	if (!l->cfg.reply_spin_ns || l->reply_late)
		return 0;
	sent = l->answered_ns;
	/* waiting for a send, while sends have been following publishes */
	until = l->pub_ns && l->send_follows ? l->pub_ns + TL_PRESEND(&l->cfg) : 0;
	waited = until != 0;
	for (;;) {
		uint64_t s = __atomic_load_n(&l->cmdq.r->sent_ns, __ATOMIC_RELAXED);

		if (s != sent) { /* a send to answer: spin for the answer */
			sent = s;
			until = s + l->cfg.reply_spin_ns;
		}
		if (tl_timer_now_ns() >= until)
			break;
		if (spin_look(l, &i))
			return 1;
	}
	if (sent != l->answered_ns)
		l->reply_late = 1; /* that send's answer did not come in time */
	else if (waited)
		l->send_follows = 0; /* no send came after the publish */
	return 0;
}

/* tl_loop_note_answer runs at a publish while the reply spin is configured: the
 * events answer Go's latest send unless an earlier publish did. An answer
 * within reply_spin_ns of its send turns the reply spin (back) on; a send
 * that came within TL_PRESEND of the publish before it (a callback or the
 * pump's caller answering what it was given) turns the wait for such a
 * send on. One relaxed load per publish; the clock only once per send. */
void tl_loop_note_answer(struct tl_loop *l, uint64_t pub_ns)
{
	uint64_t sent = __atomic_load_n(&l->cmdq.r->sent_ns, __ATOMIC_RELAXED);
	uint64_t now;

	if (sent == l->answered_ns) {
		l->last_pub_ns = pub_ns;
		return;
	}
	now = pub_ns ? pub_ns : tl_timer_now_ns();
	l->answered_ns = sent;
	l->reply_late = now > sent && now - sent > l->cfg.reply_spin_ns;
	if (l->last_pub_ns && sent > l->last_pub_ns)
		l->send_follows = sent - l->last_pub_ns <= TL_PRESEND(&l->cfg);
	l->last_pub_ns = pub_ns;
}

/* Minimum-wait batching (cfg.min_wait_ns; kernel 6.12+,
 * IORING_FEAT_MIN_TIMEOUT). A loop that outruns a flood empties the
 * socket, sleeps and is woken for the next few kilobytes: one wake-up of
 * a halted vCPU, a task switch and a publish (often a futex wake of the
 * pump) per small completion. With min_wait_usec the kernel waits up to
 * that long for wait_nr completions and then returns with whatever came,
 * so the socket fills meanwhile and the next completion carries a larger
 * bundle. Under DEFER_TASKRUN a connection whose recv already has task
 * work queued adds no second item, so with one connection the wait is
 * simply min_wait_usec; with many it ends at wait_nr of them. Data that
 * arrives after min_wait_usec (nothing having come before) wakes the loop
 * at once: a wait is delayed by at most min_wait_usec, and only data that
 * came within it.
 *
 * The gate (batch_gate) keeps a lone message from waiting: it batches only
 * after TL_MW_STREAK blocking waits in a row each followed iterations that
 * received at least one receive slot (cfg.buf_size) of bytes - the socket
 * filled that much while the loop was busy, which a feed of one message
 * every 50 us, a ping-pong or an idle connection never does - and no send
 * since the streak began (tl_cmdring.sent_ns: an answer may be due, and
 * the reply spin's case is a lone completion). A wait that follows less
 * than a slot ends the streak, so after a flood at most one wait is
 * batched. Not taken with a stalled connection, a recv waiting for slots,
 * a send to retry or to hand back, nor for an inline loop (its caller
 * looks at Go's side between waits). */
#define TL_MW_STREAK 4
/* A busy iteration that received less than this many receive slots of
 * bytes (but some) while the gate is open: the loop is ahead of the
 * flood, and its next look would take a small completion (busy_batch). */
#define TL_MW_SMALL_SLOTS 16u

/* mw_nothing_waits says whether no work is held back that a batched
 * wait would delay: a stalled connection, a recv waiting for slots, a
 * send to retry or to hand back. An inline loop never batches: its
 * caller looks at Go's side between waits. */
static inline int mw_nothing_waits(const struct tl_loop *l)
{
	return !l->stalled && !l->rx_want && !l->tx_retry && !l->tx_deferred && !l->cfg.inline_loop;
}

/* batch_gate updates the gate's state at a blocking wait bounded by
 * wait_ns (0: none) and says whether that wait may be batched. */
static int batch_gate(struct tl_loop *l, uint64_t wait_ns)
{
	uint64_t wire = __atomic_load_n(&l->stats->wire_bytes, __ATOMIC_RELAXED); /* written by this thread only */
	uint64_t sent = __atomic_load_n(&l->cmdq.r->sent_ns, __ATOMIC_RELAXED);
	int heavy = wire - l->mw_wire >= l->cfg.buf_size;

	l->mw_wire = wire;
	if (sent != l->mw_sent || !heavy) {
		l->mw_sent = sent;
		l->mw_streak = 0;
		return 0;
	}
	if (l->mw_streak < TL_MW_STREAK)
		l->mw_streak++;
	return l->mw_streak >= TL_MW_STREAK && wait_ns > l->cfg.min_wait_ns && mw_nothing_waits(l);
}

/* busy_batch says whether the look after a busy iteration should be a
 * batched wait (up to cfg.min_wait_ns, not longer: the loop has not
 * announced a sleep, so Go's commands do not wake it) instead of a look
 * that takes whatever trickled in meanwhile: a loop ahead of a flood
 * otherwise turns it into many small completions and publishes, each a
 * kernel entry and often a futex wake of the pump. Only while the gate is
 * open (batch_gate's streak, no send since) and the iteration received
 * some bytes but fewer than TL_MW_SMALL_SLOTS slots: a loop behind the
 * flood (large completions) or busy with commands looks at once. */
static int busy_batch(struct tl_loop *l)
{
	uint64_t wire = __atomic_load_n(&l->stats->wire_bytes, __ATOMIC_RELAXED);
	uint64_t got = wire - l->mw_iter;

	l->mw_iter = wire;
	return l->mw_streak >= TL_MW_STREAK && got && got < (uint64_t)TL_MW_SMALL_SLOTS * l->cfg.buf_size &&
	       __atomic_load_n(&l->cmdq.r->sent_ns, __ATOMIC_RELAXED) == l->mw_sent && mw_nothing_waits(l);
}

/* wait_batched submits what is queued and waits up to wait_ns for
 * cfg.min_wait_nr completions, returning after cfg.min_wait_ns with any
 * that came (see above). liburing 2.3 has no helper for min_wait_usec, so
 * it enters the ring itself (by the registered index when there is one).
 * Returns 0 when it waited (completions or not: -ETIME, -EINTR are
 * waits), -1 when the kernel refused the argument - the caller then waits
 * as before, and mw_ok is cleared for good. */
static int wait_batched(struct tl_loop *l, uint64_t wait_ns)
{
	struct __kernel_timespec ts;
	struct io_uring_getevents_arg arg;
	unsigned flags = IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG;
	int fd = l->ring.ring_fd;
	long ret;

	io_uring_submit(&l->ring); /* no syscall when nothing is queued */
	ts.tv_sec = (long long)(wait_ns / 1000000000ull);
	ts.tv_nsec = (long long)(wait_ns % 1000000000ull);
	memset(&arg, 0, sizeof(arg));
	arg.pad = (uint32_t)(l->cfg.min_wait_ns / 1000); /* min_wait_usec */
	arg.ts = (uint64_t)(uintptr_t)&ts;
	if (l->ring_reg) {
		fd = l->ring.enter_ring_fd;
		flags |= IORING_ENTER_REGISTERED_RING;
	}
	ret = syscall(__NR_io_uring_enter, fd, 0u, l->cfg.min_wait_nr, flags, &arg, sizeof(arg));
	if (ret < 0 && errno == EINVAL) {
		l->mw_ok = 0;
		return -1;
	}
	STAT_ADD(l, min_waits, 1);
	return 0;
}

void tl_loop_wait(struct tl_loop *l, int busy)
{
	struct __kernel_timespec ts;
	struct io_uring_cqe *cqe;
	uint64_t wait_ns = 0;
	int spin = l->cfg.loop_wait == TL_WAIT_SPIN;

	if (l->cfg.loop_wait == TL_WAIT_ADAPTIVE && !busy) {
		io_uring_submit(&l->ring);
		if (loop_defers(l))
			io_uring_get_events(&l->ring);
		if (io_uring_cq_ready(&l->ring) || adaptive_spin(l) || reply_spin(l))
			return;
	} else if (busy || spin || l->cfg.loop_wait == TL_WAIT_SPIN_THEN_BLOCK || l->cfg.loop_wait == TL_WAIT_DEFAULT) {
		/* a WaitSpin loop never sleeps, not even for a batch */
		if (busy && !spin && l->mw_ok && busy_batch(l) && wait_batched(l, l->cfg.min_wait_ns) == 0)
			return;
		io_uring_submit(&l->ring);
		if (loop_defers(l))
			io_uring_get_events(&l->ring);
		if (io_uring_cq_ready(&l->ring) || busy || spin)
			return;
		/* spin-then-block: spin on the CQ and the command ring a while */
		uint64_t until = tl_timer_now_ns() + l->cfg.spin_ns;
		while (tl_timer_now_ns() < until) {
			if (loop_defers(l))
				io_uring_get_events(&l->ring);
			if (io_uring_cq_ready(&l->ring) || tl_cmdq_pending(&l->cmdq) || space_freed(l))
				return;
			__builtin_ia32_pause();
		}
	}
	/* Block. Announce it, then look once more (Go checks the flag after
	 * publishing, so one of us sees the other). */
	arm_efd(l);
	__atomic_store_n(&l->cmdq.r->loop_sleeping, 1, __ATOMIC_SEQ_CST);
	/* Ask the pump for a wake-up when it frees space only if someone waits
	 * for it: a stalled connection, or a recv starved of slots that are
	 * held by unconsumed in-place payloads. Otherwise deferred slots go
	 * back on the next natural wake-up, without an extra syscall. */
	if (!l->cfg.inline_loop && (l->stalled || (tl_slots_deferred(&l->slots) && l->rx_want)))
		__atomic_store_n(&l->evq.r->loop_wants_space, 1, __ATOMIC_SEQ_CST);
	if (tl_cmdq_pending(&l->cmdq) || space_freed(l) || (l->tx_deferred && tl_tx_deferred_ready(l)) ||
	    (!l->stop_done && __atomic_load_n(&l->stop_req, __ATOMIC_SEQ_CST))) {
		__atomic_store_n(&l->cmdq.r->loop_sleeping, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&l->evq.r->loop_wants_space, 0, __ATOMIC_RELAXED);
		io_uring_submit(&l->ring);
		return;
	}
	if (tl_tick_armed(l)) {
		uint64_t now = tl_timer_now_ns();
		/* No cap: next_timer_ns is never later than the earliest deadline
		 * (tl_timer_at lowers it, tl_tick_run recomputes it), and
		 * while a connection with a socket lives the sweep tick below
		 * bounds the wait anyway. Only handles waiting out a reconnect
		 * backoff then sleep until their deadline. */
		wait_ns = l->next_timer_ns > now ? l->next_timer_ns - now : 0;
	}
	if ((l->rx_want || l->tx_retry) && (wait_ns == 0 || wait_ns > 1000000ull))
		wait_ns = 1000000ull;
	/* Sweep tick: while connections live, wake at least every 20 ms and
	 * look at the parked ones again (stalled, waiting for a re-arm,
	 * holding deferred slots), so a missed wake-up costs a tick, never a
	 * hang. */
	if (l->live > l->rc_waits && (wait_ns == 0 || wait_ns > TL_SWEEP_NS))
		wait_ns = TL_SWEEP_NS;
	/* An inline loop's caller looks at Go's side (Close, a context)
	 * between calls: never wait longer than that (it only asks to wait
	 * when the pump has drained every event, so no stall waits for it;
	 * the pump is this thread, so space wakes it by no eventfd). */
	if (l->cfg.inline_loop && (wait_ns == 0 || wait_ns > TL_INLINE_CAP_NS))
		wait_ns = TL_INLINE_CAP_NS;
	if (wait_ns && l->mw_ok && batch_gate(l, wait_ns) && wait_batched(l, wait_ns) == 0) {
		/* waited, batched */
	} else if (wait_ns) {
		ts.tv_sec = (long long)(wait_ns / 1000000000ull);
		ts.tv_nsec = (long long)(wait_ns % 1000000000ull);
		io_uring_submit_and_wait_timeout(&l->ring, &cqe, 1, &ts, NULL);
	} else if (tl_tick_armed(l)) {
		io_uring_submit(&l->ring);
	} else {
		io_uring_submit_and_wait(&l->ring, 1);
	}
	__atomic_store_n(&l->cmdq.r->loop_sleeping, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&l->evq.r->loop_wants_space, 0, __ATOMIC_RELAXED);
}
