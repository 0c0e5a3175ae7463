/* loop/run.c - the loop's iterations: the top of one (receive fairness,
 * the stop request and the shutdown it starts), the work after the wait
 * (completions, commands, handed-back sockets, stalls, re-arms, probes,
 * timers, then the publish), the threaded loop's run and the inline
 * loop's (tl_loop_inline_run: on the caller's thread, in steps). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/internal.h"

#include <errno.h>
#include <time.h>
#include <unistd.h>

/* publish_before_resume publishes what this iteration's completions
 * appended before tl_loop_run_stalled lets held connections parse again: a
 * message that arrived beside a flood (an order's answer) then reaches
 * the pump without waiting for the flood's next share to be parsed. */
static void publish_before_resume(struct tl_loop *l)
{
	if (l->evq.tail != l->evq.published)
		tl_evq_publish(&l->evq);
}

static void shutdown_all(struct tl_loop *l)
{
	/* Stalled connections go on (their events are dropped from now on,
	 * see ring_full in ws/frames.c) so their close handshakes can be read. */
	if (l->stalled)
		l->stall_kick = 1; /* (cleared by tl_loop_run_stalled, which runs only when one is) */
	for (uint32_t i = 0; i < l->cfg.max_conns; i++) {
		struct tl_conn *c = &l->conns[i];
		if (c->dying == TL_DYING_FINAL) {
			tl_life_finish(l, c); /* shutting down: the event is dropped if there is no room */
			continue;
		}
		if (c->rc == TL_RC_ANNOUNCE) {
			tl_life_end_or_reconnect(l, c); /* no reconnect while shutting down: final */
			continue;
		}
		if (c->state == TL_ST_IDLE || c->dying)
			continue;
		if (!c->fail_err && !tl_conn_close_rcvd(c)) {
			c->fail_err = TL_E_SHUTDOWN;
			c->fail_code = 1001;
			tl_pub_detail(l, c, "pool closed");
		}
		if (c->state == TL_ST_OPEN && !tl_conn_close_sent(c) && c->fd >= 0 && !c->eof && !c->send_errno) {
			/* Going away: send 1001 and let the close handshake run (the
			 * echo, then TCP's end), bounded by the close timeout. */
			tl_conn_close_after_queue(l, c, 1001, (const uint8_t *)"pool closed", 11);
			tl_life_after(l, c);
			if (c->dying)
				continue;
			tl_pub_set_state(l, c, TL_ST_CLOSING);
			tl_life_flush(l, c);
			tl_timer_set_deadline(l, c, tl_conn_close_timeout(l, c));
			continue;
		}
		if (c->state == TL_ST_CLOSING && c->deadline_ns)
			continue; /* a close handshake under way ends by itself, bounded */
		tl_life_teardown(l, c);
	}
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

/* run_timers fires the due timers (tl_tick_run) once the earliest is due.
 * With a heartbeat armed it first takes the clock (seen) and then
 * collects what the kernel completed for us since (io_uring_get_events,
 * tl_loop_reap): a read timeout counts a peer's silence only up to that look at
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
		got = tl_loop_reap(l);
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
		tl_loop_fair_tick(l);
	if (!l->shutting_down && __atomic_load_n(&l->stop_req, __ATOMIC_ACQUIRE)) {
		/* Go published every command accepted before Pool.Close ahead
		 * of the stop (a batch's records all together): run them first,
		 * so what was accepted is queued before the 1001 close frame. */
		tl_cmdq_drain(l);
		l->shutting_down = 1;
	}
	if (l->shutting_down && !l->stop_done) {
		shutdown_all(l);
		l->stop_done = 1;
	}
	return l->stop_done && l->live == 0;
}

/* loop_work is the rest of an iteration, after the wait: completions,
 * commands, handed-back sockets, stalls, re-arms, timers, then the
 * publish. Returns 1 when it did work (the next wait only looks). */
static int loop_work(struct tl_loop *l)
{
	int busy = 0;

	if (l->hb_timed) /* the clock receives are stamped with */
		l->now_ns = tl_timer_now_ns();
	if (tl_loop_reap(l))
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
			if (tl_loop_run_stalled(l))
				busy = 1;
		}
		tl_loop_release_deferred(l);
		if (l->rx_want || sweep || l->tx_retry)
			tl_loop_run_rearms(l, sweep);
		if (now && now - l->last_probe_ns >= TL_PROBE_NS && !l->cfg.no_recv_probe) {
			l->last_probe_ns = now;
			if (tl_loop_probe_recvs(l))
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
				tl_loop_note_answer(l, l->pub_ns);
		}
	}
	/* With nothing submitted and a clean CQ, a spinning loop still
	 * needs the kernel to post deferred work: handled in wait. */
	return busy;
}

void tl_loop_run(struct tl_loop *l)
{
	int busy = 0;

	while (!loop_top(l)) {
		tl_loop_wait(l, busy);
		busy = loop_work(l);
	}
	tl_evq_publish(&l->evq);
}

int tl_loop_inline_owner(const struct tl_loop *l) { return l->cfg.inline_loop && l->ring_ok && is_owner(l); }

/* tl_loop_inline_finish runs an inline loop's shutdown to its end (bounded by
 * close_timeout: the close handshakes' deadlines) and marks it stopped.
 * The caller holds driving (1). */
void tl_loop_inline_finish(struct tl_loop *l)
{
	int busy = l->inline_busy;

	while (!loop_top(l)) {
		tl_loop_wait(l, busy);
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
			tl_loop_inline_finish(l);
			return TL_INLINE_STOPPED;
		}
		tl_loop_wait(l, busy);
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

void tl_loop_inline_stop(struct tl_loop *l)
{
	uint64_t one = 1;
	uint32_t idle = 0;

	__atomic_store_n(&l->stop_req, 1, __ATOMIC_SEQ_CST);
	if (is_owner(l)) {
		/* The loop's own thread (outside tl_loop_inline_run: a pump
		 * callback or no pump): run the close handshakes here. */
		if (__atomic_compare_exchange_n(&l->driving, &idle, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
			tl_loop_inline_finish(l);
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
