/* ws/send.c - what a connection sends: frames masked with CSPRNG keys
 * into its collecting buffer (tl_conn_wbuf), the send queue of data
 * frames that wait for room there, the close frame and the states of
 * the close handshake and of the sending side's end (tl_conn_close_step,
 * tl_conn_shut_set), and failing a
 * connection - here, not in ws/close.c, because failing sends the close
 * frame and framing fails the connection when memory runs out: one
 * cycle of calls, kept in one file. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ws/internal.h"
#include "base/pub.h"
#include "base/timer.h"
#include "loop/state.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

uint8_t *tl_outbuf_reserve(struct tl_outbuf *ob, size_t n)
{
	if (ob->len + n > ob->cap) {
		size_t cap = ob->cap ? ob->cap : 4096;
		uint8_t *p;
		while (cap < ob->len + n)
			cap *= 2;
		p = realloc(ob->p, cap);
		if (!p)
			return NULL;
		ob->p = p;
		ob->cap = cap;
	}
	ob->len += n;
	return ob->p + ob->len - n;
}

int tl_conn_out_append(struct tl_conn *c, const uint8_t *p, size_t n)
{
	uint8_t *d = tl_outbuf_reserve(&c->out[c->cur], n);
	if (!d)
		return -1;
	memcpy(d, p, n);
	return 0;
}

static void mask_key(struct tl_loop *l, uint8_t key[4])
{
	/* rnd_off == 0 only before the first fill (it is >= 4 after every
	 * use): the loop starts with rnd zeroed, and without this check the
	 * first 1024 frames would go out with all-zero mask keys. */
	if (l->cs.rnd_off == 0 || l->cs.rnd_off + 4 > sizeof(l->cs.rnd)) {
		size_t got = 0;
		while (got < sizeof(l->cs.rnd)) {
			ssize_t r = getrandom(l->cs.rnd + got, sizeof(l->cs.rnd) - got, 0);
			if (r < 0) {
				if (errno == EINTR)
					continue;
				abort(); /* no CSPRNG: refuse to send predictable masks */
			}
			got += (size_t)r;
		}
		l->cs.rnd_off = 0;
	}
	memcpy(key, l->cs.rnd + l->cs.rnd_off, 4);
	l->cs.rnd_off += 4;
}

/* tl_conn_send_frame frames, masks and queues one frame in tl_conn_wbuf:
 * wire bytes for ws://, plaintext tl_tls_seal encrypts for wss:// (one
 * copy either way: the masked frame is written once, in place). Returns 0
 * or -1 on allocation failure (the connection is then failed). */
int tl_conn_send_frame(struct tl_loop *l, struct tl_conn *c, int opcode, int fin, const uint8_t *p, size_t n)
{
	struct tl_outbuf *ob = tl_conn_wbuf(c);
	uint8_t key[4];
	uint8_t *d;
	size_t hl;

	if (c->fd < 0)
		return 0; /* a memory connection has no peer: pongs and closes go nowhere */
	mask_key(l, key);
	d = tl_outbuf_reserve(ob, TL_WS_MAX_HDR + n);
	if (!d) {
		tl_conn_fail(l, c, TL_E_NOMEM, ENOMEM, 1011, "out of memory queueing a frame");
		return -1;
	}
	hl = tl_ws_write_hdr(d, fin, opcode, n, key);
	tl_ws_mask(d + hl, p, n, key, 0);
	ob->len -= TL_WS_MAX_HDR - hl;
	return 0;
}

static inline size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

/* tl_sendq_reserve makes room for n more bytes at q's tail and returns where
 * they go, or NULL on no memory. The consumed prefix is reclaimed by
 * moving the live records down only when it is at least as large as they
 * are (so every byte is moved O(1) times on average; a queue kept full by
 * a steady sender would otherwise be moved whole for every frame
 * appended), else the buffer doubles (keeping only the live records). */
uint8_t *tl_sendq_reserve(struct tl_sendq *q, size_t n)
{
	if (q->len + n > q->cap) {
		size_t live = q->len - q->head;
		if (q->head >= live && live + n <= q->cap) {
			memmove(q->p, q->p + q->head, live);
		} else {
			size_t cap = q->cap ? q->cap * 2 : 65536;
			uint8_t *np;
			while (cap < live + n)
				cap *= 2;
			np = malloc(cap);
			if (!np)
				return NULL;
			if (live)
				memcpy(np, q->p + q->head, live);
			free(q->p);
			q->p = np;
			q->cap = cap;
		}
		q->len = live;
		q->head = 0;
	}
	q->len += n;
	return q->p + q->len - n;
}

/* sq_push frames and masks one data frame at q's tail. Returns 0 or -1 on
 * no memory. */
