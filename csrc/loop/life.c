/* loop/life.c - a connection's lifecycle in the loop: dial (socket, connect,
 * the next address), a memory connection's open, driving a transport and
 * acting on what the layers below request (tl_life_after), stalls,
 * failure, teardown (cancel every operation, then close), the final
 * event, and the reconnect policy's next attempt. Calls rx.c, tx.c, the
 * transports (transport/), ws/ and the layers below; never the loop's
 * core (setup, wait, dispatch, run...), cmdq.c or tick.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/life.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport/plain.h"
#include "transport/proxy.h"
#include "base/pub.h"
#include "loop/rx.h"
#include "base/sample.h"
#include "base/timer.h"
#include "transport/tls.h"
#include "transport/tls_verify.h"
#include "loop/tx.h"
#include "loop/uring.h"

#define STAT_ADD(l, f, n) __atomic_store_n(&(l)->stats->f, (l)->stats->f + (n), __ATOMIC_RELAXED)

void tl_life_flush(struct tl_loop *l, struct tl_conn *c)
{
	tl_tx_flush(l, c);
	if (c->todo) /* a refill or seal failed c: its teardown */
		tl_life_after(l, c);
}

void tl_life_stall(struct tl_loop *l, struct tl_conn *c)
{
	if (!c->stalled)
		STAT_ADD(l, stalls, 1);
	c->stalled = 1;
	if (!c->on_stall_list) {
		c->on_stall_list = 1;
		c->stall_next = l->stalled;
		l->stalled = c;
	}
}

void tl_life_after(struct tl_loop *l, struct tl_conn *c)
{
	uint8_t todo = c->todo;

	c->todo = 0;
	if (todo & TL_DO_TEARDOWN) {
		tl_life_teardown(l, c);
		return;
	}
	if (todo & TL_DO_REGROUP)
		tl_rx_step(l, c, RX_REGROUP, 0);
	if (todo & TL_DO_SHUT_WR)
		tl_tx_shut_wr(l, c); /* (flushes) */
	if (todo & TL_DO_FLUSH)
		tl_tx_flush(l, c);
	if (c->todo) /* the flush failed c: its close or teardown */
		tl_life_after(l, c);
}

/* tl_life_session_start starts c's session on its connected socket (or
 * through its proxy's tunnel): the TLS handshake for wss, else the upgrade
 * request. Returns 0, or -1 after failing c; the caller runs tl_life_after. */
int tl_life_session_start(struct tl_loop *l, struct tl_conn *c)
{
	if (c->is_tls) {
		tl_pub_set_state(l, c, TL_ST_TLS);
		return tl_tls_start(l, c);
	}
	tl_pub_set_state(l, c, TL_ST_UPGRADING);
	return tl_conn_start_upgrade(l, c);
}

/* proxy_step runs c's proxy handshake over its queued input; once the
 * tunnel stands it starts the session through it. Returns 1 when the
 * transport is to read the rest of the queue (what the proxy sent after
 * its reply: the server's first bytes), else 0 (the handshake goes on,
 * or c failed). */
static int proxy_step(struct tl_loop *l, struct tl_conn *c)
{
	if (tl_proxy_drive(l, c) != TL_FEED_OK || c->px)
		return 0;
	if (tl_life_session_start(l, c) < 0)
		return 0;
	return !tl_conn_ending(c);
}

/* tl_life_drive runs c's transport (first its proxy handshake, if one is
 * under way) over its queued input and acts on the outcome: the
 * transport's requests, a stall, the end of input (once all of it is
 * parsed), then a flush of the replies. */
void tl_life_drive(struct tl_loop *l, struct tl_conn *c)
{
	int r = TL_FEED_OK;

	if (c->dying)
		return;
	if (!c->px || proxy_step(l, c))
		r = c->is_tls ? tl_tls_drive(l, c) : tl_plain_drive(l, c);
	tl_life_after(l, c);
	if (c->dying)
		return;
	if (r == TL_FEED_STALL) {
		tl_life_stall(l, c);
		tl_life_flush(l, c);
		return;
	}
	tl_sample_end(c);
	/* After the peer's close frame what is still queued is discarded
	 * input (a wss stream the TLS layer ended: tl_conn_watch_notify):
	 * the end need not wait for it; teardown drops it. */
	if (c->eof && (tl_rxq_empty(&c->rxq) || tl_conn_close_rcvd(c))) {
		tl_conn_on_eof(l, c);
		tl_life_after(l, c);
	}
	if (!c->dying)
		tl_life_flush(l, c);
}

