/* loop/loop.c - the io_uring loop: thread and setup, the wait, CQE dispatch
 * (recv, send, connect, cancel completions), the stall list, re-arms and
 * the sweep, shutdown, and the C API (talaris.h). The top of the C core:
 * it calls cmdq.c, tick.c, life.c and the layers below; nothing calls it
 * but Go (and decoder.c, for a detached loop). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/loop.h"
#include "transport/tls_verify.h"

#include <errno.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define TL_CQE_BATCH 256
#define TL_SWEEP_NS 20000000ull
/* TL_PROBE_NS: how often the loop polls the sockets of silent recvs
 * (probe_recvs). */
#define TL_PROBE_NS 250000000ull
/* Probes in a row that find a cancelled recv's END missing before the
 * loop ends it itself (RX_STUCK): 0.75-1 s, where an END follows its
 * cancel within the same reap. */
#define TL_PROBE_STUCK 4
/* Receive fairness: how long a connection found at its share stays heavy
 * (struct tl_loop, fair_epoch): long enough that floods keep each other
 * heavy between two looks, short enough that one that went quiet soon
 * counts as light (protected) again. */
#define TL_FAIR_EPOCH_NS 5000000ull

#define STAT_ADD(l, f, n) __atomic_store_n(&(l)->stats->f, (l)->stats->f + (n), __ATOMIC_RELAXED)
#define PUB_ADD(p, f, n) __atomic_store_n(&(p)->f, (p)->f + (n), __ATOMIC_RELAXED)

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

/* ---- completions ---- */

/* recv_settle moves c on after a recv completion (or the probe's ending
 * of a stuck recv): a dying connection may finish, a live one parses
 * what it has (and fails once its queue is parsed after an EOF or an
 * error), pauses when stalled, leaves the handshake group once open. */
static void recv_settle(struct tl_loop *l, struct tl_conn *c)
{
	if (c->dying) {
		tl_life_maybe_finish(l, c);
		return;
	}
	if (!c->stalled)
		tl_life_drive(l, c);
	else if (c->eof)
		tl_life_stall(l, c);
	if (c->stalled && !c->dying)
		tl_rx_step(l, c, RX_PAUSE, 0);
	tl_rx_step(l, c, RX_REGROUP, 0);
}

static void on_recv(struct tl_loop *l, struct tl_conn *c, struct io_uring_cqe *cqe, int hs)
{
	int more = !!(cqe->flags & IORING_CQE_F_MORE);

#ifdef TL_DEBUG
	if (c->debug_lose_end && !more && cqe->res == -ECANCELED) {
		c->debug_lose_end = 0; /* a test's lost completion: the recv stays ARMED */
		return;
	}
#endif
	c->rx_ticks++;
	if (cqe->flags & IORING_CQE_F_BUFFER) {
		/* One buffer, or a bundle's several (tl_slots_take). */
		uint32_t last, n;
		uint32_t q = tl_slots_take(&l->slots, hs, cqe->flags >> IORING_CQE_BUFFER_SHIFT, cqe->res, &last, &n);
		if (cqe->res <= 0 || (c->discard && !tl_conn_watch_notify(c))) {
			tl_slots_recycle_chain(&l->slots, q);
		} else {
			tl_sample_rx(l, c, !c->is_tls && !c->stalled && tl_rxq_empty(&c->rxq));
			tl_rxq_push_chain(&l->slots, &c->rxq, q, last, n);
			PUB_ADD(&l->pub[c->slot], wire_in, (uint64_t)cqe->res);
			STAT_ADD(l, wire_bytes, (uint64_t)cqe->res);
			c->last_rx_ns = l->now_ns; /* heartbeat: one store per completion */
		}
	}
	if (!more)
		tl_rx_step(l, c, RX_END, cqe->res);
	recv_settle(l, c);
}

static void on_send(struct tl_loop *l, struct tl_conn *c, int res)
{
	struct tl_outbuf *ob = &c->out[c->cur ^ 1];

	c->send_inflight = 0;
	if (res < 0) {
		tl_pub_tx_retire(l, c, ob->units);
		ob->units = 0;
		ob->len = 0;
		ob->replies = 0;
		c->sent_off = 0;
		if (!c->dying && c->state >= TL_ST_OPEN && !c->fail_err && !c->close_rcvd && !c->send_errno) {
			/* The peer reset while we wrote (a pong racing its RST). What
			 * it sent before is still in our socket or slot queue,
			 * acknowledged: keep reading it (the recv ends with the same
			 * error or EOF, and tl_conn_on_eof fails the connection once the queue
			 * is parsed) rather than drop frames the server did send.
			 * Writes are dropped from here on; the close timeout bounds
			 * the wait. */
			c->send_errno = -res;
			tl_conn_tx_drop_all(l, c);
			if (!c->deadline_ns)
				tl_timer_set_deadline(l, c, l->cfg.close_timeout_ns);
			return;
		}
		if (!c->dying) {
			c->eof = 1;
			c->eof_errno = -res;
			tl_life_fail(l, c, TL_E_LOST, -res, 1006, strerror(-res));
		}
		tl_life_maybe_finish(l, c);
		return;
	}
	PUB_ADD(&l->pub[c->slot], wire_out, (uint64_t)res);
	c->sent_off += (size_t)res;
	if (c->sent_off < ob->len && !c->dying) {
		/* Short send: the rest goes before anything newer (tl_life_flush
		 * resumes it if no SQE is free now). */
		tl_tx_submit(l, c, ob);
		return;
	}
	tl_pub_tx_retire(l, c, ob->units);
	tl_outbuf_reset(ob);
	c->sent_off = 0;
	if (c->dying) {
		tl_life_maybe_finish(l, c);
		return;
	}
	tl_life_flush(l, c);
	if (c->stalled) /* input may have waited for send space */
		l->stall_kick = 1;
}

