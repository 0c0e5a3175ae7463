/* loop/stall.c - connections the loop parked and looks at again: the
 * stalled list (back-pressure and receive fairness: the count of light
 * connections, a held flood resumed once the pump has passed half its
 * share), slots held by in-place payloads Go has passed, recvs waiting
 * for a slot, output left behind, and the sweep that looks for work
 * nothing asked for. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/internal.h"

#include <stdio.h>
#include <stdlib.h>

/* tl_loop_release_deferred recycles consumed slots whose in-place payloads the pump
 * has passed. Slots are queued in release order, which is close to event
 * order; one still referenced holds back the ones behind it a little. */
void tl_loop_release_deferred(struct tl_loop *l)
{
	if (!tl_slots_deferred(&l->slots))
		return;
	tl_evq_refresh(&l->evq);
	tl_slots_release_deferred(&l->slots, l->evq.head_cache);
}

/* tl_loop_fair_tick keeps l->fair_light (the connections with a socket that are
 * light, see conn_held_slow in ws/frames.c) up to date: recounted when an
 * epoch ends or a connection comes or goes, decremented by ws/frames.c when
 * one turns heavy. One clock read per iteration while counting is on; the
 * scan runs once per epoch. Held connections are looked at again when none
 * is light any more (they may go on). */
void tl_loop_fair_tick(struct tl_loop *l)
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
		if (c->state != TL_ST_IDLE && !c->dying && c->rc != TL_RC_BACKOFF && c->fd >= 0 &&
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

/* tl_loop_run_stalled resumes the stalled connections that can go on. Returns how
 * many it acted on: 0 when every one is still held at its share, so the
 * loop does not count the pass as work (a busy iteration does not block,
 * and the loop would spin through the pump's every head store). */
int tl_loop_run_stalled(struct tl_loop *l)
{
	struct tl_conn *list = l->stalled, *c;
	int ran = 0;
	l->stalled = NULL;
	tl_evq_refresh(&l->evq);
	while ((c = list) != NULL) {
		list = c->stall_next;
		c->on_stall_list = 0;
		c->stalled = 0;
		if (c->dying == TL_DYING_FINAL) {
			ran++;
			tl_life_finish(l, c);
			continue;
		}
		if (c->rc == TL_RC_ANNOUNCE) {
			ran++;
			tl_life_end_or_reconnect(l, c);
			continue;
		}
		/* A connection may have ended while it sat on the list: its slot
		 * is Go's again and must not be driven (nor one waiting to
		 * reconnect: it has no socket). */
		if (c->dying || c->state == TL_ST_IDLE || c->rc == TL_RC_BACKOFF)
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
	       (c->sq.head != c->sq.len && c->state >= TL_ST_OPEN) || c->shut_wr == TL_SHUT_WANT;
}

/* tl_loop_run_rearms re-arms the recvs waiting in TL_RX_WANT when their group has
 * a slot to give (else -ENOBUFS again), and flushes again after a send
 * found no free SQE (l->tx_retry). With sweep set it also looks for work
 * nothing asked for: a connection whose recv ended without the state
 * machine noting it, or output with no send in flight and no retry
 * pending. Both are defences only - every recv end goes through
 * tl_rx_step, every framing is followed by a flush, every SQE shortage
 * sets tx_retry - so a debug build (TL_DEBUG: the cgo.mk test and fuzz
 * builds) aborts if it finds either. */
void tl_loop_run_rearms(struct tl_loop *l, int sweep)
{
	int retry = l->tx_retry != 0;

	l->tx_retry = 0;
	for (uint32_t i = 0; i < l->cfg.max_conns && (l->rx_want || sweep || retry); i++) {
		struct tl_conn *c = &l->conns[i];
		if (sweep && c->rx == TL_RX_OFF && !c->dying && !c->eof && c->fd >= 0 && c->state != TL_ST_IDLE &&
		    !tl_conn_unconnected(c)) {
#ifdef TL_DEBUG
			fprintf(stderr, "talaris: sweep found slot %u with no recv (state %d)\n", c->slot, c->state);
			abort();
#endif
			tl_rx_step(l, c, RX_LOST, 0);
		}
		if (c->rx == TL_RX_WANT)
			tl_rx_step(l, c, RX_TICK, 0);
		if (c->send_inflight || c->dying || c->fd < 0 || c->state == TL_ST_IDLE || tl_conn_unconnected(c))
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