static int sq_push(struct tl_loop *l, struct tl_conn *c, int opcode, int fin, const uint8_t *p, size_t n,
		   uint64_t units)
{
	size_t max = sizeof(struct tl_sqrec) + align8(TL_WS_MAX_HDR + n), hl;
	uint8_t *d = tl_sendq_reserve(&c->sq, max), key[4];
	struct tl_sqrec r = {.units = units, .fin = (uint8_t)!!fin, .close = opcode == TL_OP_CLOSE};

	if (!d)
		return -1;
	mask_key(l, key);
	hl = tl_ws_write_hdr(d + sizeof(r), fin, opcode, n, key);
	tl_ws_mask(d + sizeof(r) + hl, p, n, key, 0);
	r.len = (uint32_t)(hl + n);
	memcpy(d, &r, sizeof(r));
	c->sq.len -= max - (sizeof(r) + align8(hl + n));
	return 0;
}

/* sq_move moves the frame at the send queue's head into tl_conn_wbuf.
 * Returns 0, or -1 after failing c. */
static int sq_move(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_sendq *q = &c->sq;
	struct tl_outbuf *ob = tl_conn_wbuf(c);
	struct tl_sqrec r;
	const uint8_t *f = q->p + q->head + sizeof(r);
	uint8_t *d;

	memcpy(&r, q->p + q->head, sizeof(r));
	d = tl_outbuf_reserve(ob, r.len);
	if (!d) {
		tl_conn_fail(l, c, TL_E_NOMEM, ENOMEM, 1011, "out of memory queueing a frame");
		return -1;
	}
	memcpy(d, f, r.len);
	ob->units += r.units;
	if (r.close) {
		ob->replies += r.len; /* as send_reply counts a close frame */
		c->close_queued = 0;
	} else {
		c->tx_msg_open = !r.fin;
	}
	q->head += sizeof(r) + align8(r.len);
	if (sq_empty(q))
		sq_reset(q);
	return 0;
}

int tl_conn_send_data(struct tl_loop *l, struct tl_conn *c, int opcode, int fin, const uint8_t *p, size_t n,
		      uint64_t units)
{
	if (c->fd < 0) { /* a memory connection: nobody to send to */
		tl_pub_tx_retire(l, c, units);
		return 0;
	}
	if (c->state == TL_ST_OPEN && sq_empty(&c->sq) && tl_conn_collecting(c) < TL_TX_CHUNK) {
		if (tl_conn_send_frame(l, c, opcode, fin, p, n) < 0)
			return -1;
		tl_conn_wbuf(c)->units += units;
		c->tx_msg_open = !fin;
		return 0;
	}
	if (sq_push(l, c, opcode, fin, p, n, units) < 0) {
		tl_conn_fail(l, c, TL_E_NOMEM, ENOMEM, 1011, "out of memory queueing a frame");
		return -1;
	}
	return 0;
}

int tl_conn_tx_refill(struct tl_loop *l, struct tl_conn *c)
{
	if (c->state != TL_ST_OPEN && c->state != TL_ST_CLOSING)
		return 0; /* sends made before the upgrade completed wait for it */
	while (!sq_empty(&c->sq) && tl_conn_collecting(c) < TL_TX_CHUNK)
		if (sq_move(l, c) < 0)
			return -1;
	return 0;
}

/* sq_drop empties the send queue, dropping its frames (their units
 * counted as dropped); our queued close frame, if any, is kept (the only
 * record left) when keep_close is set. */
static void sq_drop(struct tl_loop *l, struct tl_conn *c, int keep_close)
{
	struct tl_sendq *q = &c->sq;
	uint64_t units = 0;
	uint8_t close[sizeof(struct tl_sqrec) + TL_WS_MAX_HDR + 125];
	size_t close_len = 0;

	while (!sq_empty(q)) {
		struct tl_sqrec r;
		memcpy(&r, q->p + q->head, sizeof(r));
		if (r.close && keep_close && sizeof(r) + r.len <= sizeof(close)) {
			close_len = sizeof(r) + r.len;
			memcpy(close, q->p + q->head, close_len);
		}
		units += r.units;
		q->head += sizeof(r) + align8(r.len);
	}
	sq_reset(q);
	if (!close_len)
		c->close_queued = 0;
	else {
		uint8_t *d = tl_sendq_reserve(q, align8(close_len));
		if (d)
			memcpy(d, close, close_len);
		else
			c->close_queued = 0; /* no memory: the close frame is lost, the close timeout ends c */
	}
	tl_pub_tx_drop(l, c, units);
}

void tl_conn_tx_cut(struct tl_loop *l, struct tl_conn *c)
{
	while (c->tx_msg_open && !sq_empty(&c->sq))
		if (sq_move(l, c) < 0)
			return;
	sq_drop(l, c, 1);
	/* Our queued close frame (all that is left) goes now, before the
	 * sending side ends (tl_tx_shut_wr seals and shuts after what the
	 * collecting buffer holds, never after the send queue). */
	if (c->close_queued && sq_move(l, c) < 0)
		return;
}

