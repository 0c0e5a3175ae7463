/* ws/inject.c - a memory connection's injected input (the Decoder's and
 * tests' connections without a socket): fed to the frame parser, the
 * rest kept in order until the pump makes room. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ws/internal.h"
#include "base/pub.h"
#include "base/sample.h"
#include "loop/state.h"

#include <errno.h>
#include <string.h>

/* A memory connection never sends (its frames are retired at once), so
 * its send queue holds the injected bytes the parser could not take yet
 * (raw bytes from head to len): the INJECT command leaves the command
 * ring at once, and Go's admission (the same send units) bounds it. */

int tl_conn_feed_stash(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_sendq *q = &c->sq;
	int r = TL_FEED_OK;

	while (!sq_empty(q)) {
		size_t used = 0;
		r = tl_conn_feed(l, c, q->p + q->head, q->len - q->head, &used);
		if (r == TL_FEED_DEAD)
			used = q->len - q->head; /* closing or failed: the rest does not count */
		q->head += used;
		tl_pub_tx_retire(l, c, used);
		if (r == TL_FEED_STALL || tl_conn_ending(c))
			break;
	}
	if (sq_empty(q))
		sq_reset(q);
	return r == TL_FEED_DEAD ? TL_FEED_OK : r;
}

int tl_conn_inject(struct tl_loop *l, struct tl_conn *c, const uint8_t *p, size_t n)
{
	size_t used = 0;
	int r;

	if (sq_empty(&c->sq)) {
		r = tl_conn_feed(l, c, p, n, &used);
		if (r == TL_FEED_DEAD)
			used = n;
		tl_pub_tx_retire(l, c, used);
		if (r != TL_FEED_STALL || tl_conn_ending(c)) {
			tl_sample_end(c);
			return TL_FEED_OK;
		}
	}
	/* Behind earlier stashed bytes, or the parser stalled (perhaps with
	 * every byte taken and only an event pending): keep the rest in order
	 * until the pump makes room. */
	if (used == n)
		return TL_FEED_STALL;
	uint8_t *d = tl_sendq_reserve(&c->sq, n - used);
	if (!d) {
		tl_pub_tx_retire(l, c, n - used);
		tl_conn_fail(l, c, TL_E_NOMEM, ENOMEM, 1011, "out of memory keeping injected bytes");
		return TL_FEED_DEAD;
	}
	memcpy(d, p + used, n - used);
	return TL_FEED_STALL;
}
