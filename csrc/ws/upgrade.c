/* ws/upgrade.c - the upgrade exchange: the request (and the dial's
 * subscribe frames after it), the response head, and a refusal, which
 * waits a moment for its body so HandshakeError carries the server's
 * reason. */
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

/* tl_conn_publish_open publishes EventOpen; aux carries the handle's successful
 * re-opens (0 on the first open). */
int tl_conn_publish_open(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_conn_pub *p = &l->pub[c->slot];
	size_t n = strnlen(p->proto, sizeof(p->proto));
	int reopens = c->opens > 1 ? (int)(c->opens - 1) : 0;
	if (conn_emit(l, c, TL_EV_OPEN, (const uint8_t *)p->proto, n, 0, 0, reopens, 0) < 0) {
		tl_conn_pend_set(c, TL_PEND_OPEN);
		return TL_FEED_STALL;
	}
	tl_conn_pend_set(c, TL_PEND_NONE);
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

/* tl_conn_upgrade_feed gathers the response head; on success it reports how many
 * bytes of p belonged to the head so the rest is parsed as frames. A
 * refusal (a status other than 101) whose body has not come with the head
 * waits for it (refusal_wait) up to TL_REFUSAL_BODY_WAIT_NS, so
 * HandshakeError carries the server's reason when it writes the body in a
 * segment of its own. */
int tl_conn_upgrade_feed(struct tl_loop *l, struct tl_conn *c, const uint8_t *p, size_t n, size_t *used)
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
	return tl_conn_publish_open(l, c);
}