static void on_connect(struct tl_loop *l, struct tl_conn *c, int res)
{
	int r;

	c->connect_inflight = 0;
	if (c->dying) {
		tl_life_maybe_finish(l, c);
		return;
	}
	if (res < 0) {
		struct tl_dial *d = c->dial;
		if (d && d->next_alt < d->nalt) {
			/* The name had more addresses: try the next one (the
			 * handshake deadline bounds them all). Nothing else is in
			 * flight on this socket. */
			close(c->fd);
			c->fd = -1;
			tl_life_start_connect(l, c, &d->alt[d->next_alt++]);
			return;
		}
		tl_life_fail(l, c, TL_E_DIAL, -res, 0, strerror(-res));
		return;
	}
	tl_rx_step(l, c, RX_ARM, 0);
	if (c->is_tls) {
		tl_pub_set_state(l, c, TL_ST_TLS);
		r = tl_tls_start(l, c);
	} else {
		tl_pub_set_state(l, c, TL_ST_UPGRADING);
		r = tl_conn_start_upgrade(l, c);
	}
	tl_life_after(l, c);
	if (r < 0 || c->dying)
		return;
	tl_life_flush(l, c);
}

static void handle_cqe(struct tl_loop *l, struct io_uring_cqe *cqe)
{
	uint64_t ud = io_uring_cqe_get_data64(cqe);
	unsigned raw = tl_ud_op(ud), op = raw & TL_OPK_MASK;
	uint32_t slot = tl_ud_slot(ud), gen = tl_ud_gen(ud);
	struct tl_conn *c;

	if (op == TL_OPK_EFD) {
		l->efd_armed = 0;
		STAT_ADD(l, loop_wakes, 1);
		return;
	}
	if (op == 0 || slot >= l->cfg.max_conns)
		return;
	c = &l->conns[slot];
	if (c->gen != gen || (c->state == TL_ST_IDLE && !c->final_pending) ||
	    ((op == TL_OPK_RECV || op == TL_OPK_RECV_HS) && raw >> TL_OPK_EPOCH_SHIFT != c->rx_epoch)) {
		/* Stale: only buffers may need to go back (a bundle's all). */
		if (cqe->flags & IORING_CQE_F_BUFFER) {
			uint32_t last, n;
			tl_slots_recycle_chain(&l->slots, tl_slots_take(&l->slots, op == TL_OPK_RECV_HS,
									cqe->flags >> IORING_CQE_BUFFER_SHIFT,
									cqe->res, &last, &n));
		}
		return;
	}
	switch (op) {
	case TL_OPK_RECV:
	case TL_OPK_RECV_HS:
		on_recv(l, c, cqe, op == TL_OPK_RECV_HS);
		break;
	case TL_OPK_SEND:
		on_send(l, c, cqe->res);
		break;
	case TL_OPK_CONNECT:
		on_connect(l, c, cqe->res);
		break;
	case TL_OPK_CANCEL:
		c->cancel_inflight--;
		if (cqe->res == -ENOENT)
			tl_rx_step(l, c, RX_GONE, 0);
		else if (cqe->res == 0 && tl_rx_in_kernel(c) && c->rx_ticks == c->rx_cancel_ticks)
			/* Found, and nothing of that recv (an END, a re-arm) has come
			 * since: its END is due (probe_recvs). */
			c->rx_cancel_hit = 1;
		tl_life_maybe_finish(l, c);
		break;
	}
}

/* ---- timers, stalls, re-arms ---- */

/* release_deferred recycles consumed slots whose in-place payloads the pump
 * has passed. Slots are queued in release order, which is close to event
 * order; one still referenced holds back the ones behind it a little. */
static void release_deferred(struct tl_loop *l)
{
	if (!tl_slots_deferred(&l->slots))
		return;
	tl_evq_refresh(&l->evq);
	tl_slots_release_deferred(&l->slots, l->evq.head_cache);
}

/* fair_tick keeps l->fair_light (the connections with a socket that are
 * light, see conn_held_slow in conn.c) up to date: recounted when an
 * epoch ends or a connection comes or goes, decremented by conn.c when
 * one turns heavy. One clock read per iteration while counting is on; the
 * scan runs once per epoch. Held connections are looked at again when none
 * is light any more (they may go on). */
static void fair_tick(struct tl_loop *l)
{
	uint32_t seen = l->live - l->rc_waits, light = 0, sparse;
	uint64_t now = tl_timer_now_ns();

	if (now < l->fair_epoch_ns && seen == l->fair_seen)
		return;
	if (now >= l->fair_epoch_ns) {
		l->fair_epoch++;
		l->fair_epoch_ns = now + TL_FAIR_EPOCH_NS;
	}
	l->fair_seen = seen;
	/* A light connection has few events pending now (a quarter of its
	 * share): with the pump behind by many events per connection, every
	 * one of them is part of the backlog, none waits alone behind it. */
	tl_evq_refresh(&l->evq);
	sparse = l->cfg.conn_max_events / 4;
	for (uint32_t i = 0; i < l->cfg.max_conns; i++) {
		struct tl_conn *c = &l->conns[i];
		c->fair_light = 0;
		c->fair_skip = c->fair_skip_w = 0; /* a skip lasts until a recount at most (conn_held_slow) */
		/* A connection with input of its own waiting (stalled, held,
		 * its recv paused or starved of slots) is not light: it is a
		 * flood the loop holds back, not a message about to arrive. */
		if (c->state != TL_ST_IDLE && !c->dying && !c->rc_wait && c->fd >= 0 &&
		    c->fair_heavy + 1 < l->fair_epoch && !c->stalled && c->rx != TL_RX_WANT &&
		    c->rx != TL_RX_PAUSING && c->rx != TL_RX_PAUSED && l->evq.own_events[c->slot] < sparse) {
			c->fair_light = 1;
			light++;
		}
	}
	l->fair_light = light;
	if (!light && l->stalled)
		l->stall_kick = 1;
}