void tl_life_free_dial(struct tl_dial *d)
{
	if (!d)
		return;
	free(d->host);
	free(d->path);
	free(d->headers);
	free(d->protocols);
	free(d->server_name);
	free(d->ca_file);
	free(d->ca_pem);
	tl_tlsv_dial_free(d->tlsx);
	free(d->alt);
	free(d->subscribe);
	free(d->proxy_req);
	free(d->proxy_auth);
	free(d);
}

/* finish publishes the final event once every operation of c completed and
 * its socket is closed; then the slot belongs to Go again. */
void tl_life_finish(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_conn_pub *p = &l->pub[c->slot];
	int kind = c->fail_err ? TL_EV_ERROR : TL_EV_CLOSE;
	int rc;

	/* Public state first: once the final event is out, the slot is Go's
	 * and the loop must not touch it again. */
	if (c->dying != TL_DYING_FINAL) {
		__atomic_store_n(&p->err, c->fail_err, __ATOMIC_RELAXED);
		__atomic_store_n(&p->aux, c->fail_aux, __ATOMIC_RELAXED);
		__atomic_store_n(&p->code, kind == TL_EV_CLOSE ? c->close_code : c->fail_code, __ATOMIC_RELAXED);
		tl_pub_set_state(l, c, TL_ST_CLOSED);
	}
	if (kind == TL_EV_CLOSE)
		rc = tl_life_emit(l, c, kind, c->reason, c->reason_len, c->close_code, 0, 0, TL_EVF_FINAL);
	else
		rc = tl_life_emit(l, c, kind, (const uint8_t *)p->detail, strnlen(p->detail, sizeof(p->detail)),
			     c->fail_code, c->fail_err, c->fail_aux, TL_EVF_FINAL);
	if (rc && !l->shutting_down) {
		tl_life_dying_set(c, TL_DYING_FINAL);
		tl_life_stall(l, c);
		return;
	}
	/* (When the pool is closing and the ring is full, the final event is
	 * dropped: Go stopped pumping, and Close promises to drop pending
	 * events rather than wait for room.) */
	c->state = TL_ST_IDLE;
	tl_life_dying_set(c, TL_DYING_NO);
	l->live--;
}

void tl_life_dying_set(struct tl_conn *c, uint8_t to)
{
#ifdef TL_DEBUG
	/* Teardown starts once, and only a started one can wait to finish. */
	if ((to == TL_DYING_TEARDOWN && c->dying != TL_DYING_NO) || (to == TL_DYING_FINAL && c->dying == TL_DYING_NO)) {
		fprintf(stderr, "talaris: teardown state %u -> %u\n", c->dying, to);
		abort();
	}
#endif
	c->dying = to;
}

void tl_life_rc_set(struct tl_loop *l, struct tl_conn *c, uint8_t to)
{
	if (c->rc == TL_RC_BACKOFF)
		l->rc_waits--;
	if (to == TL_RC_BACKOFF)
		l->rc_waits++;
	c->rc = to;
}

void tl_life_stop_reconnect(struct tl_conn *c)
{
	c->rc_stop = 1;
}

/* rc_rand returns the next number of the loop's xorshift64* generator
 * (jitter only: nothing secret depends on it). */
static uint64_t rc_rand(struct tl_loop *l)
{
	uint64_t x = l->rc_seed;
	if (!x)
		x = tl_timer_now_ns() ^ (uint64_t)(uintptr_t)l ^ 0x9e3779b97f4a7c15ull;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	l->rc_seed = x;
	return x * 0x2545f4914f6cdd1dull;
}

/* rc_backoff is the wait before c's next attempt: full jitter over
 * [min, min(max, min * 2^attempts)], where attempts counts the attempts
 * since the last open (0 right after a drop, so the first wait is min).
 * A 429 or 503 whose Retry-After asks for longer gets that. */
