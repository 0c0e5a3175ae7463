/* ws/internal.h - what the files of ws/ share among themselves and
 * nothing outside ws/ includes: the helpers more than one of them calls
 * (small ones inline) and the functions one file of the state machine
 * calls in another. The folder's interface is ws/conn.h. */
#ifndef TALARIS_WS_INTERNAL_H
#define TALARIS_WS_INTERNAL_H

#include "ws/conn.h"
#include "base/evq.h"
#include "loop/state.h"

#include <stdlib.h>

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

static inline int fail_proto(struct tl_loop *l, struct tl_conn *c, int err, uint16_t code, const char *why)
{
	tl_conn_fail(l, c, err, 0, code, why);
	return TL_FEED_DEAD;
}

/* send_reply queues one of the loop's own control frames (pong, close)
 * and counts its bytes as replies (tl_conn_replies). */
static inline int send_reply(struct tl_loop *l, struct tl_conn *c, int opcode, const uint8_t *p, size_t n)
{
	struct tl_outbuf *ob = tl_conn_wbuf(c);
	size_t before = ob->len;
	int r = tl_conn_send_frame(l, c, opcode, 1, p, n);
	if (r == 0 && ob->len > before)
		ob->replies += ob->len - before;
	return r;
}

static inline int sq_empty(const struct tl_sendq *q) { return q->head == q->len; }

/* sq_reset empties q; memory kept after a burst is given back. */
static inline void sq_reset(struct tl_sendq *q)
{
	q->head = q->len = 0;
	if (q->cap > (1u << 20)) {
		free(q->p);
		q->p = NULL;
		q->cap = 0;
	}
}

/* tl_sendq_reserve makes room for n more bytes at q's tail and returns
 * where they go, or NULL on no memory (ws/send.c). */
uint8_t *tl_sendq_reserve(struct tl_sendq *q, size_t n);

/* tl_conn_publish_open publishes EventOpen (ws/upgrade.c). */
int tl_conn_publish_open(struct tl_loop *l, struct tl_conn *c);

/* tl_conn_upgrade_feed gathers the response head (ws/upgrade.c); *used
 * is how many bytes of p belonged to it. Returns TL_FEED_*. */
int tl_conn_upgrade_feed(struct tl_loop *l, struct tl_conn *c, const uint8_t *p, size_t n, size_t *used);

/* tl_conn_close_frame acts on a complete close frame in c->ctrl
 * (ws/close.c). Returns TL_FEED_*. */
int tl_conn_close_frame(struct tl_loop *l, struct tl_conn *c);

#endif