/* run_stalled resumes the stalled connections that can go on. Returns how
 * many it acted on: 0 when every one is still held at its share, so the
 * loop does not count the pass as work (a busy iteration does not block,
 * and the loop would spin through the pump's every head store). */
static int run_stalled(struct tl_loop *l)
{
	struct tl_conn *list = l->stalled, *c;
	int ran = 0;
	l->stalled = NULL;
	tl_evq_refresh(&l->evq);
	while ((c = list) != NULL) {
		list = c->stall_next;
		c->on_stall_list = 0;
		c->stalled = 0;
		if (c->final_pending) {
			ran++;
			tl_life_finish(l, c);
			continue;
		}
		if (c->rc_pending) {
			ran++;
			tl_life_end_or_reconnect(l, c);
			continue;
		}
		/* A connection may have ended while it sat on the list: its slot
		 * is Go's again and must not be driven (nor one waiting to
		 * reconnect: it has no socket). */
		if (c->dying || c->state == TL_ST_IDLE || c->rc_wait)
			continue;
		if (tl_conn_fair_still_held(l, c)) {
			c->stalled = 1;
			c->on_stall_list = 1;
			c->stall_next = l->stalled;
			l->stalled = c;
			continue;
		}
		c->fair_held = 0;
		ran++;
		tl_life_drive(l, c);
		tl_rx_step(l, c, RX_RESUME, 0);
	}
	return ran;
}

/* has_output says c has bytes a flush would hand to the kernel (or a
 * SHUT_WR it would do); the caller checked that no send is in flight. */
static int has_output(const struct tl_conn *c)
{
	if (c->send_errno)
		return 0; /* a flush only drops: the socket refused a send */
	return c->out[c->cur ^ 1].len > c->sent_off || tl_conn_collecting(c) != 0 ||
	       (c->sq.head != c->sq.len && c->state >= TL_ST_OPEN) || c->shut_wr == 1;
}

/* run_rearms re-arms the recvs waiting in TL_RX_WANT when their group has
 * a slot to give (else -ENOBUFS again), and flushes again after a send
 * found no free SQE (l->tx_retry). With sweep set it also looks for work
 * nothing asked for: a connection whose recv ended without the state
 * machine noting it, or output with no send in flight and no retry
 * pending. Both are defences only - every recv end goes through
 * tl_rx_step, every framing is followed by a flush, every SQE shortage
 * sets tx_retry - so a debug build (TL_DEBUG: the cgo.mk test and fuzz
 * builds) aborts if it finds either. */
static void run_rearms(struct tl_loop *l, int sweep)
{
	int retry = l->tx_retry != 0;

	l->tx_retry = 0;
	for (uint32_t i = 0; i < l->cfg.max_conns && (l->rx_want || sweep || retry); i++) {
		struct tl_conn *c = &l->conns[i];
		if (sweep && c->rx == TL_RX_OFF && !c->dying && !c->eof && c->fd >= 0 && c->state != TL_ST_IDLE &&
		    c->state != TL_ST_CONNECTING) {
#ifdef TL_DEBUG
			fprintf(stderr, "talaris: sweep found slot %u with no recv (state %d)\n", c->slot, c->state);
			abort();
#endif
			tl_rx_step(l, c, RX_LOST, 0);
		}
		if (c->rx == TL_RX_WANT)
			tl_rx_step(l, c, RX_TICK, 0);
		if (c->send_inflight || c->dying || c->fd < 0 || c->state == TL_ST_IDLE || c->state == TL_ST_CONNECTING)
			continue;
		if (retry) {
			/* Output left behind when no SQE was free (a short send's
			 * rest, a buffer never submitted). */
			tl_life_flush(l, c);
		} else if (sweep && !c->tx_defer && has_output(c)) { /* parked: a Go sender holds the socket */
#ifdef TL_DEBUG
			fprintf(stderr, "talaris: sweep found unsent output on slot %u (state %d)\n", c->slot, c->state);
			abort();
#endif
			tl_life_flush(l, c);
		}
	}
}

/* ---- the loop ---- */

/* publish_before_resume publishes what this iteration's completions
 * appended before run_stalled lets held connections parse again: a
 * message that arrived beside a flood (an order's answer) then reaches
 * the pump without waiting for the flood's next share to be parsed. */
static void publish_before_resume(struct tl_loop *l)
{
	if (l->evq.tail != l->evq.published)
		tl_evq_publish(&l->evq);
}

static int space_freed(struct tl_loop *l)
{
	if (l->stall_kick)
		return 1;
	return (l->stalled || tl_slots_deferred(&l->slots)) && tl_evq_head_moved(&l->evq);
}

static void shutdown_all(struct tl_loop *l)
{
	/* Stalled connections go on (their events are dropped from now on,
	 * see ring_full in conn.c) so their close handshakes can be read. */
	if (l->stalled)
		l->stall_kick = 1; /* (cleared by run_stalled, which runs only when one is) */
	for (uint32_t i = 0; i < l->cfg.max_conns; i++) {
		struct tl_conn *c = &l->conns[i];
		if (c->final_pending) {
			tl_life_finish(l, c); /* shutting down: the event is dropped if there is no room */
			continue;
		}
		if (c->rc_pending) {
			tl_life_end_or_reconnect(l, c); /* no reconnect while shutting down: final */
			continue;
		}
		if (c->state == TL_ST_IDLE || c->dying)
			continue;
		if (!c->fail_err && !c->close_rcvd) {
			c->fail_err = TL_E_SHUTDOWN;
			c->fail_code = 1001;
			tl_pub_detail(l, c, "pool closed");
		}
		if (c->state == TL_ST_OPEN && !c->close_sent && c->fd >= 0 && !c->eof && !c->send_errno) {
			/* Going away: send 1001 and let the close handshake run (the
			 * echo, then TCP's end), bounded by the close timeout. */
			tl_conn_send_close(l, c, 1001, (const uint8_t *)"pool closed", 11);
			tl_life_after(l, c);
			if (c->dying)
				continue;
			tl_pub_set_state(l, c, TL_ST_CLOSING);
			tl_life_flush(l, c);
			tl_timer_set_deadline(l, c, l->cfg.close_timeout_ns);
			continue;
		}
		if (c->state == TL_ST_CLOSING && c->deadline_ns)
			continue; /* a close handshake under way ends by itself, bounded */
		tl_life_teardown(l, c);
	}
}

