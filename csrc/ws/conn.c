/* ws/conn.c - one WebSocket client connection inside the loop, the WebSocket
 * state machine: the upgrade exchange, the streaming frame parser (split
 * headers, payloads across buffer slots, fragmentation, interleaved
 * control frames), the close handshake, failure, and outgoing framing
 * with CSPRNG mask keys.
 *
 * Input arrives as byte runs (a buffer slot, or TLS plaintext) from a
 * transport (plain.c, tls.c). A run is consumed as far as the event ring
 * and arena allow; what cannot be published stays where it is and the
 * connection stalls until Go releases space (back-pressure, never loss).
 *
 * Layering: this file includes state.h, not loop.h, and calls only the
 * layers below it (evq, slots, pub, timer, sample, the codecs). What
 * needs the loop (teardown, a flush, a regroup, ending the sending side)
 * is requested in c->todo (TL_DO_*) and done by tl_life_after once the
 * call returns; output is framed into tl_conn_wbuf and the transport
 * (plain: nothing to do; TLS: tl_tls_seal) is asked by the loop to send
 * it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "base/pub.h"
#include "base/sample.h"
#include "loop/state.h"
#include "base/timer.h"

#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>


void tl_conn_trim(struct tl_conn *c)
{
	c->msg_len = 0; /* a message the end cut: nobody completes it */
	c->msg_ready = 0;
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
	/* Still linked on loop->stalled: run_stalled unlinks it. */
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

/* ---- output ---- */

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

/* send_reply queues one of the loop's own control frames (pong, close)
 * and counts its bytes as replies (tl_conn_replies). */
static int send_reply(struct tl_loop *l, struct tl_conn *c, int opcode, const uint8_t *p, size_t n)
{
	struct tl_outbuf *ob = tl_conn_wbuf(c);
	size_t before = ob->len;
	int r = tl_conn_send_frame(l, c, opcode, 1, p, n);
	if (r == 0 && ob->len > before)
		ob->replies += ob->len - before;
	return r;
}

/* ---- the send queue ---- */

static inline size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

static inline int sq_empty(const struct tl_sendq *q) { return q->head == q->len; }

/* sq_reserve makes room for n more bytes at q's tail and returns where
 * they go, or NULL on no memory. The consumed prefix is reclaimed by
 * moving the live records down only when it is at least as large as they
 * are (so every byte is moved O(1) times on average; a queue kept full by
 * a steady sender would otherwise be moved whole for every frame
 * appended), else the buffer doubles (keeping only the live records). */
static uint8_t *sq_reserve(struct tl_sendq *q, size_t n)
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

/* sq_reset empties q; memory kept after a burst is given back. */
static void sq_reset(struct tl_sendq *q)
{
	q->head = q->len = 0;
	if (q->cap > (1u << 20)) {
		free(q->p);
		q->p = NULL;
		q->cap = 0;
	}
}

/* sq_push frames and masks one data frame at q's tail. Returns 0 or -1 on
 * no memory. */
static int sq_push(struct tl_loop *l, struct tl_conn *c, int opcode, int fin, const uint8_t *p, size_t n,
		   uint32_t units)
{
	size_t max = sizeof(struct tl_sqrec) + align8(TL_WS_MAX_HDR + n), hl;
	uint8_t *d = sq_reserve(&c->sq, max), key[4];
	struct tl_sqrec r = {.units = units, .fin = (uint8_t)!!fin};

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
	c->tx_msg_open = !r.fin;
	q->head += sizeof(r) + align8(r.len);
	if (sq_empty(q))
		sq_reset(q);
	return 0;
}

int tl_conn_send_data(struct tl_loop *l, struct tl_conn *c, int opcode, int fin, const uint8_t *p, size_t n,
		      uint32_t units)
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

/* sq_drop empties the send queue, retiring the units of its frames. */
static void sq_drop(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_sendq *q = &c->sq;
	uint64_t units = 0;

	while (!sq_empty(q)) {
		struct tl_sqrec r;
		memcpy(&r, q->p + q->head, sizeof(r));
		units += r.units;
		q->head += sizeof(r) + align8(r.len);
	}
	sq_reset(q);
	if (units)
		tl_pub_tx_retire(l, c, units);
}

void tl_conn_tx_cut(struct tl_loop *l, struct tl_conn *c)
{
	while (c->tx_msg_open && !sq_empty(&c->sq))
		if (sq_move(l, c) < 0)
			return;
	sq_drop(l, c);
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
	if (units)
		tl_pub_tx_retire(l, c, units);
	sq_drop(l, c);
}

/* ---- injected input (memory connections) ---- */

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
	uint8_t *d = sq_reserve(&c->sq, n - used);
	if (!d) {
		tl_pub_tx_retire(l, c, n - used);
		tl_conn_fail(l, c, TL_E_NOMEM, ENOMEM, 1011, "out of memory keeping injected bytes");
		return TL_FEED_DEAD;
	}
	memcpy(d, p + used, n - used);
	return TL_FEED_STALL;
}

int tl_conn_send_close(struct tl_loop *l, struct tl_conn *c, uint16_t code, const uint8_t *reason, size_t rlen)
{
	uint8_t pl[125];
	size_t n = 0;

	if (c->close_sent)
		return 0;
	c->close_sent = 1;
	/* The close jumps the queue: only a message already started goes
	 * before it. */
	tl_conn_tx_cut(l, c);
	if (tl_conn_ending(c))
		return -1;
	if (code && code != 1005) {
		if (rlen > 123)
			rlen = 123;
		pl[0] = (uint8_t)(code >> 8);
		pl[1] = (uint8_t)code;
		if (rlen)
			memcpy(pl + 2, reason, rlen);
		n = 2 + rlen;
	}
	return send_reply(l, c, TL_OP_CLOSE, pl, n);
}

/* ---- upgrade ---- */