void tl_conn_tx_drop_all(struct tl_loop *l, struct tl_conn *c)
{
	uint64_t units = 0;

	for (int i = 0; i < 2; i++) {
		struct tl_outbuf *ob = &c->out[i];
		if (c->send_inflight && i == (c->cur ^ 1))
			continue; /* the kernel still reads it; on_send retires it */
		units += ob->units;
		ob->units = 0;
		ob->len = 0;
		ob->replies = 0;
	}
	units += c->tx_pt.units; /* wss plaintext not yet encrypted */
	c->tx_pt.units = 0;
	c->tx_pt.len = 0;
	c->tx_pt.replies = 0;
	if (!c->send_inflight)
		c->sent_off = 0;
	tl_pub_tx_drop(l, c, units);
	sq_drop(l, c, 0);
}

void tl_conn_shut_set(struct tl_conn *c, uint8_t to)
{
#ifdef TL_DEBUG
	/* The sending side ends once: nothing leaves DONE, nothing goes back. */
	if (to <= c->shut_wr) {
		fprintf(stderr, "talaris: sending side's end %u -> %u\n", c->shut_wr, to);
		abort();
	}
#endif
	c->shut_wr = to;
}

/* tl_conn_close_step is every transition of the close handshake
 * (c->close_hs): each event adds its bit, so NONE -> SENT or RCVD, and
 * either -> BOTH. */
void tl_conn_close_step(struct tl_conn *c, enum tl_close ev)
{
	c->close_hs = (uint8_t)(c->close_hs | ev);
}

/* close_payload writes a close frame's body to pl (125 bytes): code and up
 * to 123 reason bytes, nothing for code 0 or 1005. Returns its length. */
static size_t close_payload(uint8_t pl[125], uint16_t code, const uint8_t *reason, size_t rlen)
{
	if (!code || code == 1005)
		return 0;
	if (rlen > 123)
		rlen = 123;
	pl[0] = (uint8_t)(code >> 8);
	pl[1] = (uint8_t)code;
	if (rlen)
		memcpy(pl + 2, reason, rlen);
	return 2 + rlen;
}

int tl_conn_send_close(struct tl_loop *l, struct tl_conn *c, uint16_t code, const uint8_t *reason, size_t rlen)
{
	uint8_t pl[125];
	size_t n;

	if (tl_conn_close_sent(c))
		return 0;
	tl_conn_close_step(c, TL_CLOSE_SENT);
	/* The close jumps the queue: only a message already started goes
	 * before it. */
	tl_conn_tx_cut(l, c);
	if (tl_conn_ending(c))
		return -1;
	n = close_payload(pl, code, reason, rlen);
	return send_reply(l, c, TL_OP_CLOSE, pl, n);
}

int tl_conn_close_after_queue(struct tl_loop *l, struct tl_conn *c, uint16_t code, const uint8_t *reason,
			      size_t rlen)
{
	uint8_t pl[125];
	size_t n;

	if (tl_conn_close_sent(c))
		return 0;
	if (sq_empty(&c->sq))
		return tl_conn_send_close(l, c, code, reason, rlen); /* nothing waits: it goes next */
	tl_conn_close_step(c, TL_CLOSE_SENT);
	n = close_payload(pl, code, reason, rlen);
	if (sq_push(l, c, TL_OP_CLOSE, 1, pl, n, 0) < 0) {
		tl_conn_fail(l, c, TL_E_NOMEM, ENOMEM, 1011, "out of memory queueing a frame");
		return -1;
	}
	c->close_queued = 1;
	return 0;
}

uint64_t tl_conn_close_timeout(const struct tl_loop *l, const struct tl_conn *c)
{
	return c->dial && c->dial->close_timeout_ns ? c->dial->close_timeout_ns : l->cfg.close_timeout_ns;
}

void tl_conn_fail(struct tl_loop *l, struct tl_conn *c, int err, int aux, uint16_t code, const char *detail)
{
	if (!c->fail_err) {
		c->fail_err = err;
		c->fail_aux = aux;
		c->fail_code = code;
		if (detail)
			tl_pub_detail(l, c, detail);
	}
	c->discard = 1;
	if (c->pending != TL_PEND_OPEN) /* the message or control frame waiting is dropped */
		tl_conn_pend_set(c, TL_PEND_NONE);
	if (c->state == TL_ST_OPEN && code && code != 1006 && !tl_conn_close_sent(c) && !c->eof && !c->send_errno && c->fd >= 0) {
		tl_conn_send_close(l, c, code, NULL, 0);
		tl_pub_set_state(l, c, TL_ST_CLOSING);
		c->todo |= TL_DO_FLUSH;
		/* Give the peer a moment to read our close; then we go. */
		tl_timer_set_deadline(l, c, tl_conn_close_timeout(l, c) < 1000000000ull ? tl_conn_close_timeout(l, c) : 1000000000ull);
		return;
	}
	c->todo |= TL_DO_TEARDOWN;
}
