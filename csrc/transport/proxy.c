/* transport/proxy.c - the proxy handshake of a dial through an HTTP
 * CONNECT (RFC 9110 9.3.6) or SOCKS5 (RFC 1928, RFC 1929) proxy. Go builds
 * every request (dial_linux.go): the CONNECT request with its Host and
 * Proxy-Authorization, SOCKS5's CONNECT request (an IP for socks5://, the
 * name for socks5h://) and its username/password message; this writes
 * them in turn and reads each reply through the codecs, gathering it in
 * c->hs: a CONNECT reply head of at most TL_PROXY_MAX_HEAD bytes
 * (codec/http.c), a SOCKS5 reply of exactly its size (codec/socks.c).
 * Only the reply's bytes are consumed from the slot queue, so whatever the
 * proxy sent after it reaches the session. Calls ws/ (failure, the out
 * buffer), codec/ and base/. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "transport/proxy.h"

#include "base/slots.h"
#include "codec/http.h"
#include "codec/socks.h"
#include "loop/state.h"
#include "ws/conn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The handshake's steps (tl_conn.px); 0 is none (or done). */
enum {
	TL_PX_NONE = 0,
	TL_PX_HTTP = 1,         /* CONNECT sent: its reply head */
	TL_PX_SOCKS_METHOD = 2, /* greeting sent: the method selection */
	TL_PX_SOCKS_AUTH = 3,   /* username/password sent: its status */
	TL_PX_SOCKS_REPLY = 4,  /* CONNECT sent: its reply */
};

/* px_fail fails c with TL_E_PROXY, cause (TL_PROXY_*) and code. */
static void px_fail(struct tl_loop *l, struct tl_conn *c, int cause, int err, uint16_t code, const char *msg)
{
	c->px = TL_PX_NONE;
	tl_conn_fail(l, c, TL_E_PROXY, cause | err << 8, code, msg);
}

/* px_send appends n bytes for the proxy to c's out buffer (wire bytes:
 * TLS, if any, starts only once the tunnel stands). */
static int px_send(struct tl_loop *l, struct tl_conn *c, const void *p, size_t n, uint8_t next)
{
	uint8_t *dst = tl_outbuf_reserve(&c->out[c->cur], n);

	if (!dst) {
		tl_conn_fail(l, c, TL_E_NOMEM, ENOMEM, 0, "out of memory writing the proxy request");
		return -1;
	}
	memcpy(dst, p, n);
	c->px = next;
	c->hs_len = 0;
	c->todo |= TL_DO_FLUSH;
	return 0;
}

int tl_proxy_start(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_dial *d = c->dial;
	static const uint8_t greet[] = {5, 1, 0}, greet_auth[] = {5, 2, 0, 2};

	if (!d || d->proxy == TL_PROXY_KIND_NONE)
		return 0;
	free(c->hs);
	c->hs = malloc(TL_PROXY_MAX_HEAD);
	if (!c->hs) {
		tl_conn_fail(l, c, TL_E_NOMEM, ENOMEM, 0, "out of memory for the proxy reply");
		return -1;
	}
	if (d->proxy == TL_PROXY_KIND_HTTP)
		return px_send(l, c, d->proxy_req, d->proxy_req_len, TL_PX_HTTP) < 0 ? -1 : 1;
	if (d->proxy_auth_len)
		return px_send(l, c, greet_auth, sizeof(greet_auth), TL_PX_SOCKS_METHOD) < 0 ? -1 : 1;
	return px_send(l, c, greet, sizeof(greet), TL_PX_SOCKS_METHOD) < 0 ? -1 : 1;
}

/* px_http reads the CONNECT reply's head from hs: a 2xx ends the
 * handshake. Returns the head's length (> 0), 0 for more, -1 after
 * failing c. */
static long px_http(struct tl_loop *l, struct tl_conn *c)
{
	tl_http_response rs;
	char msg[80];
	int rc = tl_http_parse_response(c->hs, c->hs_len, NULL, NULL, 0, &rs);

	if (rc == TL_HTTP_NEED_MORE) {
		if (c->hs_len < TL_PROXY_MAX_HEAD)
			return 0;
		rc = TL_HTTP_ERR_TOO_LARGE;
	}
	if (rc == TL_HTTP_ERR_STATUS && rs.status >= 200 && rs.status <= 299)
		return (long)rs.head_len;
	if (rc == TL_HTTP_ERR_STATUS) {
		snprintf(msg, sizeof(msg), "CONNECT refused with HTTP status %d", rs.status);
		px_fail(l, c, TL_PROXY_STATUS, 0, (uint16_t)rs.status, msg);
	} else if (rc == TL_HTTP_ERR_TOO_LARGE) {
		px_fail(l, c, TL_PROXY_TOO_LARGE, 0, 0, "the CONNECT reply head is over 8 KiB");
	} else {
		px_fail(l, c, TL_PROXY_MALFORMED, 0, 0, "the CONNECT reply is not HTTP/1.x");
	}
	return -1;
}