int tl_conn_start_upgrade(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_dial *d = c->dial;
	tl_http_request rq;
	struct tl_outbuf *ob;
	size_t cap, n;
	uint8_t *buf;

	tl_pub_set_state(l, c, TL_ST_UPGRADING);
	if (tl_ws_make_key(c->key) < 0) {
		tl_conn_fail(l, c, TL_E_INTERNAL, errno, 0, "getrandom failed");
		return -1;
	}
	memset(&rq, 0, sizeof(rq));
	rq.host = d->host;
	rq.host_len = d->host_len;
	rq.path = d->path;
	rq.path_len = d->path_len;
	rq.headers = d->headers;
	rq.headers_len = d->headers_len;
	rq.protocols = d->protocols;
	rq.protocols_len = d->protocols_len;
	rq.key = c->key;
	cap = 512 + d->host_len + d->path_len + d->headers_len + d->protocols_len;
	ob = tl_conn_wbuf(c); /* wss: the loop's flush encrypts it (tl_tls_seal) */
	buf = tl_outbuf_reserve(ob, cap);
	if (!buf)
		goto nomem;
	n = tl_http_write_request((char *)buf, cap, &rq);
	ob->len -= cap - n;
	if (!n)
		goto nomem;
	c->hs = malloc(TL_HTTP_MAX_HEAD);
	if (!c->hs)
		goto nomem;
	c->hs_len = 0;
	return 0;
nomem:
	tl_conn_fail(l, c, TL_E_NOMEM, ENOMEM, 0, "out of memory writing the upgrade request");
	return -1;
}

int tl_conn_send_subscribe(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_dial *d = c->dial;
	struct tl_conn_pub *pub = &l->pub[c->slot];
	size_t off = 0;

	if (!d || !d->subscribe_len)
		return 0;
	while (off + 4 <= d->subscribe_len) {
		uint32_t n;
		memcpy(&n, d->subscribe + off, 4);
		off += 4;
		if (n > d->subscribe_len - off)
			break; /* Go builds the blob; a short one is a bug, not input */
		if (tl_conn_send_frame(l, c, TL_OP_TEXT, 1, (const uint8_t *)d->subscribe + off, n) < 0)
			return -1;
		__atomic_store_n(&pub->msgs_out, pub->msgs_out + 1, __ATOMIC_RELAXED);
		__atomic_store_n(&pub->bytes_out, pub->bytes_out + n, __ATOMIC_RELAXED);
		off += n;
	}
	c->todo |= TL_DO_FLUSH;
	return 0;
}

/* conn_emit appends one event for c to the event queue: kind, payload
 * p[0..n) copied into the arena, and for control events code, err, aux
 * and flags. Returns 0, or -1 when the ring or arena is full (nothing was
 * written). Inline so the per-message path (constant kind, zero code)
 * folds down to tl_evq_append's fast path. */
static inline __attribute__((always_inline)) int conn_emit(struct tl_loop *l, struct tl_conn *c, int kind,
							   const uint8_t *p, size_t n, uint16_t code, int err, int aux,
							   int flags)
{
	struct tl_evmeta m = {.slot = c->slot, .gen = c->gen, .code = code, .kind = (uint8_t)kind,
			      .flags = (uint8_t)flags, .err = err, .aux = aux};
	return tl_evq_append(&l->evq, m, p, n);
}

/* conn_inplace says whether a whole frame of the current run may be
 * delivered in place: the run is a main-group or plaintext slot
 * (tl_slots_inplace), or the caller's own buffer (TL_CUR_CALLER). */
static inline int conn_inplace(const struct tl_loop *l, const struct tl_conn *c)
{
	return c->cur_q == TL_CUR_CALLER || (c->cur_q >= 0 && tl_slots_inplace(&l->slots, (uint32_t)c->cur_q));
}

/* conn_keep_slot keeps the receive slot the input lies in (c->cur_q, if
 * any) out of the kernel until Go has passed the event just appended (the
 * evq's tail): payloads delivered in place point into it. */
static inline void conn_keep_slot(struct tl_loop *l, const struct tl_conn *c)
{
	if (c->cur_q >= 0)
		l->slots.ref[c->cur_q] = l->evq.tail;
}

/* conn_emit_inplace publishes a data message whose payload stays where it
 * is (conn_inplace: a whole frame inside the current run): no arena copy.
 * A slot is recycled only after Go has passed the event
 * (tl_slots_release); a caller's buffer outlives the events by contract. */
static inline __attribute__((always_inline)) int conn_emit_inplace(struct tl_loop *l, struct tl_conn *c, int kind,
								   const uint8_t *p, size_t n)
{
	struct tl_evmeta m = {.slot = c->slot, .gen = c->gen, .kind = (uint8_t)kind};
	if (tl_evq_append_ref(&l->evq, m, p, n) < 0)
		return -1;
	conn_keep_slot(l, c);
	return 0;
}

/* fair_pressed says whether a connection at its share must keep to it
 * now: another connection is light, or the ring is under pressure
 * (l->fair_press_*, on the head as last read). */
static inline int fair_pressed(const struct tl_loop *l)
{
	const struct tl_evq *q = &l->evq;
	return l->fair_light || q->tail - q->head_cache >= l->fair_press_events ||
	       q->wpos - q->rpos >= l->fair_press_bytes;
}

/* fair_skip_set exempts c, heavy with nobody to protect (fair_pressed
 * false), from the share check (conn_held, feed_burst) until the ring
 * could come under pressure - the pressure bounds from the head as last
 * read: the head only moves on, so that is early, never late - or until
 * fair_tick recounts the light connections: the only ways fair_pressed
 * can turn true (fair_light grows only in that recount, which clears
 * every skip). Without it a flood past its share would take conn_held_slow,
 * and end its burst, per message; a quarter share of events at a time (as
 * before) still cut a 16-connection ws flood's bursts into 64-event
 * pieces, each with a frame through the general parser and this call
 * (docs/ARCHITECTURE.md, "Receive fairness"). */
static inline void fair_skip_set(const struct tl_loop *l, struct tl_conn *c)
{
	c->fair_skip = l->evq.head_cache + l->fair_press_events;
	c->fair_skip_w = l->evq.rpos + l->fair_press_bytes;
}

