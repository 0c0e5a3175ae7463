/* loop/internal.h - what the files of the loop's own core (dispatch.c,
 * probe.c, run.c, setup.c, stall.c, wait.c, api.c) share among
 * themselves: their timing constants and counters, small helpers
 * (inline), and the functions one of them calls in another. Nothing
 * outside loop/ includes it. */
#ifndef TALARIS_LOOP_INTERNAL_H
#define TALARIS_LOOP_INTERNAL_H

#include "loop/loop.h"

#include <pthread.h>

#define TL_CQE_BATCH 256
#define TL_SWEEP_NS 20000000ull
/* TL_PROBE_NS: how often the loop polls the sockets of silent recvs
 * (tl_loop_probe_recvs). */
#define TL_PROBE_NS 250000000ull
/* Probes in a row that find a cancelled recv's END missing before the
 * loop ends it itself (RX_STUCK): 0.75-1 s, where an END follows its
 * cancel within the same tl_loop_reap. */
#define TL_PROBE_STUCK 4
/* Receive fairness: how long a connection found at its share stays heavy
 * (struct tl_loop, fair_epoch): long enough that floods keep each other
 * heavy between two looks, short enough that one that went quiet soon
 * counts as light (protected) again. */
#define TL_FAIR_EPOCH_NS 5000000ull

#define STAT_ADD(l, f, n) __atomic_store_n(&(l)->stats->f, (l)->stats->f + (n), __ATOMIC_RELAXED)
#define PUB_ADD(p, f, n) __atomic_store_n(&(p)->f, (p)->f + (n), __ATOMIC_RELAXED)

/* loop_defers says the ring posts completions only when the loop enters
 * the kernel (DEFER_TASKRUN or COOP_TASKRUN): a loop that looks without
 * sleeping must call io_uring_get_events first. */
static inline int loop_defers(const struct tl_loop *l)
{
	return !!(l->cfg.ring_flags & (IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN));
}

static inline int space_freed(struct tl_loop *l)
{
	if (l->stall_kick)
		return 1;
	return (l->stalled || tl_slots_deferred(&l->slots)) && tl_evq_head_moved(&l->evq);
}

/* is_owner says the calling thread created inline loop l:
 * tl_loop_inline_run refuses every other thread, since SINGLE_ISSUER and
 * DEFER_TASKRUN bind the ring to its creator. */
static inline int is_owner(const struct tl_loop *l) { return pthread_equal(pthread_self(), l->thread); }

/* dispatch.c: completions. */
void tl_loop_recv_settle(struct tl_loop *l, struct tl_conn *c);
int tl_loop_reap(struct tl_loop *l);

/* probe.c: lost recvs. */
int tl_loop_probe_recvs(struct tl_loop *l);

/* stall.c: parked connections, re-arms and the sweep. */
void tl_loop_release_deferred(struct tl_loop *l);
void tl_loop_fair_tick(struct tl_loop *l);
int tl_loop_run_stalled(struct tl_loop *l);
void tl_loop_run_rearms(struct tl_loop *l, int sweep);

/* wait.c: the wait between iterations. */
void tl_loop_wait(struct tl_loop *l, int busy);
void tl_loop_note_answer(struct tl_loop *l, uint64_t pub_ns);

/* run.c: iterations. */
void tl_loop_run(struct tl_loop *l);
void tl_loop_inline_finish(struct tl_loop *l);
void tl_loop_inline_stop(struct tl_loop *l);

#endif
