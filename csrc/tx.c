/* tx.c - the send side of a connection: one send in the kernel at a time
 * (bytes stay in order), the collecting out buffer topped up from the
 * send queue and, for wss, sealed by the TLS transport first; the end of
 * the sending side after a close handshake. Calls conn.c (refill, drop),
 * tls.c (seal, close_notify) and uring.h; never the lifecycle: a failure
 * is left in c->todo for the caller (tl_life_flush acts on it). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "tx.h"

#include <sys/socket.h>

#include "tls.h"
#include "uring.h"

/* tl_tx_submit puts one send of ob->p[c->sent_off..ob->len) in the SQ.
 * Returns 0, or -1 when no SQE was free (the bytes stay; the sweep or the
 * next flush retries). */
int tl_tx_submit(struct tl_loop *l, struct tl_conn *c, struct tl_outbuf *ob)
{
	struct io_uring_sqe *sqe = tl_uring_sqe(l);
	if (!sqe) {
		l->tx_retry = 1; /* the loop flushes again (run_rearms) */
		return -1;
	}
	io_uring_prep_send(sqe, c->fd, ob->p + c->sent_off, ob->len - c->sent_off, MSG_NOSIGNAL);
	io_uring_sqe_set_data64(sqe, tl_ud(TL_OPK_SEND, c->gen, c->slot));
	c->send_inflight = 1;
	return 0;
}

/* tl_tx_flush: one send per connection at a time keeps bytes in order. */
void tl_tx_flush(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_outbuf *ob;

	if (c->send_inflight || c->fd < 0 || c->state == TL_ST_CONNECTING)
		return;
	if (c->send_errno) { /* the socket refused a send: nobody reads these bytes */
		tl_conn_tx_drop_all(l, c);
		return;
	}
	ob = &c->out[c->cur ^ 1];
	if (ob->len > c->sent_off) {
		tl_tx_submit(l, c, ob);
		return;
	}
	/* Top up from the send queue; wss: encrypt what conn.c framed. */
	if (tl_conn_tx_refill(l, c) < 0 || (c->is_tls && tl_tls_seal(l, c) < 0) || tl_conn_ending(c))
		return;
	ob = &c->out[c->cur];
	if (ob->len == 0) {
		if (c->shut_wr == 1) {
			/* Everything up to the close frame (and close_notify) has
			 * left: tell the peer we are done writing. */
			shutdown(c->fd, SHUT_WR);
			c->shut_wr = 2;
		}
		return;
	}
	c->sent_off = 0;
	if (tl_tx_submit(l, c, ob) == 0)
		c->cur ^= 1; /* new bytes go to the other buffer meanwhile */
}

void tl_tx_shut_wr(struct tl_loop *l, struct tl_conn *c)
{
	if (c->shut_wr || c->fd < 0 || c->dying)
		return;
	c->shut_wr = 1;
	if (c->is_tls)
		tl_tls_close_notify(c);
	tl_tx_flush(l, c);
}