static uint64_t rc_backoff(struct tl_loop *l, struct tl_conn *c)
{
	const struct tl_dial *d = c->dial;
	uint64_t hi = d->rc_min_ns, delay;

	for (uint32_t i = 0; i < c->rc_attempts && hi < d->rc_max_ns; i++)
		hi *= 2;
	if (hi > d->rc_max_ns)
		hi = d->rc_max_ns;
	delay = d->rc_min_ns + (hi > d->rc_min_ns ? rc_rand(l) % (hi - d->rc_min_ns + 1) : 0);
	if (c->fail_err == TL_E_HTTP && (c->fail_code == 429 || c->fail_code == 503) && c->retry_after >= 0) {
		uint64_t ra = (uint64_t)c->retry_after * 1000000000ull;
		if (delay < ra)
			delay = ra;
	}
	return delay;
}

/* reconnect_wanted says whether c's end (its socket closed, every
 * operation completed) is followed by another attempt rather than the
 * final event: a policy, no Close/Abort, no Pool.Close, a cause that a
 * retry can cure, and attempts left (a connection that opened always gets
 * a new series). */
static int reconnect_wanted(struct tl_loop *l, struct tl_conn *c)
{
	const struct tl_dial *d = c->dial;

	if (!d || !d->rc_enabled || c->rc_stop || l->shutting_down)
		return 0;
	switch (c->fail_err) {
	case TL_E_ABORTED:
	case TL_E_SHUTDOWN:
	case TL_E_NOMEM:
	case TL_E_INTERNAL:
		return 0;
	case TL_E_TLS:
		if (c->fail_aux == TL_TLS_CONFIG)
			return 0;
		break;
	}
	return c->was_open || d->rc_max_attempts == 0 || c->rc_attempts < d->rc_max_attempts;
}

/* reconnect_begin publishes EventReconnecting (not final) for c's end and
 * arms the backoff deadline; on_deadline re-dials the same slot and
 * generation. When the ring is full the connection waits on the stall
 * list (TL_RC_ANNOUNCE) and tl_life_end_or_reconnect runs again. */
static void reconnect_begin(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_conn_pub *p = &l->pub[c->slot];
	uint8_t buf[16 + sizeof(p->detail) + sizeof(c->reason)];
	uint32_t next, zero = 0;
	const uint8_t *why;
	size_t wn;
	uint16_t code = c->fail_err ? c->fail_code : c->close_code;
	uint64_t delay;

	if (c->rc != TL_RC_ANNOUNCE) {
		if (c->was_open)
			c->rc_attempts = 0;
		c->rc_delay_ns = rc_backoff(l, c);
	}
	next = c->rc_attempts + 1;
	if (c->fail_err) {
		why = (const uint8_t *)p->detail;
		wn = strnlen(p->detail, sizeof(p->detail));
	} else {
		why = c->reason;
		wn = c->reason_len;
	}
	memcpy(buf, &c->rc_delay_ns, 8);
	memcpy(buf + 8, &next, 4);
	memcpy(buf + 12, &zero, 4);
	memcpy(buf + 16, why, wn);
	if (tl_life_emit(l, c, TL_EV_RECONNECTING, buf, 16 + wn, code, c->fail_err, c->fail_aux, 0) < 0) {
		tl_life_rc_set(l, c, TL_RC_ANNOUNCE);
		tl_life_stall(l, c);
		return;
	}
	tl_life_rc_set(l, c, TL_RC_NONE); /* (the reset below clears the rest of the attempt) */
	__atomic_store_n(&p->gap, 1, __ATOMIC_RELAXED);
	p->proto[0] = 0;
	delay = c->rc_delay_ns;
	/* Output of the dropped socket is never sent: retire its units so
	 * Go's admission (accepted - tx_done) starts the next attempt empty. */
	tl_conn_tx_drop_all(l, c);
	tl_life_dying_set(c, TL_DYING_NO); /* the next attempt is alive */
	tl_conn_reset_keep(c);
	tl_pub_set_state(l, c, TL_ST_CONNECTING);
	tl_life_rc_set(l, c, TL_RC_BACKOFF);
	c->rc_delay_ns = delay;
	tl_timer_set_deadline(l, c, delay);
}

