/* ws/conn.c - one WebSocket client connection's record (struct tl_conn,
 * ws/conn.h) between dials: reset for the next dial on its slot, reset for
 * a reconnect of the same handle, trimmed after an end, its buffers freed;
 * and what a stall left unpublished (tl_conn_pend_set).
 *
 * The rest of the WebSocket state machine is one file per job:
 * ws/upgrade.c (the upgrade exchange, a refusal's body), ws/frames.c (the
 * streaming frame parser: split headers, payloads across buffer slots,
 * fragmentation, interleaved control frames, receive fairness),
 * ws/close.c (a close frame received, the end of input), ws/send.c
 * (outgoing framing with CSPRNG mask keys, the send queue, the close frame
 * and failure), ws/inject.c (a memory connection's injected input).
 *
 * Input arrives as byte runs (a buffer slot, or TLS plaintext) from a
 * transport (transport/plain.c, transport/tls_read.c). A run is consumed
 * as far as the event ring and arena allow; what cannot be published
 * stays where it is and the connection stalls until Go releases space
 * (back-pressure, never loss).
 *
 * Layering: ws/ includes loop/state.h, not loop/loop.h, and calls only
 * base/ and codec/ (ws/README.md). What needs the loop (teardown, a
 * flush, a regroup, ending the sending side) is requested in c->todo
 * (TL_DO_*) and done by tl_life_after once the call returns; output is
 * framed into tl_conn_wbuf and the transport (plain: nothing to do; TLS:
 * tl_tls_seal) is asked by the loop to send it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ws/conn.h"
#include "base/slots.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void tl_conn_pend_set(struct tl_conn *c, uint8_t to)
{
#ifdef TL_DEBUG
	/* One leftover at a time: a second would overwrite the first, which
	 * parsing must have stopped at. */
	if (to != TL_PEND_NONE && c->pending != TL_PEND_NONE && c->pending != to) {
		fprintf(stderr, "talaris: unpublished leftover %u replaced by %u\n", c->pending, to);
		abort();
	}
#endif
	c->pending = to;
}

void tl_conn_trim(struct tl_conn *c)
{
	c->msg_len = 0; /* a message the end cut: nobody completes it */
	if (c->pending == TL_PEND_MSG)
		tl_conn_pend_set(c, TL_PEND_NONE);
	if (c->msg_cap > TL_MSG_KEEP) {
		free(c->msg);
		c->msg = NULL;
		c->msg_cap = 0;
#ifdef __GLIBC__
		/* Give the pages back too: once glibc's dynamic mmap threshold has
		 * risen past such a size (any earlier free of a big block), the
		 * buffer came from an arena heap, and free alone keeps its pages
		 * (seen: 8 freed 16 MiB buffers, RSS unchanged). Rare and cold:
		 * a connection that ended holding over 1 MiB. */
		malloc_trim(0);
#endif
	}
}

void tl_conn_reset(struct tl_conn *c)
{
	/* Keep allocations (msg, out) for reuse by the next dial on this slot. */
	uint8_t *msg = c->msg, *o0 = c->out[0].p, *o1 = c->out[1].p, *sq = c->sq.p, *pt = c->tx_pt.p;
	size_t mc = c->msg_cap, c0 = c->out[0].cap, c1 = c->out[1].cap, sqc = c->sq.cap, ptc = c->tx_pt.cap;
	uint32_t slot = c->slot;

	free(c->fail_head);
	if (sqc > (1u << 20)) { /* a send queue cut by a close or teardown: give back a big one */
		free(sq);
		sq = NULL;
		sqc = 0;
	}
	memset(c, 0, sizeof(*c));
	c->slot = slot;
	c->fd = -1;
	tl_rxq_init(&c->rxq);
	c->cur_q = -1;
	c->msg = msg;
	c->msg_cap = mc;
	c->out[0].p = o0;
	c->out[0].cap = c0;
	c->out[1].p = o1;
	c->out[1].cap = c1;
	c->sq.p = sq;
	c->sq.cap = sqc;
	c->tx_pt.p = pt;
	c->tx_pt.cap = ptc;
	c->close_code = 1005;
	c->retry_after = -1;
}

void tl_conn_reset_keep(struct tl_conn *c)
{
	uint32_t gen = c->gen, attempts = c->rc_attempts;
	uint64_t opens = c->opens, mi = c->msgs_in, bi = c->bytes_in;
	uint64_t tx_done = c->tx_done; /* Go's admission counts on it: it only grows */
	struct tl_dial *d = c->dial;
	struct tl_conn *stall_next = c->stall_next;
	uint8_t stop = c->rc_stop, listed = c->on_stall_list, epoch = c->rx_epoch;

	tl_conn_reset(c);
	/* Still linked on loop->stalled: tl_loop_run_stalled unlinks it. */
	c->stall_next = stall_next;
	c->on_stall_list = listed;
	c->gen = gen;
	c->dial = d;
	c->rc_attempts = attempts;
	c->opens = opens;
	c->msgs_in = mi;
	c->bytes_in = bi;
	c->rc_stop = stop;
	c->tx_done = tx_done;
	c->rx_epoch = epoch; /* same gen: a lost recv's late completion stays stale */
}

void tl_conn_free_bufs(struct tl_conn *c)
{
	free(c->fail_head);
	free(c->msg);
	free(c->out[0].p);
	free(c->out[1].p);
	free(c->tx_pt.p);
	free(c->sq.p);
	c->fail_head = NULL;
	c->msg = c->out[0].p = c->out[1].p = c->tx_pt.p = c->sq.p = NULL;
}