/* conn_held_slow is conn_held once the cached counts (which only
 * overstate) say c is at its share. Found there exactly, c becomes heavy for
 * this epoch and the next; it is held only while another connection is
 * light - one whose next message would otherwise wait behind c's flood -
 * or while the ring is under pressure (l->fair_press_*: then every
 * connection keeps to its share, floods among themselves too). Floods
 * alone go on at the cost of two compares: their messages wait behind one
 * another whatever the loop does, and holding each at its share only made
 * loop and pump take turns (docs/ARCHITECTURE.md, "Receive fairness").
 * Returns 1 (hold) or 0. */
static __attribute__((noinline)) int conn_held_slow(struct tl_loop *l, struct tl_conn *c, size_t n)
{
	struct tl_evq *q = &l->evq;
	uint32_t me = l->cfg.conn_max_events;
	uint64_t mb = l->cfg.conn_max_bytes;

	if (c->fair_heavy != l->fair_epoch) {
		/* First time at its share this epoch: exact counts decide. */
		if (!tl_evq_owner_over(q, c->slot, n, me, mb))
			return 0;
		if (c->fair_light && l->fair_light)
			l->fair_light--; /* counted light at the last recount */
		c->fair_light = 0;
		c->fair_heavy = l->fair_epoch;
		if (!fair_pressed(l)) { /* (after c left the light count) */
			fair_skip_set(l, c);
			return 0;
		}
	} else if (!fair_pressed(l)) {
		fair_skip_set(l, c);
		return 0;
	} else if (!tl_evq_owner_over(q, c->slot, n, me, mb)) {
		return 0;
	}
	/* Here fair_pressed(l) held on every branch: pressed and over its share. */
	if (l->shutting_down)
		return 0;
	if (!c->stalled)
		__atomic_store_n(&l->stats->fair_holds, l->stats->fair_holds + 1, __ATOMIC_RELAXED);
	c->fair_held = 1;
	return 1;
}

int tl_conn_fair_still_held(const struct tl_loop *l, const struct tl_conn *c)
{
	if (!c->fair_held || l->shutting_down || !l->evq.counting || !fair_pressed(l))
		return 0;
	return l->evq.own_events[c->slot] > l->cfg.conn_max_events / 2 ||
	       l->evq.own_bytes[c->slot] > l->cfg.conn_max_bytes / 2;
}

/* conn_room is how much c may publish before conn_held_slow has to
 * decide whether it waits: events and payload bytes (UINT64_MAX: no
 * bound), and skip_w, the arena write position its fair skip ends at
 * (UINT64_MAX: none). No bound while counting is off (c is alone: loop.c
 * turns it on from two connections with a socket, and nobody's message
 * can wait behind it); up to fair_skip while c is heavy with nobody to
 * protect (fair_skip_set); else what is left of its share on the cached
 * counts (they only overstate; bytes may be 0: a message without payload
 * still fits). Returns 0 when c is at or past its share of events or past
 * its share of bytes (conn_held_slow decides), else 1. conn_held asks it
 * per message, feed_burst once for a burst. */
struct conn_room {
	uint64_t events, bytes, skip_w;
};

static inline __attribute__((always_inline)) int conn_room(const struct tl_loop *l, const struct tl_conn *c,
							     struct conn_room *r)
{
	const struct tl_evq *q = &l->evq;
	uint32_t oe, me = l->cfg.conn_max_events;
	uint64_t ob, mb = l->cfg.conn_max_bytes;

	r->events = r->bytes = r->skip_w = UINT64_MAX;
	if (!q->counting)
		return 1;
	if (q->tail < c->fair_skip && q->wpos < c->fair_skip_w) {
		r->events = c->fair_skip - q->tail;
		r->skip_w = c->fair_skip_w;
		return 1;
	}
	oe = q->own_events[c->slot];
	ob = q->own_bytes[c->slot];
	if (oe >= me || ob > mb)
		return 0;
	r->events = me - oe;
	r->bytes = mb - ob;
	return 1;
}

/* conn_held says whether c must wait before it publishes its next
 * peer-driven event (a data message, a ping or a pong) with an n-byte
 * payload: c already has its share of the event ring pending, appended
 * and not yet passed by the pump (cfg.conn_max_events events, or
 * cfg.conn_max_bytes payload bytes: Config.MaxConnPendingEvents/Bytes),
 * and another connection is light or the ring under pressure
 * (conn_held_slow). The caller then stops parsing as for a full ring
 * (TL_FEED_STALL: c goes on the stalled list, its recv is paused once it
 * holds its share of slots), and the loop resumes it (run_stalled,
 * tl_conn_fair_still_held) once the pump has passed at least half of its share.
 * So a flood queues at most that much ahead of a light connection's
 * message, whatever the ring's size.
 * Never while c is the only connection with a socket (a lone flood keeps
 * the whole ring: loop and pump then overlap instead of taking turns),
 * nor while the pool shuts down (events that do not fit are dropped then,
 * see ring_full). Returns 1 (hold) or 0. Inline: two compares per message
 * under the limit (on the cached counts: they only overstate), a third
 * past it while the flood has nobody to protect. */
static inline __attribute__((always_inline)) int conn_held(struct tl_loop *l, struct tl_conn *c, size_t n)
{
	struct conn_room r;

	if (__builtin_expect(conn_room(l, c, &r) && n <= r.bytes, 1))
		return 0;
	return conn_held_slow(l, c, n);
}

/* publish_open publishes EventOpen; aux carries the handle's successful
 * re-opens (0 on the first open). */
static int publish_open(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_conn_pub *p = &l->pub[c->slot];
	size_t n = strnlen(p->proto, sizeof(p->proto));
	int reopens = c->opens > 1 ? (int)(c->opens - 1) : 0;
	if (conn_emit(l, c, TL_EV_OPEN, (const uint8_t *)p->proto, n, 0, 0, reopens, 0) < 0) {
		c->open_pending = 1;
		return TL_FEED_STALL;
	}
	c->open_pending = 0;
	return TL_FEED_OK;
}

/* keep_head moves the refused response (head and the body bytes that came
 * with it, at most TL_FAIL_HEAD_MAX) to c->fail_head for Go. */
_Static_assert(TL_FAIL_HEAD_MAX >= TL_HTTP_MAX_HEAD, "a refused head reaches Go whole");