/* tl_life_end_or_reconnect ends c (final event) or, under a reconnect policy,
 * starts the wait for its next attempt. c's socket is closed and no
 * operation of it is in flight. */
void tl_life_end_or_reconnect(struct tl_loop *l, struct tl_conn *c)
{
	if (reconnect_wanted(l, c)) {
		reconnect_begin(l, c);
		return;
	}
	tl_life_rc_set(l, c, TL_RC_NONE);
	tl_life_free_dial(c->dial);
	c->dial = NULL;
	tl_life_finish(l, c);
}

/* tl_life_maybe_finish closes the socket once no operation is in flight. */
void tl_life_maybe_finish(struct tl_loop *l, struct tl_conn *c)
{
	if (!c->dying || c->rc == TL_RC_ANNOUNCE || tl_rx_in_kernel(c) || c->send_inflight || c->cancel_inflight ||
	    c->connect_inflight)
		return;
	if (c->fd >= 0 && !tl_tx_seize(l, c))
		return; /* a Go sender writes the socket: close it once handed back */
	if (c->fd >= 0) {
		/* What is still queued never reaches this socket: dropped and
		 * counted (a close that timed out, a drop; a reconnect's next
		 * attempt starts empty). */
		tl_conn_tx_drop_all(l, c);
		close(c->fd);
		c->fd = -1;
	}
	if (c->dying == TL_DYING_FINAL || c->state != TL_ST_IDLE) {
		tl_rxq_drain(&l->slots, &c->rxq, l->evq.head_cache);
		tl_timer_clear_deadline(l, c);
		tl_timer_hb_clear(l, c);
		if (c->rc == TL_RC_BACKOFF)
			tl_life_rc_set(l, c, TL_RC_NONE);
		tl_tls_free(c);
		free(c->hs);
		c->hs = NULL;
		tl_conn_trim(c);
		if (c->dying == TL_DYING_FINAL)
			tl_life_finish(l, c);
		else
			tl_life_end_or_reconnect(l, c);
	}
}

/* tl_life_teardown cancels c's operations; the final event follows when
 * they have all completed. */
void tl_life_teardown(struct tl_loop *l, struct tl_conn *c)
{
	if (c->dying)
		return;
	tl_life_dying_set(c, TL_DYING_TEARDOWN);
	c->discard = 1;
	/* A handle that will reconnect refuses sends from now on
	 * (ErrReconnecting), before its queued output is dropped and the
	 * drop wakes a waiting SendContext: nothing accepted for this
	 * connection is sent on the next one. */
	if (reconnect_wanted(l, c))
		__atomic_store_n(&l->pub[c->slot].gap, 1, __ATOMIC_RELEASE);
	tl_rx_step(l, c, RX_TEARDOWN, 0);
	if (tl_rx_in_kernel(c) || c->connect_inflight) {
		uint64_t target = tl_rx_in_kernel(c) ? tl_rx_ud(c) : tl_ud(TL_OPK_CONNECT, c->gen, c->slot);
		if (tl_rx_cancel(l, c, target) < 0 && c->fd >= 0) {
			/* No SQE for the cancel: shutting the socket down ends the
			 * armed recv (res 0) and a pending connect just the same. */
			shutdown(c->fd, SHUT_RDWR);
		}
	}
	if (c->send_inflight && c->fd >= 0)
		shutdown(c->fd, SHUT_RDWR); /* a send blocked on a full socket must end too */
	tl_life_maybe_finish(l, c);
}

/* tl_life_fail records why c failed and starts its end: a close frame with
 * code when the connection is open (code 0: none), then teardown after the
 * peer answers or the close timeout. */
void tl_life_fail(struct tl_loop *l, struct tl_conn *c, int err, int aux, uint16_t code, const char *detail)
{
	tl_conn_fail(l, c, err, aux, code, detail);
	tl_life_after(l, c);
}

/* tl_life_abort ends c at once for Conn.Abort: output not yet handed to
 * the kernel is dropped, the socket is shut down both ways (the peer sees
 * the end now, and a send stuck on a full socket ends), and the final
 * event is EventError with TL_E_ABORTED whatever was under way. */
