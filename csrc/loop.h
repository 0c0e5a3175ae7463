/* loop.h - the io_uring loop: its state (struct tl_loop, each layer's part
 * in its own struct), user_data encoding, the receive-side states, and
 * the functions loop.c exports to the connection layer. Internal: Go sees
 * talaris.h and ring.h only. */
#ifndef TALARIS_LOOP_H
#define TALARIS_LOOP_H

#include <liburing.h>
#include <pthread.h>
#include <stdint.h>

#include "cmdq.h"
#include "conn.h"
#include "evq.h"
#include "ring.h"
#include "slots.h"
#include "talaris.h"
#include "tls.h"

/* user_data layout: op (8 bits) | gen (32 bits) | slot (24 bits). The
 * generation makes a late completion for a reused slot harmless. */
enum {
	TL_OPK_CONNECT = 1, /* 0 is no op: a CQE carrying it is ignored */
	TL_OPK_RECV = 2,
	TL_OPK_SEND = 3,
	TL_OPK_CANCEL = 4,
	TL_OPK_EFD = 5,
	TL_OPK_RECV_HS = 7, /* a recv on the handshake buffer group */
};

#define TL_SLOT_BITS 24
#define TL_MAX_SLOTS (1u << TL_SLOT_BITS)

static inline uint64_t tl_ud(unsigned op, uint32_t gen, uint32_t slot)
{
	return ((uint64_t)op << 56) | ((uint64_t)gen << TL_SLOT_BITS) | (slot & (TL_MAX_SLOTS - 1));
}
static inline unsigned tl_ud_op(uint64_t ud) { return (unsigned)(ud >> 56); }
static inline uint32_t tl_ud_gen(uint64_t ud) { return (uint32_t)(ud >> TL_SLOT_BITS); }
static inline uint32_t tl_ud_slot(uint64_t ud) { return (uint32_t)(ud & (TL_MAX_SLOTS - 1)); }

/* Receive side of a connection (tl_conn.rx); transitions in rx_step. */
enum {
	TL_RX_OFF = 0,  /* no recv, none wanted: not connected, ended (eof), memory, or dying */
	TL_RX_ARMED,    /* a multishot recv is in the kernel */
	TL_RX_WANT,     /* ended (-ENOBUFS, with data, regrouped, no SQE): re-arm when a slot is free */
	TL_RX_PAUSING,  /* in the kernel, cancel sent: stalled holding its share of slots */
	TL_RX_REARMING, /* in the kernel, cancel sent to switch groups (or a pause resumed early) */
	TL_RX_PAUSED,   /* ended by a pause; re-armed when the connection resumes */
};

/* Inputs of rx_step. */
enum { RX_ARM, RX_END, RX_PAUSE, RX_RESUME, RX_REGROUP, RX_TICK, RX_TEARDOWN };

struct tl_loop {
	struct tl_config cfg;
	struct io_uring ring;
	int ring_ok;
	struct tl_slots slots;  /* receive buffer groups and slot tables */

	struct tl_evq evq;      /* event ring producer and arena */

	struct tl_cmdq cmdq;    /* command ring consumer */

	/* loop.c: wake-ups, connections, timers, stalls, thread */
	int efd;
	uint64_t efd_val;
	int efd_armed;

	struct tl_conn *conns;
	struct tl_conn_pub *pub;
	struct tl_dial **dials; /* prepared by Go, taken by TL_CMD_DIAL */
	uint32_t live;          /* connections not idle */
	uint32_t timed;         /* connections with a deadline */
	uint64_t next_timer_ns;
	struct tl_conn *stalled;
	uint32_t rx_want;       /* connections in TL_RX_WANT */
	int stall_kick;         /* a send completed: stalled conns may go on */
	uint64_t last_sweep_ns; /* last look at parked connections without a wake-up */
	uint32_t rc_waits;      /* connections waiting out a reconnect backoff (no socket) */
	uint64_t rc_seed;       /* reconnect jitter generator state */