static void keep_head(struct tl_conn *c)
{
	size_t n = c->hs_len < TL_FAIL_HEAD_MAX ? c->hs_len : TL_FAIL_HEAD_MAX;
	char *h = realloc(c->hs, n ? n : 1);

	if (!h)
		return; /* c->hs stays and is freed at teardown; Go gets no head */
	free(c->fail_head);
	c->fail_head = h;
	c->fail_head_len = n;
	c->hs = NULL;
	c->hs_len = 0;
}

/* refusal_body_in says whether a refused response's body has come as far
 * as HandshakeError keeps it (TL_REFUSAL_BODY_MAX bytes): all of a short
 * Content-Length body, a chunked body's last chunk, or none is due (1xx,
 * 204, 304). Without either header the body ends at EOF. */
static int refusal_body_in(const struct tl_conn *c)
{
	size_t have = c->hs_len - c->refuse_head_len;
	const char *b = c->hs + c->refuse_head_len;

	if (c->refuse_status < 200 || c->refuse_status == 204 || c->refuse_status == 304)
		return 1;
	if (have >= TL_REFUSAL_BODY_MAX || c->hs_len == TL_HTTP_MAX_HEAD)
		return 1;
	if (c->refuse_chunked)
		return tl_http_chunked_end(b, have) != 0;
	if (c->refuse_length >= 0)
		return have >= (size_t)c->refuse_length;
	return 0;
}

void tl_conn_refusal_end(struct tl_loop *l, struct tl_conn *c)
{
	char msg[80];

	snprintf(msg, sizeof(msg), "upgrade refused with HTTP status %d", c->refuse_status);
	c->refusing = 0;
	keep_head(c);
	tl_conn_fail(l, c, TL_E_HTTP, TL_HTTP_ERR_STATUS, c->refuse_status, msg);
}

/* refusal_wait reports the refusal once its body is in (TL_FEED_DEAD),
 * else lets it wait for more (TL_FEED_OK). */
static int refusal_wait(struct tl_loop *l, struct tl_conn *c)
{
	if (!refusal_body_in(c))
		return TL_FEED_OK;
	tl_conn_refusal_end(l, c);
	return TL_FEED_DEAD;
}

/* upgrade_feed gathers the response head; on success it reports how many
 * bytes of p belonged to the head so the rest is parsed as frames. A
 * refusal (a status other than 101) whose body has not come with the head
 * waits for it (refusal_wait) up to TL_REFUSAL_BODY_WAIT_NS, so
 * HandshakeError carries the server's reason when it writes the body in a
 * segment of its own. */
static int upgrade_feed(struct tl_loop *l, struct tl_conn *c, const uint8_t *p, size_t n, size_t *used)
{
	size_t room = TL_HTTP_MAX_HEAD - c->hs_len, take = n < room ? n : room;
	tl_http_response rs;
	struct tl_dial *d = c->dial;
	int rc;

	memcpy(c->hs + c->hs_len, p, take);
	c->hs_len += take;
	if (c->refusing) { /* the body's next bytes (as many as hs holds) */
		*used = n;
		return refusal_wait(l, c);
	}
	rc = tl_http_parse_response(c->hs, c->hs_len, c->key, d->protocols, d->protocols_len, &rs);
	if (rc == TL_HTTP_NEED_MORE) {
		if (c->hs_len == TL_HTTP_MAX_HEAD)
			rc = TL_HTTP_ERR_TOO_LARGE;
		else {
			*used = take;
			return TL_FEED_OK;
		}
	}
	if (rc == TL_HTTP_ERR_STATUS) {
		c->retry_after = rs.retry_after;
		c->refuse_status = (uint16_t)rs.status;
		c->refuse_head_len = rs.head_len;
		c->refuse_length = rs.content_length;
		c->refuse_chunked = (uint8_t)rs.chunked;
		c->refusing = 1;
		*used = n;
		if (refusal_wait(l, c) == TL_FEED_DEAD)
			return TL_FEED_DEAD;
		if (!c->deadline_ns || c->deadline_ns > tl_timer_now_ns() + TL_REFUSAL_BODY_WAIT_NS)
			tl_timer_set_deadline(l, c, TL_REFUSAL_BODY_WAIT_NS);
		return TL_FEED_OK;
	}
	if (rc != TL_HTTP_OK) {
		*used = n;
		c->retry_after = rs.retry_after;
		keep_head(c);
		tl_conn_fail(l, c, TL_E_HTTP, rc, 0, tl_http_strerror(rc));
		return TL_FEED_DEAD;
	}
	{
		struct tl_conn_pub *pub = &l->pub[c->slot];
		size_t pl = rs.protocol_len < sizeof(pub->proto) - 1 ? rs.protocol_len : sizeof(pub->proto) - 1;
		if (pl)
			memcpy(pub->proto, rs.protocol, pl);
		pub->proto[pl] = 0;
	}
	if (tl_pub_claim_open(l, c) < 0) {
		/* Its Dial gave up while nobody ran the (inline) loop: the
		 * caller never had the Conn, so it must never open. */
		*used = n;
		tl_conn_fail(l, c, TL_E_ABORTED, 0, 0, "dial abandoned: its context ended");
		return TL_FEED_DEAD;
	}
	*used = take - (c->hs_len - rs.head_len);
	free(c->hs);
	c->hs = NULL;
	tl_timer_clear_deadline(l, c); /* it belonged to the handshake */
	tl_pub_set_state(l, c, TL_ST_OPEN);
	c->todo |= TL_DO_REGROUP; /* leave the handshake group (tl_rx_step) */
	/* Subscribe goes out first: user commands for this connection are
	 * only run by the loop after this returns. */
	if (tl_conn_send_subscribe(l, c) < 0)
		return TL_FEED_DEAD;
	return publish_open(l, c);
}

/* ---- frames ---- */

static int grow_msg(struct tl_conn *c, size_t need)
{
	size_t cap = c->msg_cap ? c->msg_cap : 4096;
	uint8_t *m;
	if (need <= c->msg_cap)
		return 0;
	while (cap < need)
		cap *= 2;
	m = realloc(c->msg, cap);
	if (!m)
		return -1;
	c->msg = m;
	c->msg_cap = cap;
	return 0;
}

