/* loop/state.h - struct tl_loop: the state of one loop, each layer's part in
 * its own member (slots, evq, cmdq, cs, ts) or field group. Data only: it
 * declares no function, so a file below the loop that includes it (ws/,
 * transport/, base/pub.c, base/timer.c) can reach the loop's lower layers
 * through it but cannot call the loop (loop/loop.h declares that). Internal: Go sees talaris.h
 * and ring.h only. */
#ifndef TALARIS_STATE_H
#define TALARIS_STATE_H

#include <liburing.h>
#include <pthread.h>
#include <stdint.h>

#include "loop/cmdq.h"
#include "ws/conn.h"
#include "base/evq.h"
#include "ring.h"
#include "base/slots.h"
#include "talaris.h"
#include "transport/tls.h"

struct tl_loop {
	struct tl_config cfg;
	struct io_uring ring;
	int ring_ok;
	int recv_bundle;        /* cfg.recv_bundle and the kernel has IORING_FEAT_RECVSEND_BUNDLE (rx.c arms bundles) */
	uint32_t bundle_len;    /* bytes one bundle may take (sqe->len; 0: no cap, the kernel refused one) */
	struct tl_slots slots;  /* receive buffer groups and slot tables */

	struct tl_evq evq;      /* event ring producer and arena */

	struct tl_cmdq cmdq;    /* command ring consumer */

	/* the loop's core (wake-ups, thread, sweep), life.c (connections, stalls,
	 * reconnect), timer.c (timers) */
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
	uint64_t last_probe_ns; /* last look at the sockets of silent recvs (loop/probe.c, tl_loop_probe_recvs) */
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
	/* An inline loop (cfg.inline_loop): who runs it now (atomic): 0 no one,
	 * 1 its thread inside tl_loop_inline_run or tl_loop_stop, 2 never again
	 * (stopped, or marked dead by a tl_loop_stop on another thread). */
	uint32_t driving;
	int inline_busy;        /* the last iteration did work: the next one looks without waiting */

	struct tl_conn_shared cs; /* ws/'s state shared by all connections */
	struct tl_tls_shared ts;  /* the TLS transport's state shared by all connections */

	uint32_t sample_left;     /* completions until the next sampled one (cfg.sample_every) */
	/* timers (see "Timers" below) */
	uint32_t hb_timed;      /* connections with a heartbeat check (tl_conn.hb_ns) */
	uint64_t now_ns;        /* clock cached once per loop iteration while hb_timed */
	/* loop/wait.c: the adaptive wait (TL_WAIT_ADAPTIVE) */
	uint64_t pub_ns;          /* when events were last published; 0 once a command followed */
	uint64_t reply_gap_ns;    /* publish -> next command, last seen (UINT64_MAX: none in time) */
	/* loop/wait.c: the reply spin (cfg.reply_spin_ns) */
	uint64_t answered_ns;     /* the tl_cmdring.sent_ns the last publish answered */
	uint32_t reply_late;      /* a reply spin ended empty and no answer came in time since */
	uint32_t send_follows;    /* the last send came within TL_PRESEND(cfg) of the publish before it */
	uint64_t last_pub_ns;     /* the last publish to an awake pump (0: it slept) */
	/* loop/wait.c: minimum-wait batching (cfg.min_wait_ns; wait_batched) */
	int ring_reg;             /* io_uring_register_ring_fd succeeded: enter by the registered index */
	uint32_t mw_ok;           /* cfg.min_wait_ns and the kernel has IORING_FEAT_MIN_TIMEOUT */
	uint32_t mw_streak;       /* blocking waits in a row that each followed >= one slot of received bytes */
	uint64_t mw_wire;         /* stats->wire_bytes at the last blocking wait (nothing is counted while it sleeps) */
	uint64_t mw_sent;         /* tl_cmdring.sent_ns when the streak was last reset */
	uint64_t mw_iter;         /* stats->wire_bytes at the last busy look (busy_batch) */
	/* tx.c: a send found no free SQE (tl_tx_submit): tl_loop_run_rearms flushes
	 * the connections again next iteration (the wait is 1 ms meanwhile) */
	uint32_t tx_retry;
	/* tx.c: direct sends (tl_conn_pub.tx_own) */
	uint32_t tx_deferred;     /* connections with tx_defer set */
	/* Receive fairness (conn_held in ws/frames.c, tl_loop_fair_tick in loop/stall.c): a
	 * connection at its share of the event ring is held only while
	 * another connection is light (not itself at its share in this or
	 * the previous epoch of TL_FAIR_EPOCH_NS: its next message would wait
	 * behind the flood), or while the ring is under pressure (a quarter
	 * of its events or of the arena pending). Floods alone, each at its
	 * share, are not held: their messages wait behind one another
	 * whatever the loop does, and holding them only made loop and pump
	 * take turns. */
	uint32_t fair_epoch;      /* current epoch (starts at 2: tl_conn.fair_heavy 0 is light) */
	uint32_t fair_light;      /* connections with a socket that are light (recounted each epoch) */
	uint32_t fair_seen;       /* live - rc_waits at the last recount */
	uint64_t fair_epoch_ns;   /* when the current epoch ends */
	uint64_t fair_press_events; /* pending events from which every share is enforced */
	uint64_t fair_press_bytes;  /* pending arena bytes from which every share is enforced */
};

/* Timers. A connection has one field per kind of timer, each an absolute
 * CLOCK_MONOTONIC time or 0 when unarmed:
 *   deadline_ns  its lifecycle: handshake, close handshake, a failed
 *                send's drain (tl_timer_set_deadline; l->timed counts them)
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
 * tl_timer_at and is handled in conn_timers (tick.c). */

#endif