	struct tl_pool_stats *stats;

	pthread_t thread;
	int started;
	int shutting_down;
	int stop_done;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int setup_state;        /* 0 pending, 1 ok, <0 -errno */
	char setup_msg[128];
	int stop_req;           /* set by tl_loop_stop (atomic) */

	struct tl_conn_shared cs; /* conn.c's state shared by all connections */
	struct tl_tls_shared ts;  /* tls.c's state shared by all connections */

	uint32_t sample_left;     /* completions until the next sampled one (cfg.sample_every) */
	/* timers (see "Timers" below) */
	uint32_t hb_timed;      /* connections with a heartbeat check (tl_conn.hb_ns) */
	uint64_t now_ns;        /* clock cached once per loop iteration while hb_timed */
	/* loop.c: the adaptive wait (TL_WAIT_ADAPTIVE) */
	uint64_t pub_ns;          /* when events were last published; 0 once a command followed */
	uint64_t reply_gap_ns;    /* publish -> next command, last seen (UINT64_MAX: none in time) */
	/* loop.c: direct sends (tl_conn_pub.tx_own) */
	uint32_t tx_deferred;     /* connections with tx_defer set */
};

/* Timers. A connection has one field per kind of timer, each an absolute
 * CLOCK_MONOTONIC time or 0 when unarmed:
 *   deadline_ns  its lifecycle: handshake, close handshake, a failed
 *                send's drain (tl_loop_set_deadline; l->timed counts them)
 *   hb_ns        its heartbeat: read timeout and ping interval (l->hb_timed)
 * l->next_timer_ns is a lower bound of every armed time: arming one lowers
 * it, nothing else touches it. Once per loop iteration run_timers compares
 * it with the clock and, only when it is due, scans the connections, fires
 * what is due and recomputes it; the loop's wait is bounded by it, so an
 * idle loop sleeps until the nearest timer (the 20 ms sweep aside). No
 * timer work happens per message: a recv completion stores the loop's
 * cached clock in c->last_rx_ns (one store per completion) and the
 * heartbeat check compares it lazily when its time comes.
 * A new kind of timer (a reconnect delay, say) adds a field, arms it with
 * tl_loop_timer_at and is handled in conn_timers (loop.c). */

/* loop.c */

/* tl_loop_new_detached allocates a loop's rings, arena and tables with no
 * thread and no io_uring: the decoder, fuzzers and C benchmarks drive
 * tl_conn_feed on memory connections of it directly. Returns NULL on bad
 * sizes or no memory. Free with tl_loop_free. */
struct tl_loop *tl_loop_new_detached(const struct tl_config *cfg);

/* tl_loop_open_memory opens slot as a socketless connection (state open,
 * EventOpen queued): fed with TL_CMD_INJECT or tl_decoder_feed. */
void tl_loop_open_memory(struct tl_loop *l, uint32_t slot, uint32_t gen);

/* tl_loop_dial starts connection slot/gen from the parameters
 * tl_dial_prepare stored: socket, then an asynchronous connect. Failures
 * end the connection with an error event. */
void tl_loop_dial(struct tl_loop *l, uint32_t slot, uint32_t gen);

/* tl_loop_stop_reconnect ends c's reconnect policy: its next end is
 * final (Conn.Close, and an abort, call it before ending c). */
void tl_loop_stop_reconnect(struct tl_conn *c);

/* tl_loop_now_ns returns CLOCK_MONOTONIC in nanoseconds. */
uint64_t tl_loop_now_ns(void);

/* tl_loop_sqe returns a free submission entry, submitting what is queued
 * when the SQ is full; NULL if there is still none. */
struct io_uring_sqe *tl_loop_sqe(struct tl_loop *l);

/* tl_loop_set_state sets c's state and publishes it to Go (release store,
 * futex wake for a waiting Dial). */
void tl_loop_set_state(struct tl_loop *l, struct tl_conn *c, int st);