static int fail_proto(struct tl_loop *l, struct tl_conn *c, int err, uint16_t code, const char *why)
{
	tl_conn_fail(l, c, err, 0, code, why);
	return TL_FEED_DEAD;
}

/* count_in_n mirrors k delivered messages of bytes payload bytes into the
 * connection's public counters and the pool's (stored to the shared stats
 * once per batch, by the publish: count before it). */
static inline void count_in_n(struct tl_loop *l, struct tl_conn *c, uint64_t k, uint64_t bytes)
{
	struct tl_conn_pub *pub = &l->pub[c->slot];
	c->msgs_in += k;
	c->bytes_in += bytes;
	__atomic_store_n(&pub->msgs_in, c->msgs_in, __ATOMIC_RELAXED);
	__atomic_store_n(&pub->bytes_in, c->bytes_in, __ATOMIC_RELAXED);
	l->evq.msgs += k;
	l->evq.bytes += bytes;
}

/* count_in counts one delivered message (count_in_n) and hands it a
 * pending sample's stamps. */
static inline void count_in(struct tl_loop *l, struct tl_conn *c, size_t n)
{
	count_in_n(l, c, 1, n);
	tl_sample_msg(l, c);
}

/* ring_full says what an event that did not fit means: a stall
 * (back-pressure, the rest waits for the pump) - except once the pool is
 * closing: Go pumps no more (Close drops pending events) and the close
 * handshake behind these messages must still be read, so the event is
 * dropped (-1 then means nothing: callers see 0). Cold path only. */
static int ring_full(const struct tl_loop *l)
{
	return l->shutting_down ? TL_FEED_OK : TL_FEED_STALL;
}

/* publish_data publishes a reassembled message, copied into the arena. */
static inline int publish_data(struct tl_loop *l, struct tl_conn *c, int op, const uint8_t *p, size_t n)
{
	if (conn_held(l, c, n))
		return TL_FEED_STALL; /* over its share of the ring: wait for the pump */
	if (conn_emit(l, c, op == TL_OP_TEXT ? TL_EV_TEXT : TL_EV_BINARY, p, n, 0, 0, 0, 0) < 0)
		return ring_full(l);
	count_in(l, c, n);
	return TL_FEED_OK;
}

/* publish_frame publishes a whole frame found inside the current run: in
 * place when the run is a main-ring receive slot or a TLS plaintext slot
 * (the slot is recycled only after the pump has passed the event), else
 * copied like publish_data. The few handshake-group slots must come back
 * at once, or a flood nobody pumps would keep the next 101 from arriving. */
static inline int publish_frame(struct tl_loop *l, struct tl_conn *c, int op, const uint8_t *p, size_t n)
{
	int kind = op == TL_OP_TEXT ? TL_EV_TEXT : TL_EV_BINARY;
	int r;

	if (conn_held(l, c, n))
		return TL_FEED_STALL; /* over its share of the ring: wait for the pump */
	r = conn_inplace(l, c) ? conn_emit_inplace(l, c, kind, p, n) : conn_emit(l, c, kind, p, n, 0, 0, 0, 0);
	if (r < 0)
		return ring_full(l);
	count_in(l, c, n);
	return TL_FEED_OK;
}

/* text_valid is tl_utf8_valid with the common case inline: a short
 * all-ASCII payload (JSON ticks) is checked with two word loads. */
static inline int text_valid(const uint8_t *p, size_t n)
{
	const uint64_t hi = 0x8080808080808080ull;
	if (n >= 8 && n <= 16) {
		uint64_t a, b;
		__builtin_memcpy(&a, p, 8);
		__builtin_memcpy(&b, p + n - 8, 8);
		if (((a | b) & hi) == 0)
			return 1;
	} else if (n < 8) {
		uint64_t a = 0;
		__builtin_memcpy(&a, p, n);
		if ((a & hi) == 0)
			return 1;
	}
	return tl_utf8_valid(p, n);
}

/* hold_text_bad validates the have payload bytes of a held text frame at
 * pl that earlier holds of it have not checked (c->rx_held_ok, zeroed by
 * the transport when it offers a run that does not start with the frame
 * it held). Returns 1 when they are not valid UTF-8. Cold: only frames cut
 * by the end of what is decrypted so far. */
static int hold_text_bad(struct tl_conn *c, const uint8_t *pl, size_t have)
{
	if (c->rx_held_ok == 0)
		tl_utf8_reset(&c->utf8); /* free: no fragmented message is under way */
	if (have <= c->rx_held_ok)
		return 0;
	if (tl_utf8_feed(&c->utf8, pl + c->rx_held_ok, have - c->rx_held_ok) < 0)
		return 1;
	c->rx_held_ok = have;
	return 0;
}

/* parse_hdr decodes the header at hp; the common server frame (no RSV, a
 * data opcode, unmasked, length < 126 or in the 16-bit form) is handled
 * inline: wss feeds of 126 B to 64 KiB messages (JSON books, 256 B ticks)
 * take the 16-bit form, and a call into tl_ws_parse_hdr per frame showed
 * in the loop thread's profile. Everything else (control frames, the
 * 64-bit form, errors, a header cut short) goes to tl_ws_parse_hdr,
 * which gives the same answer for these inputs (fuzz_ws_hdr, test_ws). */
static inline int parse_hdr(const uint8_t *hp, size_t avail, tl_ws_hdr *h)
{
	if (avail >= 2) {
		unsigned b0 = hp[0], b1 = hp[1], op = b0 & 0x0f;
		if ((b0 & 0x70) == 0 && b1 <= 126 && (op == TL_OP_TEXT || op == TL_OP_BINARY || op == TL_OP_CONT)) {
			int hl = 2;
			uint64_t len = b1;
			if (b1 == 126) {
				if (avail < 4)
					return tl_ws_parse_hdr(hp, avail, h);
				len = (uint64_t)hp[2] << 8 | hp[3];
				hl = 4;
			}
			h->fin = (uint8_t)(b0 >> 7);
			h->rsv = 0;
			h->opcode = (uint8_t)op;
			h->masked = 0;
			h->len = len;
			return hl;
		}
	}
	return tl_ws_parse_hdr(hp, avail, h);
}

