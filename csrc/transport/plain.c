/* transport/plain.c - the plain (ws://) transport: received slots go to the frame
 * parser in place (no copy: a whole frame inside a main-group slot is
 * published pointing into it). Calls ws/, base/slots and base/sample.h only. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "transport/plain.h"

#include "ws/conn.h"
#include "base/sample.h"
#include "loop/state.h"

/* prefetch_slot starts loading the first lines of slot q, the one the
 * parser reads after the current one. A bundle's slots are out of order
 * in memory and were written up to a megabyte of copies ago, so the
 * first touch of each was a cache and TLB miss the parser waited for:
 * at ws 64 B x16 the reassembly copy of the frame split across the two
 * slots (its first reader) took 2.6-3.4 % of the loop thread's samples,
 * 0.3-0.5 % with this (docs/notes/2026-12-loop-threads.md, "Where ws x16
 * spends the loop thread"). The rest of the slot the hardware prefetcher
 * streams. */
static inline void prefetch_slot(const struct tl_loop *l, uint32_t q)
{
	const uint8_t *p = tl_slots_ptr(&l->slots, q);

	__builtin_prefetch(p);
	__builtin_prefetch(p + 64);
	__builtin_prefetch(p + 128);
	__builtin_prefetch(p + 192);
}

int tl_plain_drive(struct tl_loop *l, struct tl_conn *c)
{
	int r = TL_FEED_OK;

	if (c->state == TL_ST_OPEN || c->state == TL_ST_CLOSING)
		r = tl_conn_flush_pending(l, c);
	if (c->fd < 0 && r == TL_FEED_OK && c->sq.head != c->sq.len)
		r = tl_conn_feed_stash(l, c); /* a memory connection's injected backlog */
	while (r != TL_FEED_STALL && !tl_rxq_empty(&c->rxq) && !tl_conn_ending(c)) {
		const uint8_t *p;
		size_t n, used = 0;
		int32_t q;

		if (tl_conn_replies(c) > l->cfg.max_send_queue) {
			/* Replies (pongs) pile up: the peer does not read. Stop
			 * reading too until the socket drains. (Go's own sends are
			 * bounded by its admission control and do not stop reading:
			 * a peer that echoes would deadlock with us.) */
			if (!c->stalled)
				__atomic_store_n(&l->stats->sendq_full, l->stats->sendq_full + 1, __ATOMIC_RELAXED);
			r = TL_FEED_STALL;
			break;
		}
		q = tl_rxq_peek(&l->slots, &c->rxq, &p, &n);
		if (l->slots.next[q] >= 0)
			prefetch_slot(l, (uint32_t)l->slots.next[q]);
		if (r == TL_FEED_OK) {
			c->cur_q = q;
			tl_sample_pt(c);
			r = tl_conn_feed(l, c, p, n, &used);
			c->cur_q = -1;
		} else {
			used = n; /* dead: drop the rest */
		}
		tl_rxq_consume(&l->slots, &c->rxq, used, l->evq.head_cache);
		if (r == TL_FEED_DEAD)
			r = TL_FEED_OK, c->discard = 1;
	}
	return r == TL_FEED_DEAD ? TL_FEED_OK : r;
}