void tl_life_abort(struct tl_loop *l, struct tl_conn *c)
{
	tl_life_stop_reconnect(c); /* an abort is final, also during a backoff wait */
	if (c->dying)
		return;
	c->fail_err = TL_E_ABORTED;
	c->fail_aux = 0;
	c->fail_code = 1006;
	tl_pub_detail(l, c, "aborted by Conn.Abort");
	tl_conn_tx_drop_all(l, c); /* queued output is dropped, its units retired */
	tl_conn_pend_set(c, TL_PEND_NONE); /* nothing left unpublished goes out */
	if (c->fd >= 0 && !c->connect_inflight)
		shutdown(c->fd, SHUT_RDWR);
	tl_life_teardown(l, c);
}

/* tl_life_start_connect opens a socket for addr (bound to the dial's local
 * address, if any) and submits its asynchronous connect. Returns 0, or -1
 * after failing c. */
int tl_life_start_connect(struct tl_loop *l, struct tl_conn *c, const struct sockaddr_storage *addr)
{
	struct tl_dial *d = c->dial;
	struct io_uring_sqe *sqe;
	socklen_t alen = addr->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
	int one = 1, fd;

	fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		tl_life_fail(l, c, TL_E_DIAL, errno, 0, strerror(errno));
		return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c->fd = fd;
	if (d->local_len && bind(fd, (const struct sockaddr *)&d->local, d->local_len) < 0) {
		char msg[80];
		int e = errno;
		snprintf(msg, sizeof(msg), "binding the local address: %s", strerror(e));
		tl_life_fail(l, c, TL_E_DIAL, e, 0, msg);
		return -1;
	}
	sqe = tl_uring_sqe(l);
	if (!sqe) {
		tl_life_fail(l, c, TL_E_INTERNAL, 0, 0, "submission queue full");
		return -1;
	}
	io_uring_prep_connect(sqe, fd, (const struct sockaddr *)addr, alen);
	io_uring_sqe_set_data64(sqe, tl_ud(TL_OPK_CONNECT, c->gen, c->slot));
	c->connect_inflight = 1;
	return 0;
}

/* tl_life_dial starts connection slot/gen with the parameters
 * tl_dial_prepare stored: socket, then an asynchronous connect. */
void tl_life_dial(struct tl_loop *l, uint32_t slot, uint32_t gen)
{
	struct tl_conn *c = &l->conns[slot];
	struct tl_dial *d = l->dials[slot];

	l->dials[slot] = NULL;
	tl_conn_reset(c);
	c->slot = slot;
	c->gen = gen; /* Go reset pub[slot] before sending the command */
	c->state = TL_ST_CONNECTING;
	__atomic_store_n(&l->pub[slot].state, TL_ST_CONNECTING, __ATOMIC_RELEASE);
	l->live++;
	c->dial = d;
	if (!d) {
		tl_life_fail(l, c, TL_E_INTERNAL, 0, 0, "dial without parameters");
		return;
	}
	tl_life_dial_start(l, c);
}

/* tl_life_dial_start makes one attempt of c with c->dial: socket, then an
 * asynchronous connect (the first dial, and each reconnect). */
void tl_life_dial_start(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_dial *d = c->dial;

	c->rc_attempts++;
	c->is_tls = (uint8_t)d->tls;
	tl_timer_set_deadline(l, c, d->handshake_timeout_ns);
	d->next_alt = 0; /* every attempt starts from the first address */
	tl_life_start_connect(l, c, &d->addr);
}

/* tl_life_open_memory opens a socketless connection: Go feeds it server bytes with
 * TL_CMD_INJECT (benchmarks, replay of captured streams). */
void tl_life_open_memory(struct tl_loop *l, uint32_t slot, uint32_t gen)
{
	struct tl_conn *c = &l->conns[slot];
	tl_conn_reset(c);
	c->slot = slot;
	c->gen = gen;
	l->live++;
	tl_pub_set_state(l, c, TL_ST_OPEN);
	if (tl_life_emit(l, c, TL_EV_OPEN, NULL, 0, 0, 0, 0, 0) < 0) {
		tl_conn_pend_set(c, TL_PEND_OPEN);
		tl_life_stall(l, c);
	}
}

#undef STAT_ADD