static int handle_close_frame(struct tl_loop *l, struct tl_conn *c)
{
	const uint8_t *p = c->ctrl;
	size_t n = c->ctrl_len;
	unsigned code = 1005;

	if (n == 1)
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "close frame with a 1-byte payload");
	if (n >= 2) {
		code = ((unsigned)p[0] << 8) | p[1];
		if (!tl_ws_close_code_ok(code))
			return fail_proto(l, c, TL_E_PROTOCOL, 1002, "close frame with an invalid code");
		if (!tl_utf8_valid(p + 2, n - 2))
			return fail_proto(l, c, TL_E_UTF8, 1007, "close reason is not valid UTF-8");
		memcpy(c->reason, p + 2, n - 2);
		c->reason_len = (uint8_t)(n - 2);
	}
	c->close_code = (uint16_t)code;
	c->close_rcvd = 1;
	c->discard = 1; /* nothing after a close frame counts */
	if (!c->close_sent)
		tl_conn_send_close(l, c, (uint16_t)code, c->reason, c->reason_len);
	if (c->state != TL_ST_CLOSING)
		tl_pub_set_state(l, c, TL_ST_CLOSING);
	if (c->fd < 0) { /* memory connection */
		c->todo |= TL_DO_TEARDOWN;
		return TL_FEED_DEAD;
	}
	/* Both close frames are out: the handshake is complete. End our
	 * sending side (TLS close_notify, then FIN) so the peer, which closes
	 * TCP first (RFC 6455 7.1.1), is not left waiting for it (Python's
	 * websockets over TLS waits for our close_notify). Bound the wait for
	 * its end; a close we started keeps its earlier deadline. */
	c->todo |= TL_DO_SHUT_WR;
	if (!c->deadline_ns)
		tl_timer_set_deadline(l, c, l->cfg.close_timeout_ns);
	return TL_FEED_DEAD; /* stop parsing: input is discarded from here */
}

/* handle_ctrl acts on a complete control frame in c->ctrl. The event goes
 * first: if it cannot be published, nothing is sent and the frame is
 * retried. */
static int handle_ctrl(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_conn_pub *pub = &l->pub[c->slot];
	switch (c->h.opcode) {
	case TL_OP_PING:
		if (conn_held(l, c, c->ctrl_len) ||
		    (conn_emit(l, c, TL_EV_PING, c->ctrl, c->ctrl_len, 0, 0, 0, 0) < 0 && ring_full(l)))
			return TL_FEED_STALL;
		__atomic_store_n(&pub->pings_in, pub->pings_in + 1, __ATOMIC_RELAXED);
		if (!c->close_sent)
			send_reply(l, c, TL_OP_PONG, c->ctrl, c->ctrl_len);
		break;
	case TL_OP_PONG:
		if (conn_held(l, c, c->ctrl_len) ||
		    (conn_emit(l, c, TL_EV_PONG, c->ctrl, c->ctrl_len, 0, 0, 0, 0) < 0 && ring_full(l)))
			return TL_FEED_STALL;
		__atomic_store_n(&pub->pongs_in, pub->pongs_in + 1, __ATOMIC_RELAXED);
		break;
	case TL_OP_CLOSE:
		c->ctrl_ready = 0;
		return handle_close_frame(l, c);
	}
	c->ctrl_ready = 0;
	return TL_FEED_OK;
}

/* begin_frame checks a parsed header against the message state. */
static int begin_frame(struct tl_loop *l, struct tl_conn *c)
{
	const tl_ws_hdr *h = &c->h;
	if (h->opcode >= 0x8)
		return TL_FEED_OK; /* control frames are valid anywhere */
	if (h->opcode == TL_OP_CONT && !c->msg_op)
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "continuation frame without a message");
	if (h->opcode != TL_OP_CONT && c->msg_op)
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "new message inside a fragmented message");
	if (h->len > l->cfg.max_message || c->msg_len + h->len > l->cfg.max_message)
		return fail_proto(l, c, TL_E_TOO_BIG, 1009, "message exceeds the maximum message size");
	return TL_FEED_OK;
}

static int hdr_error(struct tl_loop *l, struct tl_conn *c, int r)
{
	switch (r) {
	case TL_WS_ERR_RSV:
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "reserved bits set");
	case TL_WS_ERR_OPCODE:
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "reserved opcode");
	case TL_WS_ERR_MASKED:
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "masked frame from the server");
	case TL_WS_ERR_CTRL_FRAG:
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "fragmented control frame");
	case TL_WS_ERR_CTRL_LEN:
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "control frame longer than 125 bytes");
	case TL_WS_ERR_LEN64:
		/* RFC 6455 5.2: the top bit "MUST be 0", so this is a malformed
		 * header (1002, as ws.Parser says), not an over-long message. */
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "frame length has the top bit set");
	}
	return fail_proto(l, c, TL_E_PROTOCOL, 1002, "bad frame header");
}

static int frame_done(struct tl_loop *l, struct tl_conn *c)
{
	if (c->h.opcode >= 0x8) {
		c->ctrl_ready = 1;
		return handle_ctrl(l, c);
	}
	if (!c->h.fin)
		return TL_FEED_OK;
	if (c->msg_op == TL_OP_TEXT && !tl_utf8_complete(&c->utf8))
		return fail_proto(l, c, TL_E_UTF8, 1007, "text message ends inside a UTF-8 sequence");
	c->msg_ready = 1;
	if (publish_data(l, c, c->msg_op, c->msg, c->msg_len) < 0)
		return TL_FEED_STALL;
	c->msg_ready = 0;
	c->msg_op = 0;
	c->msg_len = 0;
	return TL_FEED_OK;
}

/* flush_pending publishes what a stall left half done: the open event, a
 * reassembled message, a control frame (and its reply). */