/* socks_reply_text names a SOCKS5 reply code (RFC 1928 section 6). */
static const char *socks_reply_text(uint8_t rep)
{
	static const char *const t[] = {
		"succeeded", "general SOCKS server failure", "connection not allowed by ruleset",
		"network unreachable", "host unreachable", "connection refused", "TTL expired",
		"command not supported", "address type not supported",
	};
	return rep < sizeof(t) / sizeof(t[0]) ? t[rep] : "unassigned reply code";
}

/* px_socks reads the SOCKS5 reply of c's step from hs and sends the next
 * request. Returns the reply's length (> 0), 0 for more, -1 after failing
 * c. c->px is TL_PX_NONE once the tunnel stands. */
static long px_socks(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_dial *d = c->dial;
	static const int step[] = {[TL_PX_SOCKS_METHOD] = TL_SOCKS_METHOD, [TL_PX_SOCKS_AUTH] = TL_SOCKS_AUTH,
				   [TL_PX_SOCKS_REPLY] = TL_SOCKS_REPLY};
	uint8_t code;
	char msg[88];
	int n = tl_socks_parse(step[c->px], (const uint8_t *)c->hs, c->hs_len, &code);

	if (n == TL_SOCKS_MORE)
		return 0;
	if (n == TL_SOCKS_BAD) {
		px_fail(l, c, TL_PROXY_MALFORMED, 0, 0, "the proxy's reply is not SOCKS5");
		return -1;
	}
	switch (c->px) {
	case TL_PX_SOCKS_METHOD:
		if (code == 0xFF) {
			px_fail(l, c, TL_PROXY_AUTH, 0, code, "SOCKS5: no acceptable authentication method");
			return -1;
		}
		if (code == 2 && d->proxy_auth_len) {
			if (px_send(l, c, d->proxy_auth, d->proxy_auth_len, TL_PX_SOCKS_AUTH) < 0)
				return -1;
			return n;
		}
		if (code != 0) {
			px_fail(l, c, TL_PROXY_MALFORMED, 0, code, "SOCKS5: the proxy chose a method not offered");
			return -1;
		}
		break;
	case TL_PX_SOCKS_AUTH:
		if (code != 0) {
			snprintf(msg, sizeof(msg), "SOCKS5: username/password refused (status %u)", code);
			px_fail(l, c, TL_PROXY_AUTH, 0, code, msg);
			return -1;
		}
		break;
	default: /* TL_PX_SOCKS_REPLY */
		if (code != 0) {
			snprintf(msg, sizeof(msg), "SOCKS5 CONNECT failed: %s (reply %u)", socks_reply_text(code), code);
			px_fail(l, c, TL_PROXY_REPLY, 0, code, msg);
			return -1;
		}
		c->px = TL_PX_NONE;
		return n;
	}
	/* The method (no authentication) or the credentials are accepted. */
	return px_send(l, c, d->proxy_req, d->proxy_req_len, TL_PX_SOCKS_REPLY) < 0 ? -1 : n;
}

int tl_proxy_drive(struct tl_loop *l, struct tl_conn *c)
{
	while (c->px && !tl_rxq_empty(&c->rxq) && !tl_conn_ending(c)) {
		const uint8_t *p;
		size_t n, take, had = c->hs_len;
		long got;

		tl_rxq_peek(&l->slots, &c->rxq, &p, &n);
		take = TL_PROXY_MAX_HEAD - had;
		if (take > n)
			take = n;
		memcpy(c->hs + had, p, take);
		c->hs_len += take;
		got = c->px == TL_PX_HTTP ? px_http(l, c) : px_socks(l, c);
		if (got < 0)
			break;
		if (got == 0) { /* all of it is the reply so far */
			tl_rxq_consume(&l->slots, &c->rxq, take, l->evq.head_cache);
			continue;
		}
		/* The reply ends inside this piece: consume up to its end only. */
		tl_rxq_consume(&l->slots, &c->rxq, (size_t)got - had, l->evq.head_cache);
		c->hs_len = 0;
		if (c->px == TL_PX_HTTP)
			c->px = TL_PX_NONE;
	}
	if (c->fail_err || tl_conn_ending(c))
		return TL_FEED_DEAD;
	if (c->px == TL_PX_NONE) {
		free(c->hs); /* the upgrade gathers its response in a new one */
		c->hs = NULL;
		return TL_FEED_OK;
	}
	if (c->eof && tl_rxq_empty(&c->rxq)) {
		px_fail(l, c, TL_PROXY_LOST, c->eof_errno, 0,
			c->eof_errno ? "the proxy's connection failed before its reply ended"
				     : "the proxy closed the connection before its reply ended");
		return TL_FEED_DEAD;
	}
	return TL_FEED_OK;
}

void tl_proxy_timeout(struct tl_loop *l, struct tl_conn *c)
{
	px_fail(l, c, TL_PROXY_TIMEOUT, 0, 0, "the proxy did not complete its handshake in time");
}