/* tl_loop_stall marks c stalled (input held back for lack of ring, arena
 * or send space) and puts it on the list resumed when space returns. */
void tl_loop_stall(struct tl_loop *l, struct tl_conn *c);

/* tl_loop_flush submits c's collected out buffer unless a send is in
 * flight (one send per connection at a time keeps bytes in order). */
void tl_loop_flush(struct tl_loop *l, struct tl_conn *c);

/* tl_loop_tx_retire adds units send units to c's retired count (written
 * to the socket, or dropped) and publishes it in tl_conn_pub.tx_done,
 * waking a SendContext that sleeps on tx_seq. */
void tl_loop_tx_retire(struct tl_loop *l, struct tl_conn *c, uint64_t units);

/* tl_loop_direct_rest takes the rest of a direct send that Go's write did
 * not finish (TL_CMD_DIRECT): when c's socket is still in the handoff Go
 * left under epoch, the bytes go out before anything else of c; otherwise
 * (the epoch ended: c failed, closed or reconnected) they are dropped.
 * Either way their n send units are retired once done. Copies p. */
void tl_loop_direct_rest(struct tl_loop *l, struct tl_conn *c, uint16_t epoch, const uint8_t *p, size_t n);

/* tl_loop_fail records why c failed (the first cause wins) and starts its
 * end: a close frame with code when open (0: none), then teardown after
 * the peer answers or a timeout. detail is copied. */
void tl_loop_fail(struct tl_loop *l, struct tl_conn *c, int err, int aux, uint16_t code, const char *detail);

/* tl_loop_teardown cancels c's operations; the socket is closed and the
 * final event published once they have all completed. Idempotent. */
void tl_loop_teardown(struct tl_loop *l, struct tl_conn *c);

/* tl_loop_abort ends c at once (Conn.Abort): queued output dropped, the
 * socket shut down both ways, then teardown; the final event is
 * EventError with TL_E_ABORTED. No-op when c is already dying. */
void tl_loop_abort(struct tl_loop *l, struct tl_conn *c);

/* tl_loop_regroup moves c's recv from the handshake buffer group to the
 * main one; called as soon as the upgrade completes. */
void tl_loop_regroup(struct tl_loop *l, struct tl_conn *c);

/* tl_loop_set_deadline arms c's lifecycle timer ns_from_now from now. */
void tl_loop_set_deadline(struct tl_loop *l, struct tl_conn *c, uint64_t ns_from_now);

/* tl_loop_timer_at makes sure the timer scan runs at or before the
 * absolute time at (a connection's timer field was just set to at). */
void tl_loop_timer_at(struct tl_loop *l, uint64_t at);

/* tl_loop_shut_wr ends c's sending side once its close handshake is
 * complete: TLS close_notify after the last frame, then shutdown(SHUT_WR)
 * when every queued byte has left (tl_loop_flush). The peer sees the end
 * at once and closes its side; the close timeout bounds the wait for
 * that. Once per connection; no-op for memory or dying connections. */
void tl_loop_shut_wr(struct tl_loop *l, struct tl_conn *c);

/* tl_loop_detail stores msg (copied, truncated) as c's public error
 * detail. */
void tl_loop_detail(struct tl_loop *l, struct tl_conn *c, const char *msg);

/* cmdq.c: tl_cmdq_drain runs the commands Go published, one handler per
 * op. Returns 1 if any ran, else 0. */
int tl_cmdq_drain(struct tl_loop *l);

/* tl_loop_emit appends one event for c: kind, payload p[0..n) copied into the
 * arena, and for control and final events code, err, aux and flags.
 * Returns 0, or -1 when the ring or arena is full (nothing was written).
 * Inline so the per-message path (constant kind, zero code) folds down to
 * tl_evq_append's fast path. */