static int flush_pending(struct tl_loop *l, struct tl_conn *c)
{
	if (c->open_pending && publish_open(l, c) < 0)
		return TL_FEED_STALL;
	if (c->msg_ready) {
		if (publish_data(l, c, c->msg_op, c->msg, c->msg_len) < 0)
			return TL_FEED_STALL;
		c->msg_ready = 0;
		c->msg_op = 0;
		c->msg_len = 0;
	}
	if (c->ctrl_ready)
		return handle_ctrl(l, c);
	return TL_FEED_OK;
}

int tl_conn_flush_pending(struct tl_loop *l, struct tl_conn *c)
{
	if (c->discard) /* as tl_conn_feed: nothing counts after a failure or close */
		return TL_FEED_OK;
	return flush_pending(l, c);
}

/* burst_frames appends the whole small data frames at p[off..n) to run r
 * (copy: into the arena, else in place) up to the first frame that is
 * anything else or does not fit (see feed_burst), and returns the offset
 * after the last one appended. copy is a constant at each call (inlined),
 * so each mode gets its own loop. */
static inline __attribute__((always_inline)) size_t burst_frames(struct tl_evq_run *r, const uint8_t *p, size_t n,
								  size_t off, uint64_t maxmsg, uint64_t max_bytes,
								  int copy)
{
	while (n - off >= 2) {
		unsigned b0 = p[off], b1 = p[off + 1];
		size_t hl = 2, len = b1;
		const uint8_t *pl;

		/* FIN, no RSV, text or binary; unmasked with a 7- or 16-bit
		 * length (b1 <= 126: the mask bit is clear). */
		if ((b0 != 0x81 && b0 != 0x82) || b1 > 126)
			break;
		if (b1 == 126) {
			if (n - off < 4)
				break;
			len = (size_t)p[off + 2] << 8 | p[off + 3];
			hl = 4;
		}
		if (len > n - off - hl || len > maxmsg || r->bytes + len > max_bytes)
			break;
		pl = p + off + hl;
		if (b0 == 0x81 && !text_valid(pl, len))
			break; /* tl_conn_feed fails it (1007) */
		if (tl_evq_run_add(r, b0 == 0x81 ? TL_EV_TEXT : TL_EV_BINARY, pl, len, copy) < 0)
			break;
		off += hl + len;
	}
	return off;
}

/* feed_burst publishes the whole small data frames at p[off..n) one after
 * another in one pass, the common shape of a feed (many short
 * unfragmented messages per receive): each header is decoded from two
 * (or four) bytes, and the event queue, the counters and the slot's
 * reference are updated once for the burst (tl_evq_run) instead of per
 * message. It stops at the first frame that is anything else - a control
 * frame, a fragment, a 64-bit length, RSV or mask bits, a frame not all
 * in the run, over max_message, invalid UTF-8 in a text frame - and at
 * the end of the room it computed up front (ring, arena, the connection's
 * share of the ring: conn_held), leaving that frame to the general parser
 * in tl_conn_feed, which handles (or fails) it exactly as before. The
 * caller checked that no frame or message is under way, no header is
 * split and no sample is pending. Returns the new offset. */
static inline __attribute__((always_inline)) size_t feed_burst(struct tl_loop *l, struct tl_conn *c,
								const uint8_t *p, size_t n, size_t off)
{
	struct tl_evq *q = &l->evq;
	struct tl_evq_run r;
	struct conn_room room;
	uint64_t maxmsg = l->cfg.max_message;
	int inplace = conn_inplace(l, c);

	/* conn_held's test, for the whole burst: the message that would pass
	 * the share goes through conn_held itself (a share with no byte left
	 * too: the burst is for payloads). */
	if (!conn_room(l, c, &room) || room.bytes == 0)
		return off;
	tl_evq_run_begin(q, &r, c->slot, c->gen, !inplace, room.events);
	if (r.wend > room.skip_w)
		r.wend = room.skip_w; /* copy mode: a skip ends where the arena would come under pressure */
	/* Two copies of the loop, each with its mode a constant: the in-place
	 * one (receive slots, the Decoder's buffer) carries no arena state. */
	off = inplace ? burst_frames(&r, p, n, off, maxmsg, room.bytes, 0)
		      : burst_frames(&r, p, n, off, maxmsg, room.bytes, 1);
	if (r.tail != q->tail) {
		/* Counted before tl_evq_run_end: an early publish there stores
		 * the pool's counters with the tail. */
		count_in_n(l, c, r.tail - q->tail, r.bytes);
		tl_evq_run_end(q, &r);
		if (inplace)
			conn_keep_slot(l, c);
	}
	return off;
}

/* tl_conn_feed consumes input bytes p[0..n); *used says how many. Returns
 * TL_FEED_OK (all used, or a partial frame was kept), TL_FEED_STALL (the rest
 * must be offered again when Go has released space) or TL_FEED_DEAD (the
 * connection failed or is closing: the rest does not matter). */
