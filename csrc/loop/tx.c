/* loop/tx.c - the send side of a connection: one send in the kernel at a time
 * (bytes stay in order), the collecting out buffer topped up from the
 * send queue and, for wss, sealed by the TLS transport first; the end of
 * the sending side after a close handshake. Calls ws/ (refill, drop),
 * the TLS transport (seal, close_notify) and uring.h; never the lifecycle: a failure
 * is left in c->todo for the caller (tl_life_flush acts on it). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/tx.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "base/pub.h"
#include "base/timer.h"
#include "transport/tls.h"
#include "loop/uring.h"

/* tl_tx_submit puts one send of ob->p[c->sent_off..ob->len) in the SQ.
 * Returns 0, or -1 when no SQE was free (the bytes stay; the sweep or the
 * next flush retries). */
int tl_tx_submit(struct tl_loop *l, struct tl_conn *c, struct tl_outbuf *ob)
{
	struct io_uring_sqe *sqe = tl_uring_sqe(l);
	if (!sqe) {
		l->tx_retry = 1; /* the loop flushes again (tl_loop_run_rearms) */
		return -1;
	}
	io_uring_prep_send(sqe, c->fd, ob->p + c->sent_off, ob->len - c->sent_off, MSG_NOSIGNAL);
	io_uring_sqe_set_data64(sqe, tl_ud(TL_OPK_SEND, c->gen, c->slot));
	c->send_inflight = 1;
	return 0;
}

/* ---- direct sends: who writes a plain connection's socket ---- */

static inline uint32_t *own_word(struct tl_loop *l, const struct tl_conn *c)
{
	return &l->pub[c->slot].tx_own;
}

static void tx_defer(struct tl_loop *l, struct tl_conn *c)
{
	if (!c->tx_defer) {
		c->tx_defer = 1;
		l->tx_deferred++;
	}
}

static void tx_undefer(struct tl_loop *l, struct tl_conn *c)
{
	if (c->tx_defer) {
		c->tx_defer = 0;
		l->tx_deferred--;
	}
}

/* tx_take makes the loop the writer of c's socket. Returns 1 when it is,
 * 0 when a Go sender holds it (or handed it off: the rest of its frame is
 * on its way in the command ring); then Go is asked for it (TL_OWN_WANT)
 * and c is parked. */
static int tx_take(struct tl_loop *l, struct tl_conn *c)
{
	uint32_t *w = own_word(l, c);
	uint32_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);

	for (;;) {
		uint32_t st = v & TL_OWN_STATE;
		if (st == TL_OWN_LOOP)
			return 1;
		if (st == TL_OWN_FREE) {
			if (__atomic_compare_exchange_n(w, &v, (v & ~(TL_OWN_STATE | TL_OWN_WANT)) | TL_OWN_LOOP, 0,
							__ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE))
				return 1;
			continue;
		}
		if (st == TL_OWN_HANDOFF || (v & TL_OWN_WANT) ||
		    __atomic_compare_exchange_n(w, &v, v | TL_OWN_WANT, 0, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
			tx_defer(l, c);
			return 0;
		}
	}
}

/* tx_release offers c's socket to Go senders: only an open plain
 * connection that may still send data, with nothing of the loop's left
 * to write (so a direct write can never overtake or split loop output). */
static void tx_release(struct tl_loop *l, struct tl_conn *c)
{
	uint32_t *w = own_word(l, c);
	uint32_t v;

	if (c->is_tls || c->fd < 0 || c->state != TL_ST_OPEN || c->close_hs != TL_CLOSE_NONE || c->send_errno ||
	    tl_conn_ending(c) || c->discard || c->shut_wr != TL_SHUT_NONE || c->send_inflight || c->tx_msg_open ||
	    c->out[0].len || c->out[1].len || c->sq.head != c->sq.len)
		return;
	v = __atomic_load_n(w, __ATOMIC_RELAXED);
	if ((v & TL_OWN_STATE) != TL_OWN_LOOP)
		return;
	/* Go writes only the states the loop gave up, so a plain store;
	 * release: the fd is visible to the sender whose CAS sees FREE. */
	__atomic_store_n(&l->pub[c->slot].tx_fd, c->fd, __ATOMIC_RELAXED);
	__atomic_store_n(w, (v & ~(TL_OWN_STATE | TL_OWN_WANT)) | TL_OWN_FREE, __ATOMIC_RELEASE);
}

int tl_tx_seize(struct tl_loop *l, struct tl_conn *c)
{
	uint32_t *w = own_word(l, c);
	uint32_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);

	for (;;) {
		if ((v & TL_OWN_STATE) == TL_OWN_GO) {
			if ((v & TL_OWN_WANT) ||
			    __atomic_compare_exchange_n(w, &v, v | TL_OWN_WANT, 0, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
				tx_defer(l, c);
				return 0;
			}
			continue;
		}
		if (__atomic_compare_exchange_n(w, &v, (((v >> TL_OWN_EPOCH_SHIFT) + 1) << TL_OWN_EPOCH_SHIFT) | TL_OWN_LOOP,
						0, __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE)) {
			tx_undefer(l, c);
			return 1;
		}
	}
}

int tl_tx_handed_back(struct tl_loop *l, struct tl_conn *c)
{
	uint32_t st;
	if (!c->tx_defer)
		return 0;
	st = __atomic_load_n(own_word(l, c), __ATOMIC_ACQUIRE) & TL_OWN_STATE;
	if (st == TL_OWN_GO || st == TL_OWN_HANDOFF)
		return 0;
	tx_undefer(l, c);
	return 1;
}