/* loop_defers says the ring posts completions only when the loop enters
 * the kernel (DEFER_TASKRUN or COOP_TASKRUN): a loop that looks without
 * sleeping must call io_uring_get_events first. */
static inline int loop_defers(const struct tl_loop *l)
{
	return !!(l->cfg.ring_flags & (IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN));
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
 * again comes within reply_spin_ns of its send (note_answer), so a pool
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

/* note_answer runs at a publish while the reply spin is configured: the
 * events answer Go's latest send unless an earlier publish did. An answer
 * within reply_spin_ns of its send turns the reply spin (back) on; a send
 * that came within TL_PRESEND of the publish before it (a callback or the
 * pump's caller answering what it was given) turns the wait for such a
 * send on. One relaxed load per publish; the clock only once per send. */
static inline void note_answer(struct tl_loop *l, uint64_t pub_ns)
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

static void loop_iteration_wait(struct tl_loop *l, int busy)
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

/* run_handed_back goes on with the connections whose socket a Go sender
 * handed back (direct sends, tx.c): their output, or their end. */
static void run_handed_back(struct tl_loop *l)
{
	for (uint32_t i = 0; i < l->cfg.max_conns && l->tx_deferred; i++) {
		struct tl_conn *c = &l->conns[i];
		if (!tl_tx_handed_back(l, c))
			continue;
		if (c->dying)
			tl_life_maybe_finish(l, c);
		else
			tl_life_flush(l, c);
	}
}

/* reap handles every completion in the CQ. Returns 1 when there was one. */
static int reap(struct tl_loop *l)
{
	struct io_uring_cqe *cqes[TL_CQE_BATCH];
	unsigned n;
	int any = 0;

	while ((n = io_uring_peek_batch_cqe(&l->ring, cqes, TL_CQE_BATCH)) > 0) {
		for (unsigned i = 0; i < n; i++)
			handle_cqe(l, cqes[i]);
		io_uring_cq_advance(&l->ring, n);
		STAT_ADD(l, cqes, n);
		any = 1;
	}
	return any;
}

/* run_timers fires the due timers (tl_tick_run) once the earliest is due.
 * With a heartbeat armed it first takes the clock (seen) and then
 * collects what the kernel completed for us since (io_uring_get_events,
 * reap): a read timeout counts a peer's silence only up to that look at
 * the completions (hb_due, tick.c), never over time the loop thread did
 * not run - preempted on a saturated machine, stopped in a signal
 * handler - while the peer's data waited in the kernel (with
 * DEFER_TASKRUN nothing completes until the loop enters the kernel). One
 * enter per due timer pass; nothing per message. Returns 1 when
 * completions were handled. */
static int run_timers(struct tl_loop *l)
{
	uint64_t now, seen;
	int got = 0;

	if (!tl_tick_armed(l))
		return 0;
	now = seen = tl_timer_now_ns();
	if (now < l->next_timer_ns)
		return 0;
	if (l->hb_timed) {
		if (loop_defers(l))
			io_uring_get_events(&l->ring);
		l->now_ns = now = tl_timer_now_ns(); /* receives reaped now are stamped with it: none after now */
		got = reap(l);
	}
	tl_tick_run(l, now, seen);
	return got;
}

/* loop_top is the start of an iteration: receive fairness, the stop
 * request and the shutdown it starts. Returns 1 when the loop is done
 * (stopped, no connection left). */
static int loop_top(struct tl_loop *l)
{
	/* Receive fairness needs per-connection counts only while two
	 * connections (with a socket) could share the ring; a lone one
	 * costs nothing per event (tl_evq_set_counting). */
	if ((l->live - l->rc_waits > 1) != l->evq.counting)
		tl_evq_set_counting(&l->evq, l->live - l->rc_waits > 1);
	if (l->evq.counting)
		fair_tick(l);
	if (__atomic_load_n(&l->stop_req, __ATOMIC_ACQUIRE))
		l->shutting_down = 1;
	if (l->shutting_down && !l->stop_done) {
		shutdown_all(l);
		l->stop_done = 1;
	}
	return l->stop_done && l->live == 0;
}

/* probe_flush polls the n sockets of pf at once (no wait) and applies
 * what probe_recvs says to each, whose slot is in slot. */
static void probe_flush(struct tl_loop *l, struct pollfd *pf, const uint32_t *slot, uint32_t n)
{
	if (!n || poll(pf, n, 0) < 0)
		return; /* EINTR, ENOMEM: the next probe looks again */
	for (uint32_t k = 0; k < n; k++) {
		struct tl_conn *c = &l->conns[slot[k]];
		if (!(pf[k].revents & (POLLIN | POLLRDHUP | POLLERR | POLLHUP))) {
			c->rx_suspect = 0;
		} else if (!c->rx_suspect) {
			c->rx_suspect = 1; /* ready and silent once: look again next time */
		} else {
			c->rx_suspect = 0;
			tl_rx_step(l, c, RX_REVIVE, 0);
		}
	}
}

/* probe_recvs is the defence against a recv completion that never comes.
 * Seen (2026-12-02, kernel 6.18, inline loop, about one stream in 2000
 * under load, both TLS backends): a stream ended by the peer's TCP reset
 * left the multishot recv armed for good on a socket the reset had
 * closed; every later io_uring_enter found nothing, and the connection's
 * end never came. Every TL_PROBE_NS (busy or not), after running the
 * kernel's deferred work and reaping, it polls (one poll(2) per 64) the
 * sockets whose recv is armed and has neither completed nor been armed
 * since the last probe. A socket ready (data, an error, a hang-up) at two
 * probes in a row, with nothing between them, has lost its recv:
 * RX_REVIVE cancels it and the re-arm reads the socket again, as after a
 * regroup; a cancel that finds nothing ends it here (RX_GONE, which moves
 * the recv epoch on so a late completion of the lost recv is stale). Nothing
 * is lost: the socket keeps what the recv did not take. A recv whose
 * cancel came back (it found the recv) but whose END then never did, for
 * TL_PROBE_STUCK probes, is ended here too (RX_STUCK): the connection
 * fails with EIO, or finishes when it was closing, rather than wait for
 * good; the epoch moves on as for RX_GONE. Cost per probe: a
 * scan of the slots, io_uring_get_events and one poll(2) per 64 silent
 * recvs (an idle connection's is silent); nothing per message.
 * PoolStats.RecvRevived counts revivals. Returns 1 when it reaped
 * completions. */
static int probe_recvs(struct tl_loop *l)
{
	struct pollfd pf[64];
	uint32_t slot[64];
	uint32_t n = 0;
	int got;

	/* What the kernel completed so far counts first (rx_ticks). */
	if (loop_defers(l))
		io_uring_get_events(&l->ring);
	got = reap(l);
	for (uint32_t i = 0; i < l->cfg.max_conns; i++) {
		struct tl_conn *c = &l->conns[i];
		int quiet = c->rx_ticks == c->rx_mark;
		int silent = c->rx == TL_RX_ARMED && !c->dying && c->fd >= 0 && quiet;
		/* A cancel (a pause's, a regroup's, a revival's, a teardown's)
		 * found the recv, and no END since. Not after -EALREADY: a
		 * recv the kernel was running then may go on. */
		int waiting = tl_rx_in_kernel(c) && c->rx_cancel_hit && !c->cancel_inflight && quiet;
		c->rx_mark = c->rx_ticks;
		c->rx_stuck = waiting ? c->rx_stuck + 1 : 0;
		if (c->rx_stuck >= TL_PROBE_STUCK) {
			c->rx_stuck = 0;
			/* The kernel may still hold the recv, and with it the socket:
			 * closing the fd alone would send no FIN. The shutdown ends
			 * the connection on the wire (and such a recv, stale now). */
			if (c->fd >= 0)
				shutdown(c->fd, SHUT_RDWR);
			tl_rx_step(l, c, RX_STUCK, 0);
			recv_settle(l, c);
			continue;
		}
		if (!silent) {
			c->rx_suspect = 0;
			continue;
		}
		pf[n].fd = c->fd;
		pf[n].events = POLLIN | POLLRDHUP;
		pf[n].revents = 0;
		slot[n++] = i;
		if (n == 64) {
			probe_flush(l, pf, slot, n);
			n = 0;
		}
	}
	probe_flush(l, pf, slot, n);
	return got;
}

/* loop_work is the rest of an iteration, after the wait: completions,
 * commands, handed-back sockets, stalls, re-arms, timers, then the
 * publish. Returns 1 when it did work (the next wait only looks). */
static int loop_work(struct tl_loop *l)
{
	int busy = 0;

	if (l->hb_timed) /* the clock receives are stamped with */
		l->now_ns = tl_timer_now_ns();
	if (reap(l))
		busy = 1;
	if (tl_cmdq_drain(l)) {
		busy = 1;
		if (l->pub_ns) { /* adaptive wait: how fast the answer came */
			l->reply_gap_ns = tl_timer_now_ns() - l->pub_ns;
			l->pub_ns = 0;
		}
	}
	if (l->tx_deferred) /* Go senders handed sockets back */
		run_handed_back(l);
	{
		/* One clock read per iteration while connections live: the
		 * probe runs on a busy loop too (a flood on other connections
		 * must not keep it from a lost recv). */
		uint64_t now = l->live > l->rc_waits ? tl_timer_now_ns() : 0;
		int sweep = now && !busy && now - l->last_sweep_ns >= TL_SWEEP_NS;
		if (sweep)
			l->last_sweep_ns = now;
		if (l->stalled && (sweep || space_freed(l) || l->stall_kick)) {
			l->stall_kick = 0;
			publish_before_resume(l);
			if (run_stalled(l))
				busy = 1;
		}
		release_deferred(l);
		if (l->rx_want || sweep || l->tx_retry)
			run_rearms(l, sweep);
		if (now && now - l->last_probe_ns >= TL_PROBE_NS) {
			l->last_probe_ns = now;
			if (probe_recvs(l))
				busy = 1;
		}
	}
	if (run_timers(l))
		busy = 1;
	tl_slots_commit(&l->slots);
	if (l->evq.tail != l->evq.published) {
		tl_evq_publish(&l->evq);
		/* Adaptive wait: an answer is worth spinning for only when
		 * the pump is awake to send it. A pump this publish had to
		 * wake needs a CPU first, maybe the one the loop would spin
		 * on (measured: spinning then doubled the round trip). An
		 * inline loop's pump is its caller: it sends only once the
		 * loop returned, so nothing is spun for before that. */
		if (l->cfg.loop_wait == TL_WAIT_ADAPTIVE) {
			l->pub_ns = l->cfg.inline_loop || __atomic_load_n(&l->evq.r->cons_sleeping, __ATOMIC_RELAXED)
					    ? 0
					    : tl_timer_now_ns();
			if (l->cfg.reply_spin_ns)
				note_answer(l, l->pub_ns);
		}
	}
	/* With nothing submitted and a clean CQ, a spinning loop still
	 * needs the kernel to post deferred work: handled in wait. */
	return busy;
}

static void loop_run(struct tl_loop *l)
{
	int busy = 0;

	while (!loop_top(l)) {
		loop_iteration_wait(l, busy);
		busy = loop_work(l);
	}
	tl_evq_publish(&l->evq);
}

/* is_owner says the calling thread created inline loop l:
 * tl_loop_inline_run refuses every other thread, since SINGLE_ISSUER and
 * DEFER_TASKRUN bind the ring to its creator. */
static int is_owner(const struct tl_loop *l) { return pthread_equal(pthread_self(), l->thread); }

int tl_loop_inline_owner(const struct tl_loop *l) { return l->cfg.inline_loop && l->ring_ok && is_owner(l); }

/* inline_finish runs an inline loop's shutdown to its end (bounded by
 * close_timeout: the close handshakes' deadlines) and marks it stopped.
 * The caller holds driving (1). */
static void inline_finish(struct tl_loop *l)
{
	int busy = l->inline_busy;

	while (!loop_top(l)) {
		loop_iteration_wait(l, busy);
		busy = loop_work(l);
	}
	tl_evq_publish(&l->evq);
	__atomic_store_n(&l->driving, 2, __ATOMIC_RELEASE);
}

int tl_loop_inline_run(struct tl_loop *l, int mode)
{
	uint32_t idle = 0;
	int busy, ret = TL_INLINE_IDLE;

	if (!l->cfg.inline_loop || !is_owner(l))
		return -EPERM;
	if (!__atomic_compare_exchange_n(&l->driving, &idle, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
		return -ESHUTDOWN; /* 2: stopped or dead (1 is only ever this thread, which is not inside) */
	busy = l->inline_busy || mode == TL_INLINE_NOWAIT;
	for (;;) {
		if (loop_top(l) || l->shutting_down) {
			inline_finish(l);
			return TL_INLINE_STOPPED;
		}
		loop_iteration_wait(l, busy);
		busy = loop_work(l);
		/* Published events are the pump's to drain: return to it
		 * (where a threaded loop would wait for the pump's space or
		 * its send, the inline loop's pump runs once it returns). */
		if (l->evq.published != __atomic_load_n(&l->evq.r->head, __ATOMIC_ACQUIRE)) {
			ret = TL_INLINE_EVENTS;
			break;
		}
		if (mode != TL_INLINE_BLOCK)
			break;
	}
	l->inline_busy = busy;
	__atomic_store_n(&l->driving, 0, __ATOMIC_RELEASE);
	return ret;
}

static void inline_stop(struct tl_loop *l)
{
	uint64_t one = 1;
	uint32_t idle = 0;

	__atomic_store_n(&l->stop_req, 1, __ATOMIC_SEQ_CST);
	if (is_owner(l)) {
		/* The loop's own thread (outside tl_loop_inline_run: a pump
		 * callback or no pump): run the close handshakes here. */
		if (__atomic_compare_exchange_n(&l->driving, &idle, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			inline_finish(l);
		return;
	}
	if (write(l->efd, &one, sizeof(one)) < 0) {
		/* the loop looks at stop_req before every wait anyway */
	}
	/* Another thread: the loop's thread, if inside, finishes the
	 * shutdown (it saw stop_req) or returns within TL_INLINE_CAP_NS;
	 * once no one runs the loop it is marked dead. */
	for (;;) {
		idle = 0;
		if (__atomic_compare_exchange_n(&l->driving, &idle, 2, 0, __ATOMIC_ACQUIRE, __ATOMIC_ACQUIRE) ||
		    idle == 2)
			return;
		struct timespec ts = {0, 100000};
		nanosleep(&ts, NULL);
	}
}

/* ---- setup ---- */

static int setup_ring(struct tl_loop *l)
{
	struct io_uring_params p;
	int ret;

	memset(&p, 0, sizeof(p));
	p.flags = l->cfg.ring_flags | IORING_SETUP_CQSIZE;
	p.cq_entries = l->cfg.cq_entries;
	if (p.flags & IORING_SETUP_SQPOLL) {
		p.sq_thread_idle = l->cfg.sq_thread_idle_ms;
		if (l->cfg.sq_thread_cpu >= 0) {
			p.flags |= IORING_SETUP_SQ_AFF;
			p.sq_thread_cpu = (uint32_t)l->cfg.sq_thread_cpu;
		}
	}
	ret = io_uring_queue_init_params(l->cfg.sq_entries, &l->ring, &p);
	if (ret < 0) {
		snprintf(l->setup_msg, sizeof(l->setup_msg), "io_uring_queue_init_params(flags=%#x): %s", p.flags,
			 strerror(-ret));
		return ret;
	}
	l->ring_ok = 1;
	l->recv_bundle = l->cfg.recv_bundle && (p.features & IORING_FEAT_RECVSEND_BUNDLE);
	l->bundle_len = l->recv_bundle ? TL_BUNDLE_SLOTS * l->cfg.buf_size : 0;
	/* min_wait_usec: never fewer than 2 completions to wait for (1
	 * would end the wait at the first, as without it) */
	l->mw_ok = l->cfg.min_wait_ns >= 1000 && l->cfg.min_wait_nr >= 2 && (p.features & IORING_FEAT_MIN_TIMEOUT);
	/* Registered ring fd: fewer fd lookups per enter. Best effort. */
	l->ring_reg = io_uring_register_ring_fd(&l->ring) == 1;
	{
		unsigned workers[2] = {2, 2};
		io_uring_register_iowq_max_workers(&l->ring, workers);
	}
	if (l->cfg.loop_cpu >= 0) {
		cpu_set_t set;
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		CPU_ZERO(&set);
		for (long i = 0; i < ncpu && i < CPU_SETSIZE; i++)
			if (i != l->cfg.loop_cpu)
				CPU_SET(i, &set);
		if (CPU_COUNT(&set) > 0)
			io_uring_register_iowq_aff(&l->ring, sizeof(set), &set);
	}
	ret = tl_slots_register(&l->slots, &l->ring, l->cfg.buf_size, l->cfg.buf_count);
	if (ret < 0) {
		snprintf(l->setup_msg, sizeof(l->setup_msg), "provided buffer ring (%u x %u): %s", l->cfg.buf_count,
			 l->cfg.buf_size, strerror(-ret));
		return ret;
	}
	return 0;
}

/* name_loop_thread names the calling thread "talaris-loop" (its comm in
 * /proc/self/task/<tid>/comm), so tools and `talaris bench` can tell the loop
 * thread from the Go runtime's threads when they split CPU time per thread.
 * Best effort: a failure only leaves the inherited name. */
static void name_loop_thread(void)
{
	(void)pthread_setname_np(pthread_self(), "talaris-loop");
}

static void *loop_main(void *arg)
{
	struct tl_loop *l = arg;
	int ret;

	name_loop_thread();
	if (l->cfg.loop_cpu >= 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(l->cfg.loop_cpu, &set);
		ret = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
		if (ret) {
			snprintf(l->setup_msg, sizeof(l->setup_msg), "pin loop to CPU %d: %s", l->cfg.loop_cpu,
				 strerror(ret));
			ret = -ret;
			goto report;
		}
	}
	/* SINGLE_ISSUER makes the creating thread the submitter: create here. */
	ret = setup_ring(l);
report:
	pthread_mutex_lock(&l->mu);
	l->setup_state = ret < 0 ? ret : 1;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
	if (ret < 0)
		return NULL;
	loop_run(l);
	return NULL;
}

/* map_zero maps n zeroed bytes, populated up front: the hot path must not
 * take a page fault the first time it touches a ring or arena line. */
static void *map_zero(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static int pow2(uint64_t v) { return v && !(v & (v - 1)); }

/* loop_alloc makes a loop's memory (rings, arena, tables) without a thread
 * or io_uring. */
static struct tl_loop *loop_alloc(const struct tl_config *cfg, int *err, char *errbuf, size_t errcap)
{
	struct tl_loop *l;

	*err = 0;
	if (!pow2(cfg->event_ring_size) || !pow2(cfg->arena_size) || !pow2(cfg->cmd_ring_size) ||
	    !pow2(cfg->buf_size) || !pow2(cfg->buf_count) || cfg->max_conns == 0 || cfg->max_conns > TL_MAX_SLOTS ||
	    cfg->max_message == 0 || cfg->max_message > cfg->arena_size / 2 || cfg->cmd_ring_size < 4096) {
		*err = -EINVAL;
		snprintf(errbuf, errcap, "sizes must be powers of two, max message <= arena/2, cmd ring >= 4096");
		return NULL;
	}
	l = calloc(1, sizeof(*l));
	if (!l)
		goto nomem;
	l->cfg = *cfg;
	/* 0: no fairness limit (the Decoder's single connection). */
	if (!l->cfg.conn_max_events)
		l->cfg.conn_max_events = UINT32_MAX;
	if (!l->cfg.conn_max_bytes)
		l->cfg.conn_max_bytes = UINT64_MAX;
	/* A quarter of the ring (or arena) pending: every share applies,
	 * floods among themselves too (conn.c, fair_pressed). */
	l->fair_epoch = 2;
	l->fair_press_events = cfg->event_ring_size / 4;
	l->fair_press_bytes = cfg->arena_size / 4;
	l->sample_left = cfg->sample_every;
	l->efd = -1;
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	l->stats = map_zero(sizeof(*l->stats));
	l->conns = calloc(cfg->max_conns, sizeof(*l->conns));
	l->pub = map_zero(sizeof(*l->pub) * cfg->max_conns);
	l->dials = calloc(cfg->max_conns, sizeof(*l->dials));
	if (!l->stats || !l->conns || !l->pub || !l->dials)
		goto nomem_free;
	if (tl_slots_alloc(&l->slots, cfg->buf_count) < 0)
		goto nomem_free;
	if (tl_evq_init(&l->evq, cfg->event_ring_size, cfg->arena_size, l->stats, cfg->sample_every != 0,
			cfg->max_conns) < 0)
		goto nomem_free;
	if (tl_cmdq_init(&l->cmdq, cfg->cmd_ring_size) < 0)
		goto nomem_free;
	for (uint32_t i = 0; i < cfg->max_conns; i++) {
		l->conns[i].fd = -1;
		l->conns[i].slot = i;
		tl_rxq_init(&l->conns[i].rxq);
		l->conns[i].cur_q = -1;
	}
	return l;

nomem_free:
	tl_loop_free(l);
nomem:
	*err = -ENOMEM;
	snprintf(errbuf, errcap, "out of memory");
	return NULL;
}

struct tl_loop *tl_loop_new_detached(const struct tl_config *cfg)
{
	int err;
	char msg[128];
	return loop_alloc(cfg, &err, msg, sizeof(msg));
}

struct tl_loop *tl_loop_new(const struct tl_config *cfg, int *err, char *errbuf, size_t errcap)
{
	struct tl_loop *l = loop_alloc(cfg, err, errbuf, errcap);
	int ret;

	if (!l)
		return NULL;
	l->efd = eventfd(0, EFD_CLOEXEC);
	if (l->efd < 0) {
		*err = -errno;
		snprintf(errbuf, errcap, "eventfd: %s", strerror(errno));
		tl_loop_free(l);
		return NULL;
	}
	l->cmdq.r->efd = l->efd;
	if (cfg->inline_loop) {
		/* No thread: this one creates (SINGLE_ISSUER: and alone
		 * submits to) the ring and runs the loop, tl_loop_inline_run. */
		l->thread = pthread_self();
		ret = setup_ring(l);
		if (ret < 0) {
			*err = ret;
			snprintf(errbuf, errcap, "%s", l->setup_msg);
			tl_loop_free(l);
			return NULL;
		}
		return l;
	}
	ret = pthread_create(&l->thread, NULL, loop_main, l);
	if (ret) {
		*err = -ret;
		snprintf(errbuf, errcap, "pthread_create: %s", strerror(ret));
		tl_loop_free(l);
		return NULL;
	}
	l->started = 1;
	pthread_mutex_lock(&l->mu);
	while (l->setup_state == 0)
		pthread_cond_wait(&l->cv, &l->mu);
	pthread_mutex_unlock(&l->mu);
	if (l->setup_state < 0) {
		*err = l->setup_state;
		snprintf(errbuf, errcap, "%s", l->setup_msg);
		pthread_join(l->thread, NULL);
		l->started = 0;
		tl_loop_free(l);
		return NULL;
	}
	return l;
}

struct tl_evring *tl_loop_evring(struct tl_loop *l) { return l->evq.r; }
struct tl_cmdring *tl_loop_cmdring(struct tl_loop *l) { return l->cmdq.r; }
struct tl_conn_pub *tl_loop_conns(struct tl_loop *l) { return l->pub; }
struct tl_pool_stats *tl_loop_stats(struct tl_loop *l) { return l->stats; }

int tl_loop_payload_origin(const struct tl_loop *l, const void *p)
{
	const uint8_t *b = p;
	if (b >= l->evq.arena && b < l->evq.arena + l->evq.arena_size)
		return TL_ORIGIN_ARENA;
	switch (tl_slots_origin(&l->slots, b)) {
	case TL_SLOTS_RECV:
		return TL_ORIGIN_SLOT;
	case TL_SLOTS_PT:
		return TL_ORIGIN_PLAINTEXT;
	}
	return TL_ORIGIN_OTHER;
}

int tl_dial_prepare(struct tl_loop *l, uint32_t slot, const struct tl_dial_params *p)
{
	struct tl_dial *d;

	if (slot >= l->cfg.max_conns || p->addr_len > sizeof(p->addr) || p->local_len > sizeof(p->local) ||
	    p->nalt > 64 || (p->nalt && !p->alt))
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	memcpy(&d->addr, &p->addr, sizeof(d->addr));
	d->addr_len = p->addr_len;
	memcpy(&d->local, &p->local, sizeof(d->local));
	d->local_len = p->local_len;
	if (p->nalt) {
		d->alt = malloc(p->nalt * sizeof(*d->alt));
		if (!d->alt)
			goto fail;
		memcpy(d->alt, p->alt, p->nalt * sizeof(*d->alt));
		d->nalt = p->nalt;
	}
	d->tls = p->tls;
	d->insecure = p->insecure;
	d->handshake_timeout_ns = p->handshake_timeout_ns ? p->handshake_timeout_ns : l->cfg.handshake_timeout_ns;
	d->ping_interval_ns = p->ping_interval_ns;
	d->read_timeout_ns = p->read_timeout_ns;
	d->rc_enabled = p->rc_enabled && p->rc_min_ns && p->rc_max_ns >= p->rc_min_ns;
	d->rc_max_attempts = p->rc_max_attempts;
	d->rc_min_ns = p->rc_min_ns;
	d->rc_max_ns = p->rc_max_ns;
#define DUP(f)                                              \
	do {                                                \
		d->f = tl_dupn(p->f ? p->f : "", p->f##_len); \
		d->f##_len = p->f##_len;                    \
		if (!d->f)                                  \
			goto fail;                          \
	} while (0)
	DUP(host);
	DUP(path);
	DUP(headers);
	DUP(protocols);
	DUP(server_name);
	DUP(ca_file);
	DUP(ca_pem);
	DUP(subscribe);
#undef DUP
	if (p->tls && !(d->tlsx = tl_tlsv_dial_copy(p)))
		goto fail;
	tl_life_free_dial(l->dials[slot]);
	l->dials[slot] = d;
	return 0;
fail:
	tl_life_free_dial(d);
	return -ENOMEM;
}

size_t tl_loop_fail_head(struct tl_loop *l, uint32_t slot, uint32_t gen, char *buf, size_t cap)
{
	struct tl_conn *c;
	size_t n;

	if (!l->conns || slot >= l->cfg.max_conns)
		return 0;
	c = &l->conns[slot];
	if (c->gen != gen || !c->fail_head)
		return 0;
	n = c->fail_head_len < cap ? c->fail_head_len : cap;
	memcpy(buf, c->fail_head, n);
	return n;
}

void tl_loop_stop(struct tl_loop *l)
{
	uint64_t one = 1;

	if (l->cfg.inline_loop && l->ring_ok) {
		inline_stop(l);
		return;
	}
	if (!l->started)
		return;
	__atomic_store_n(&l->stop_req, 1, __ATOMIC_SEQ_CST);
	if (write(l->efd, &one, sizeof(one)) < 0) {
		/* the loop checks stop_req before every wait anyway */
	}
	pthread_join(l->thread, NULL);
	l->started = 0;
}

void tl_loop_free(struct tl_loop *l)
{
	if (!l)
		return;
	if (l->started)
		tl_loop_stop(l);
	if (l->conns) {
		for (uint32_t i = 0; i < l->cfg.max_conns; i++) {
			struct tl_conn *c = &l->conns[i];
			if (c->fd >= 0)
				close(c->fd);
			tl_tls_free(c);
			tl_life_free_dial(c->dial);
			free(c->hs);
			tl_conn_free_bufs(c);
		}
	}
	if (l->dials)
		for (uint32_t i = 0; i < l->cfg.max_conns; i++)
			tl_life_free_dial(l->dials[i]);
	tl_slots_free(&l->slots, l->ring_ok ? &l->ring : NULL);
	if (l->ring_ok)
		io_uring_queue_exit(&l->ring);
	tl_tls_shared_free(&l->ts);
	if (l->efd >= 0)
		close(l->efd);
	tl_evq_free(&l->evq);
	tl_cmdq_free(&l->cmdq);
	if (l->stats)
		munmap(l->stats, sizeof(*l->stats));
	if (l->pub)
		munmap(l->pub, sizeof(*l->pub) * l->cfg.max_conns);
	free(l->conns);
	free(l->dials);
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cv);
	free(l);
}