static inline __attribute__((always_inline)) int tl_loop_emit(struct tl_loop *l, struct tl_conn *c, int kind,
							  const uint8_t *p, size_t n, uint16_t code, int err, int aux,
							  int flags)
{
	struct tl_evmeta m = {.slot = c->slot, .gen = c->gen, .code = code, .kind = (uint8_t)kind,
			      .flags = (uint8_t)flags, .err = err, .aux = aux};
	return tl_evq_append(&l->evq, m, p, n);
}

/* tl_loop_emit_inplace publishes a data message whose payload stays where it is,
 * in the slot c->cur_q (a whole frame inside one slot): no arena copy. The
 * slot is recycled only after Go has passed the event (tl_slots_release). */
static inline __attribute__((always_inline)) int tl_loop_emit_inplace(struct tl_loop *l, struct tl_conn *c, int kind,
								  const uint8_t *p, size_t n)
{
	struct tl_evmeta m = {.slot = c->slot, .gen = c->gen, .kind = (uint8_t)kind};
	if (tl_evq_append_ref(&l->evq, m, p, n) < 0)
		return -1;
	l->slots.ref[c->cur_q] = l->evq.tail;
	return 0;
}

/* ---- sampling (Config.SampleEvery): stage stamps of one completion in N ----
 *
 * A sampled completion (a recv CQE with data, or an INJECT) stamps the
 * connection (c->smp_cqe); the bytes reaching the parser stamp it again
 * (c->smp_pt: after SSL_read for wss); the next data message the
 * connection publishes carries both in the stamp table and is flagged
 * TL_EVF_STAMPED; tl_evq_publish adds the publish stamp. With sampling off
 * the cost is one predictable branch per completion (tl_loop_sample_rx),
 * per parser run (tl_loop_sample_pt) and per message (tl_loop_sample_msg),
 * each on a field already in cache. */

/* tl_loop_sample_rx counts one receive completion of c and stamps it when
 * it is the one in cfg.sample_every to sample (and c has no stamp
 * pending). immediate says the parser takes these bytes as they are, right
 * after this call (plain transport, nothing queued before them, not
 * stalled): then "plaintext ready" is the same instant and costs no second
 * clock read. */
static inline void tl_loop_sample_rx(struct tl_loop *l, struct tl_conn *c, int immediate)
{
	if (__builtin_expect(l->cfg.sample_every != 0, 0) && --l->sample_left == 0) {
		l->sample_left = l->cfg.sample_every;
		if (!c->smp_cqe) {
			c->smp_cqe = tl_loop_now_ns();
			c->smp_pt = immediate ? c->smp_cqe : 0;
		}
	}
}

/* tl_loop_sample_pt stamps "plaintext ready" for c's pending sample: the
 * parser is about to read bytes (plain: straight from the slot; wss: just
 * decrypted). */
static inline void tl_loop_sample_pt(struct tl_conn *c)
{
	if (__builtin_expect(c->smp_cqe != 0, 0) && !c->smp_pt)
		c->smp_pt = tl_loop_now_ns();
}

/* tl_loop_sample_msg attaches c's pending sample to the data event just
 * appended for c. Called for every data message. */
static inline void tl_loop_sample_msg(struct tl_loop *l, struct tl_conn *c)
{
	if (__builtin_expect(c->smp_cqe != 0, 0)) {
		uint64_t pt = c->smp_pt ? c->smp_pt : tl_loop_now_ns();
		if (l->evq.stamps)
			tl_evq_stamp(&l->evq, c->smp_cqe, pt);
		c->smp_cqe = 0;
		c->smp_pt = 0;
	}
}

/* tl_loop_sample_end drops c's pending sample when the parser has used up
 * the input without a message to carry it (a control frame, the upgrade
 * response, a partial frame): a later message must not inherit an old
 * completion's stamp. Not called when c stalls: its message is still to
 * come and the wait is part of its latency. */
static inline void tl_loop_sample_end(struct tl_conn *c)
{
	if (__builtin_expect(c->smp_cqe != 0, 0))
		c->smp_cqe = 0;
}

#endif