int tl_tx_deferred_ready(struct tl_loop *l)
{
	for (uint32_t i = 0; i < l->cfg.max_conns && l->tx_deferred; i++) {
		const struct tl_conn *c = &l->conns[i];
		uint32_t st;
		if (!c->tx_defer)
			continue;
		st = __atomic_load_n(own_word(l, c), __ATOMIC_SEQ_CST) & TL_OWN_STATE;
		if (st == TL_OWN_LOOP || st == TL_OWN_FREE)
			return 1;
	}
	return 0;
}

int tl_tx_direct_rest(struct tl_loop *l, struct tl_conn *c, uint16_t epoch, const uint8_t *p, size_t n,
		      uint64_t units)
{
	uint32_t *w = own_word(l, c);
	uint32_t v = __atomic_load_n(w, __ATOMIC_ACQUIRE);
	struct tl_outbuf *ob = &c->out[c->cur ^ 1];

	if ((v & TL_OWN_STATE) != TL_OWN_HANDOFF || (uint16_t)(v >> TL_OWN_EPOCH_SHIFT) != epoch) {
		tl_pub_tx_drop(l, c, units); /* that socket is gone: nobody reads the rest */
		return 0;
	}
	__atomic_store_n(w, (v & ~(TL_OWN_STATE | TL_OWN_WANT)) | TL_OWN_LOOP, __ATOMIC_RELEASE);
	tx_undefer(l, c);
	/* Go took the socket with nothing of the loop's in flight or queued, so
	 * the in-flight buffer is empty: the rest goes there, ahead of what the
	 * loop collected in out[cur] meanwhile (a pong, a close, later sends). */
	if (c->dying || c->send_errno || c->send_inflight || ob->len) {
		tl_pub_tx_drop(l, c, units);
		if (c->dying)
			return 1; /* it may have waited for the socket */
		if (!c->send_errno) /* cannot happen: never splice a frame */
			tl_conn_fail(l, c, TL_E_INTERNAL, 0, 1011, "direct send handoff with output in flight");
		else
			c->todo |= TL_DO_FLUSH; /* drops what was collected meanwhile */
		return 0;
	}
	if (ob->cap < n) {
		uint8_t *np = realloc(ob->p, n);
		if (!np) {
			tl_pub_tx_drop(l, c, units);
			tl_conn_fail(l, c, TL_E_NOMEM, ENOMEM, 1011, "out of memory taking a direct send's rest");
			return 0;
		}
		ob->p = np;
		ob->cap = n;
	}
	memcpy(ob->p, p, n);
	ob->len = n;
	ob->units = units;
	ob->replies = 0;
	c->sent_off = 0;
	c->todo |= TL_DO_FLUSH;
	return 0;
}

/* close_grace starts the end of a close handshake whose frames have
 * crossed, now that our sending side is shut: at the server's FIN (the
 * recv's end), at its first bytes after its close frame (at once, if they
 * came already), or TL_CLOSE_GRACE_NS from now, whichever is first; the
 * deadline's end is clean (tick.c). */
static void close_grace(struct tl_loop *l, struct tl_conn *c)
{
	uint64_t grace = tl_timer_now_ns() + TL_CLOSE_GRACE_NS;

	if (!tl_conn_close_rcvd(c))
		return;
	if (c->late_rx) {
		c->todo |= TL_DO_TEARDOWN;
		return;
	}
	if (!c->deadline_ns || c->deadline_ns > grace)
		tl_timer_set_deadline(l, c, TL_CLOSE_GRACE_NS);
}

/* tl_tx_flush: one send per connection at a time keeps bytes in order. */
void tl_tx_flush(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_outbuf *ob;

	if (c->send_inflight || c->fd < 0 || tl_conn_unconnected(c))
		return;
	if (c->send_errno) { /* the socket refused a send: nobody reads these bytes */
		tl_conn_tx_drop_all(l, c);
		return;
	}
	ob = &c->out[c->cur ^ 1];
	if (ob->len > c->sent_off) {
		if (tx_take(l, c))
			tl_tx_submit(l, c, ob);
		return;
	}
	/* Top up from the send queue; wss: encrypt what ws/ framed. */
	if (tl_conn_tx_refill(l, c) < 0 || (c->is_tls && tl_tls_seal(l, c) < 0) || tl_conn_ending(c))
		return;
	ob = &c->out[c->cur];
	if (ob->len == 0) {
		if (c->shut_wr == TL_SHUT_WANT && tx_take(l, c)) {
			/* Everything up to the close frame (and close_notify) has
			 * left: tell the peer we are done writing. */
			shutdown(c->fd, SHUT_WR);
			tl_conn_shut_set(c, TL_SHUT_DONE);
			close_grace(l, c);
		}
		tx_release(l, c); /* nothing left to write: Go senders may */
		return;
	}
	if (!tx_take(l, c))
		return; /* a Go sender writes the socket: it hands it back */
	c->sent_off = 0;
	if (tl_tx_submit(l, c, ob) == 0)
		c->cur ^= 1; /* new bytes go to the other buffer meanwhile */
}

void tl_tx_shut_wr(struct tl_loop *l, struct tl_conn *c)
{
	if (c->shut_wr != TL_SHUT_NONE || c->fd < 0 || c->dying)
		return;
	tl_conn_shut_set(c, TL_SHUT_WANT);
	if (c->is_tls)
		tl_tls_close_notify(c);
	tl_tx_flush(l, c);
}