int tl_conn_feed(struct tl_loop *l, struct tl_conn *c, const uint8_t *p, size_t n, size_t *used)
{
	size_t off = 0;
	int r;

	*used = 0;
	if (c->discard) {
		*used = n;
		return TL_FEED_OK;
	}
	if (c->state == TL_ST_UPGRADING) {
		r = upgrade_feed(l, c, p, n, &off);
		*used = off;
		if (r != TL_FEED_OK || c->state != TL_ST_OPEN)
			return r;
	}
	r = flush_pending(l, c);
	if (r != TL_FEED_OK) {
		*used = off;
		return r;
	}
	while (off < n) {
		if (!c->in_payload) {
			const uint8_t *hp;
			size_t avail;
			int hl;

			if (c->hdr_len == 0 && !c->msg_op && !c->smp_cqe) {
				off = feed_burst(l, c, p, n, off);
				if (off == n)
					break;
			}
			if (c->hdr_len == 0) {
				hp = p + off;
				avail = n - off;
			} else {
				/* Complete a split header in c->hdr. */
				size_t take = TL_WS_MAX_HDR - c->hdr_len;
				if (take > n - off)
					take = n - off;
				memcpy(c->hdr + c->hdr_len, p + off, take);
				hp = c->hdr;
				avail = c->hdr_len + take;
			}
			hl = parse_hdr(hp, avail, &c->h);
			if (hl == TL_WS_NEED_MORE) {
				if (c->hdr_len == 0 && c->rx_hold) {
					*used = off; /* the transport offers it again, whole */
					c->rx_held_ok = 0; /* a new frame: none of it checked */
					return TL_FEED_OK;
				}
				if (c->hdr_len == 0) {
					memcpy(c->hdr, p + off, n - off);
					c->hdr_len = (uint8_t)(n - off);
				} else {
					c->hdr_len = (uint8_t)avail;
				}
				off = n;
				break;
			}
			if (hl < 0) {
				*used = n;
				return hdr_error(l, c, hl);
			}
			if (begin_frame(l, c) < 0) {
				*used = n;
				return TL_FEED_DEAD;
			}
			if (c->hdr_len == 0) {
				/* Fast path: a whole unfragmented data frame in this run
				 * goes straight from the slot to the arena. */
				if (c->h.fin && (c->h.opcode == TL_OP_TEXT || c->h.opcode == TL_OP_BINARY) &&
				    n - off - (size_t)hl >= c->h.len) {
					const uint8_t *pl = p + off + hl;
					if (c->h.opcode == TL_OP_TEXT && !text_valid(pl, c->h.len)) {
						*used = n;
						return fail_proto(l, c, TL_E_UTF8, 1007, "invalid UTF-8 in a text message");
					}
					if (publish_frame(l, c, c->h.opcode, pl, c->h.len) < 0) {
						*used = off;
						return TL_FEED_STALL;
					}
					off += (size_t)hl + c->h.len;
					continue;
				}
				if (c->h.fin && (c->h.opcode == TL_OP_TEXT || c->h.opcode == TL_OP_BINARY) &&
				    (uint64_t)hl + c->h.len <= c->rx_hold) {
					/* Held (see rx_hold; begin_frame is idempotent). A
					 * text frame's bytes so far are validated now, not
					 * when it is whole: bad UTF-8 fails fast, as in the
					 * reassembly path. A frame held further into the run
					 * than its start is not the one re-offered (a re-offer
					 * starts with the held frame): none of it is checked
					 * yet, whatever an earlier hold in this run left in
					 * rx_held_ok (fuzz_conn's one-byte comparison found a
					 * held frame's bad bytes skipped that way; likewise a
					 * header cut short above). */
					if (off != 0)
						c->rx_held_ok = 0;
					if (c->h.opcode == TL_OP_TEXT && hold_text_bad(c, p + off + hl, n - off - (size_t)hl)) {
						*used = n;
						return fail_proto(l, c, TL_E_UTF8, 1007, "invalid UTF-8 in a text message");
					}
					*used = off;
					return TL_FEED_OK;
				}
				off += (size_t)hl;
			} else {
				off += (size_t)hl - c->hdr_len;
				c->hdr_len = 0;
			}
			c->in_payload = 1;
			c->remaining = c->h.len;
			if (c->h.opcode >= 0x8) {
				c->ctrl_len = 0;
			} else if (c->h.opcode != TL_OP_CONT) {
				c->msg_op = c->h.opcode;
				c->msg_len = 0;
				tl_utf8_reset(&c->utf8);
			}
		}
		/* payload bytes */
		{
			size_t k = n - off;
			if (k > c->remaining)
				k = (size_t)c->remaining;
			if (c->h.opcode >= 0x8) {
				memcpy(c->ctrl + c->ctrl_len, p + off, k);
				c->ctrl_len = (uint8_t)(c->ctrl_len + k);
			} else if (k) {
				if (grow_msg(c, c->msg_len + k) < 0) {
					*used = n;
					tl_conn_fail(l, c, TL_E_NOMEM, ENOMEM, 1011, "out of memory reassembling a message");
					return TL_FEED_DEAD;
				}
				memcpy(c->msg + c->msg_len, p + off, k);
				if (c->msg_op == TL_OP_TEXT && tl_utf8_feed(&c->utf8, p + off, k) < 0) {
					*used = n;
					return fail_proto(l, c, TL_E_UTF8, 1007, "invalid UTF-8 in a text message");
				}
				c->msg_len += k;
			}
			off += k;
			c->remaining -= k;
			if (c->remaining == 0) {
				c->in_payload = 0;
				r = frame_done(l, c);
				if (r != TL_FEED_OK) {
					*used = r == TL_FEED_STALL ? off : n;
					return r;
				}
			}
		}
	}
	*used = off;
	return TL_FEED_OK;
}

/* ---- the end of input ---- */

void tl_conn_on_eof(struct tl_loop *l, struct tl_conn *c)
{
	if (c->fail_err) {
		c->todo |= TL_DO_TEARDOWN;
	} else if (c->close_rcvd) {
		c->todo |= TL_DO_TEARDOWN; /* clean: EventClose */
	} else if (c->refusing) {
		tl_conn_refusal_end(l, c); /* a close-delimited body ended, or the server hung up */
	} else if (c->state < TL_ST_OPEN) {
		tl_conn_fail(l, c, TL_E_LOST, c->eof_errno, 0,
			     c->eof_errno ? strerror(c->eof_errno) : "connection closed during the handshake");
	} else {
		/* (A failed send may have taken the socket's error: report it.) */
		int e = c->eof_errno ? c->eof_errno : c->send_errno;
		tl_conn_fail(l, c, TL_E_LOST, e, 1006, e ? strerror(e) : "connection closed without a close frame");
	}
}

/* ---- failure ---- */

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
	c->msg_ready = 0;
	c->ctrl_ready = 0;
	if (c->state == TL_ST_OPEN && code && code != 1006 && !c->close_sent && !c->eof && !c->send_errno && c->fd >= 0) {
		tl_conn_send_close(l, c, code, NULL, 0);
		tl_pub_set_state(l, c, TL_ST_CLOSING);
		c->todo |= TL_DO_FLUSH;
		/* Give the peer a moment to read our close; then we go. */
		tl_timer_set_deadline(l, c, l->cfg.close_timeout_ns < 1000000000ull ? l->cfg.close_timeout_ns : 1000000000ull);
		return;
	}
	c->todo |= TL_DO_TEARDOWN;
}
