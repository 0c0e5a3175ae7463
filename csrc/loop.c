/* loop.c - the io_uring loop: thread, rings shared with Go, completions,
 * commands, timers, teardown. The WebSocket state machine is in conn.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop.h"
#include "tls_verify.h"

#include <errno.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define TL_CQE_BATCH 256
#define TL_SWEEP_NS 20000000ull

uint64_t tl_loop_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void futex_wake(uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

#define STAT_ADD(l, f, n) __atomic_store_n(&(l)->stats->f, (l)->stats->f + (n), __ATOMIC_RELAXED)
#define PUB_ADD(p, f, n) __atomic_store_n(&(p)->f, (p)->f + (n), __ATOMIC_RELAXED)

/* ---- submission ---- */

struct io_uring_sqe *tl_loop_sqe(struct tl_loop *l)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);
	if (!sqe) {
		/* SQ full: push what we have to make room. */
		io_uring_submit(&l->ring);
		sqe = io_uring_get_sqe(&l->ring);
	}
	return sqe;
}

static void arm_efd(struct tl_loop *l)
{
	struct io_uring_sqe *sqe;
	if (l->efd_armed)
		return;
	sqe = tl_loop_sqe(l);
	if (!sqe)
		return;
	io_uring_prep_read(sqe, l->efd, &l->efd_val, sizeof(l->efd_val), 0);
	io_uring_sqe_set_data64(sqe, tl_ud(TL_OPK_EFD, 0, 0));
	l->efd_armed = 1;
}

/* submit_send puts one send of ob->p[c->sent_off..ob->len) in the SQ.
 * Returns 0, or -1 when no SQE was free (the bytes stay; the sweep or the
 * next flush retries). */
static int submit_send(struct tl_loop *l, struct tl_conn *c, struct tl_outbuf *ob)
{
	struct io_uring_sqe *sqe = tl_loop_sqe(l);
	if (!sqe)
		return -1;
	io_uring_prep_send(sqe, c->fd, ob->p + c->sent_off, ob->len - c->sent_off, MSG_NOSIGNAL);
	io_uring_sqe_set_data64(sqe, tl_ud(TL_OPK_SEND, c->gen, c->slot));
	c->send_inflight = 1;
	return 0;
}

/* tl_loop_flush submits output when no send is in flight: first the rest
 * of a buffer a short send left (when no SQE was free to continue it),
 * else the collecting buffer, topped up from the send queue. One send per
 * connection at a time keeps bytes in order. */
void tl_loop_flush(struct tl_loop *l, struct tl_conn *c)
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
		submit_send(l, c, ob);
		return;
	}
	if (tl_conn_tx_refill(l, c) < 0 || c->dying)
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
	if (submit_send(l, c, ob) == 0)
		c->cur ^= 1; /* new bytes go to the other buffer meanwhile */
}

/* tx_notify tells Go that c's send accounting or state changed: bump the
 * futex word, and wake only when a SendContext announced that it sleeps
 * (it sets tx_waiters, then rechecks; we bump, then check: seq_cst on
 * both sides, Dekker style). */
static void tx_notify(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_conn_pub *p = &l->pub[c->slot];
	__atomic_fetch_add(&p->tx_seq, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&p->tx_waiters, __ATOMIC_SEQ_CST))
		syscall(SYS_futex, &p->tx_seq, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

void tl_loop_tx_retire(struct tl_loop *l, struct tl_conn *c, uint64_t units)
{
	if (!units)
		return;
	c->tx_done += units;
	__atomic_store_n(&l->pub[c->slot].tx_done, c->tx_done, __ATOMIC_RELEASE);
	tx_notify(l, c);
}

/* ---- the receive side: one state per connection, changed only here ---- */

static uint64_t recv_ud(const struct tl_conn *c)
{
	return tl_ud(c->rx_hs ? TL_OPK_RECV_HS : TL_OPK_RECV, c->gen, c->slot);
}

/* rx_in_kernel: a multishot recv is in the kernel (its final CQE, one
 * without IORING_CQE_F_MORE, is still to come). */
static int rx_in_kernel(const struct tl_conn *c)
{
	return c->rx == TL_RX_ARMED || c->rx == TL_RX_PAUSING || c->rx == TL_RX_REARMING;
}

/* rx_set changes c->rx and keeps l->rx_want, the number of connections in
 * TL_RX_WANT, exact: the loop polls for re-arms only while it is not 0. */
static void rx_set(struct tl_loop *l, struct tl_conn *c, uint8_t st)
{
	l->rx_want -= c->rx == TL_RX_WANT;
	l->rx_want += st == TL_RX_WANT;
	c->rx = st;
}

/* rx_cancel asks the kernel to end c's recv (its final CQE follows).
 * Returns 0, or -1 when no SQE was free. */
static int rx_cancel(struct tl_loop *l, struct tl_conn *c)
{
	struct io_uring_sqe *sqe = tl_loop_sqe(l);
	if (!sqe)
		return -1;
	io_uring_prep_cancel64(sqe, recv_ud(c), 0);
	io_uring_sqe_set_data64(sqe, tl_ud(TL_OPK_CANCEL, c->gen, c->slot));
	c->cancel_inflight++;
	return 0;
}

/* rx_share is a connection's fair share of the main group: half the ring
 * split over the live connections (at least 2 slots, at most a quarter of
 * the ring), so the stalled ones together leave slots for the rest, e.g.
 * for a 101 to arrive. */
static uint32_t rx_share(const struct tl_loop *l)
{
	uint32_t count = l->slots.main.count;
	uint32_t live = l->live - l->rc_waits; /* handles waiting to reconnect hold no slots */
	uint32_t share = live ? count / (2 * live) : count / 4;
	if (share > count / 4)
		share = count / 4;
	return share < 2 ? 2 : share;
}

/* rx_step is every transition of the receive side (c->rx):
 *
 *   OFF/WANT  --ARM-->      ARMED (or WANT when no SQE is free)
 *   ARMED     --END-->      WANT (-ENOBUFS, ended with data, -ECANCELED)
 *                           or OFF (EOF, error: c->eof set; or dying)
 *   ARMED     --PAUSE-->    PAUSING: stalled holding its share of slots; the
 *                           rest waits in its socket and TCP slows that sender
 *   PAUSING   --END-->      PAUSED (OFF when dying)
 *   PAUSING   --RESUME-->   REARMING (the cancel is already in flight)
 *   PAUSED    --RESUME-->   ARMED
 *   ARMED     --REGROUP-->  REARMING: open now, leave the handshake group so
 *                           few flood bytes hold handshake slots
 *   REARMING  --PAUSE-->    PAUSING
 *   REARMING  --END-->      WANT (OFF when dying)
 *   WANT      --TICK-->     ARMED once not stalled and the group has a slot
 *   any       --TEARDOWN--> in the kernel: cancelled, END then gives OFF;
 *                           else OFF
 *
 * res is the recv's result for RX_END. */
static void rx_step(struct tl_loop *l, struct tl_conn *c, int ev, int res)
{
	struct io_uring_sqe *sqe;

	switch (ev) {
	case RX_ARM:
		if (rx_in_kernel(c) || c->dying || c->fd < 0)
			return;
		sqe = tl_loop_sqe(l);
		if (!sqe) {
			rx_set(l, c, TL_RX_WANT); /* run_rearms tries again */
			return;
		}
		c->rx_hs = c->state < TL_ST_OPEN;
		io_uring_prep_recv_multishot(sqe, c->fd, NULL, 0, 0);
		sqe->flags |= IOSQE_BUFFER_SELECT;
		sqe->buf_group = c->rx_hs ? TL_HS_BGID : TL_BGID;
		io_uring_sqe_set_data64(sqe, recv_ud(c));
		rx_set(l, c, TL_RX_ARMED);
		return;
	case RX_END:
		if (res == 0) {
			c->eof = 1;
		} else if (res < 0 && res != -ENOBUFS && res != -ECANCELED) {
			c->eof = 1;
			c->eof_errno = -res;
		} else if (res == -ENOBUFS) {
			STAT_ADD(l, nobufs, 1);
		}
		if (c->eof || c->dying)
			rx_set(l, c, TL_RX_OFF);
		else if (c->rx == TL_RX_PAUSING)
			rx_set(l, c, TL_RX_PAUSED);
		else /* -ENOBUFS, -ECANCELED (regroup, or a resumed pause), or data with the end */
			rx_set(l, c, TL_RX_WANT);
		return;
	case RX_PAUSE:
		if ((c->rx != TL_RX_ARMED && c->rx != TL_RX_REARMING) || c->rxq.count < rx_share(l))
			return;
		if (c->rx == TL_RX_REARMING || rx_cancel(l, c) == 0)
			rx_set(l, c, TL_RX_PAUSING); /* (a regroup's cancel is already on the way) */
		return;
	case RX_RESUME:
		if (c->stalled || c->dying || c->eof)
			return;
		if (c->rx == TL_RX_PAUSING) {
			rx_set(l, c, TL_RX_REARMING);
		} else if (c->rx == TL_RX_PAUSED) {
			rx_set(l, c, TL_RX_OFF);
			rx_step(l, c, RX_ARM, 0);
			STAT_ADD(l, rearms, 1);
		}
		return;
	case RX_REGROUP:
		if (c->rx == TL_RX_ARMED && c->rx_hs && c->state >= TL_ST_OPEN && !c->dying && rx_cancel(l, c) == 0)
			rx_set(l, c, TL_RX_REARMING);
		return;
	case RX_TICK: {
		/* Any free slot of the group it will use will do: waiting for more
		 * lets always-armed busy connections take every slot as it comes
		 * back, starving this one. */
		struct tl_bufring *g = c->state < TL_ST_OPEN ? &l->slots.hs : &l->slots.main;
		if (c->dying || c->eof || c->fd < 0 || c->state == TL_ST_IDLE) {
			rx_set(l, c, TL_RX_OFF);
		} else if (!c->stalled && g->in_use < g->count) {
			rx_set(l, c, TL_RX_OFF);
			rx_step(l, c, RX_ARM, 0);
			STAT_ADD(l, rearms, 1);
		}
		return;
	}
	case RX_TEARDOWN:
		if (!rx_in_kernel(c))
			rx_set(l, c, TL_RX_OFF);
		return; /* the caller cancels a recv in the kernel; END gives OFF */
	}
}

/* tl_loop_regroup moves an open connection's recv from the handshake group
 * to the main ring (the cancelled recv ends in TL_RX_WANT and is re-armed
 * on the main group). Called as soon as the upgrade completes. */
void tl_loop_regroup(struct tl_loop *l, struct tl_conn *c)
{
	rx_step(l, c, RX_REGROUP, 0);
}

/* ---- stalls ---- */

void tl_loop_stall(struct tl_loop *l, struct tl_conn *c)
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

/* ---- connection lifecycle ---- */

static void hb_start(struct tl_loop *l, struct tl_conn *c);

void tl_loop_set_state(struct tl_loop *l, struct tl_conn *c, int st)
{
	struct tl_conn_pub *p = &l->pub[c->slot];
	if (st == TL_ST_OPEN && c->state != TL_ST_OPEN)
		hb_start(l, c);
	c->state = (uint8_t)st;
	/* Dial tells "opened, then ended before Dial looked" (the events are
	 * in the ring: a success) from "failed during the handshake". */
	if (st == TL_ST_OPEN) {
		__atomic_store_n(&p->opened, 1, __ATOMIC_RELAXED);
		c->was_open = 1;
		if (++c->opens > 1) { /* a reconnect policy's re-open */
			__atomic_store_n(&p->reconnects, c->opens - 1, __ATOMIC_RELAXED);
			STAT_ADD(l, reconnects, 1);
		}
		__atomic_store_n(&p->gap, 0, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&p->state, (uint32_t)st, __ATOMIC_RELEASE);
	/* Dial may be waiting on this word. State changes are rare. */
	futex_wake(&p->state);
	tx_notify(l, c); /* and a SendContext on tx_seq: it returns once the connection ends */
}

void tl_loop_detail(struct tl_loop *l, struct tl_conn *c, const char *msg)
{
	struct tl_conn_pub *p = &l->pub[c->slot];
	snprintf(p->detail, sizeof(p->detail), "%s", msg ? msg : "");
}

void tl_loop_timer_at(struct tl_loop *l, uint64_t at)
{
	if (l->next_timer_ns == 0 || at < l->next_timer_ns)
		l->next_timer_ns = at;
}

void tl_loop_set_deadline(struct tl_loop *l, struct tl_conn *c, uint64_t ns_from_now)
{
	if (!c->deadline_ns)
		l->timed++;
	c->deadline_ns = tl_loop_now_ns() + ns_from_now;
	tl_loop_timer_at(l, c->deadline_ns);
}

static void clear_deadline(struct tl_loop *l, struct tl_conn *c)
{
	if (c->deadline_ns) {
		c->deadline_ns = 0;
		l->timed--;
	}
}

/* ---- heartbeat: read timeout and pings ---- */

/* timers_armed: some connection has a timer of any kind. */
static inline int timers_armed(const struct tl_loop *l)
{
	return l->timed || l->hb_timed;
}

static void hb_clear(struct tl_loop *l, struct tl_conn *c)
{
	if (c->hb_ns) {
		c->hb_ns = 0;
		l->hb_timed--;
	}
}

/* hb_next is when c's heartbeat must next be looked at: its read timeout
 * counted from the last receive, or its next ping (an interval after the
 * later of the last receive and the last ping). */
static uint64_t hb_next(const struct tl_conn *c)
{
	const struct tl_dial *d = c->dial;
	uint64_t t = 0;
	if (d->read_timeout_ns)
		t = c->last_rx_ns + d->read_timeout_ns;
	if (d->ping_interval_ns) {
		uint64_t base = c->last_ping_ns > c->last_rx_ns ? c->last_ping_ns : c->last_rx_ns;
		uint64_t p = base + d->ping_interval_ns;
		if (!t || p < t)
			t = p;
	}
	return t;
}

static void hb_arm(struct tl_loop *l, struct tl_conn *c, uint64_t at)
{
	if (!c->hb_ns)
		l->hb_timed++;
	c->hb_ns = at;
	tl_loop_timer_at(l, at);
}

/* hb_start arms c's heartbeat when it opens (dial options with a ping
 * interval or read timeout): the silence counts from now. */
static void hb_start(struct tl_loop *l, struct tl_conn *c)
{
	uint64_t now;
	if (!c->dial || (!c->dial->ping_interval_ns && !c->dial->read_timeout_ns) || c->fd < 0)
		return;
	now = tl_loop_now_ns();
	/* The cached clock may be stale while no heartbeat ran: refresh it so
	 * this iteration's receives are not stamped in the past. */
	l->now_ns = now;
	c->last_rx_ns = now;
	c->last_ping_ns = 0;
	hb_arm(l, c, hb_next(c));
}

/* hb_due runs c's heartbeat at now: fail it when nothing arrived for the
 * read timeout, send a ping when nothing arrived (and no ping left) for
 * the ping interval, then re-arm for the next check. */
static void hb_due(struct tl_loop *l, struct tl_conn *c, uint64_t now)
{
	const struct tl_dial *d = c->dial;

	if (c->state != TL_ST_OPEN || c->dying || !d) {
		hb_clear(l, c); /* closing or ended: the close timeout rules */
		return;
	}
	if (c->stalled || c->rx == TL_RX_PAUSING || c->rx == TL_RX_PAUSED || c->rx == TL_RX_WANT)
		c->last_rx_ns = now; /* we stopped reading (back-pressure), not the peer */
	if (d->read_timeout_ns && now - c->last_rx_ns >= d->read_timeout_ns) {
		hb_clear(l, c);
		tl_loop_fail(l, c, TL_E_READ_TIMEOUT, 0, 1006, "no data, ping, pong or close from the peer");
		return;
	}
	if (d->ping_interval_ns && !c->close_sent && !c->send_errno) {
		uint64_t base = c->last_ping_ns > c->last_rx_ns ? c->last_ping_ns : c->last_rx_ns;
		/* (A peer that does not read gets no more pings piled up.) */
		if (now - base >= d->ping_interval_ns && c->out[0].len + c->out[1].len < l->cfg.max_send_queue) {
			if (tl_conn_send_frame(l, c, TL_OP_PING, 1, NULL, 0) < 0)
				return; /* c failed */
			c->last_ping_ns = now;
			tl_loop_flush(l, c);
		}
	}
	hb_arm(l, c, hb_next(c));
}

void tl_loop_shut_wr(struct tl_loop *l, struct tl_conn *c)
{
	if (c->shut_wr || c->fd < 0 || c->dying)
		return;
	c->shut_wr = 1;
	if (c->is_tls)
		tl_tls_close_notify(c);
	tl_loop_flush(l, c);
}

static void free_dial(struct tl_dial *d)
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
	free(d);
}

/* finish publishes the final event once every operation of c completed and
 * its socket is closed; then the slot belongs to Go again. */
static void finish(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_conn_pub *p = &l->pub[c->slot];
	int kind = c->fail_err ? TL_EV_ERROR : TL_EV_CLOSE;
	int rc;

	/* Public state first: once the final event is out, the slot is Go's
	 * and the loop must not touch it again. */
	if (!c->final_pending) {
		__atomic_store_n(&p->err, c->fail_err, __ATOMIC_RELAXED);
		__atomic_store_n(&p->aux, c->fail_aux, __ATOMIC_RELAXED);
		__atomic_store_n(&p->code, kind == TL_EV_CLOSE ? c->close_code : c->fail_code, __ATOMIC_RELAXED);
		tl_loop_set_state(l, c, TL_ST_CLOSED);
	}
	if (kind == TL_EV_CLOSE)
		rc = tl_loop_emit(l, c, kind, c->reason, c->reason_len, c->close_code, 0, 0, TL_EVF_FINAL);
	else
		rc = tl_loop_emit(l, c, kind, (const uint8_t *)p->detail, strnlen(p->detail, sizeof(p->detail)),
			     c->fail_code, c->fail_err, c->fail_aux, TL_EVF_FINAL);
	if (rc && !l->shutting_down) {
		c->final_pending = 1;
		tl_loop_stall(l, c);
		return;
	}
	/* (When the pool is closing and the ring is full, the final event is
	 * dropped: Go stopped pumping, and Close promises to drop pending
	 * events rather than wait for room.) */
	c->final_pending = 0;
	c->state = TL_ST_IDLE;
	c->dying = 0;
	l->live--;
}

/* ---- reconnect ---- */

void tl_loop_stop_reconnect(struct tl_conn *c)
{
	c->rc_stop = 1;
}

/* rc_rand returns the next number of the loop's xorshift64* generator
 * (jitter only: nothing secret depends on it). */
static uint64_t rc_rand(struct tl_loop *l)
{
	uint64_t x = l->rc_seed;
	if (!x)
		x = tl_loop_now_ns() ^ (uint64_t)(uintptr_t)l ^ 0x9e3779b97f4a7c15ull;
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
 * list (rc_pending) and end_or_reconnect runs again. */
static void reconnect_begin(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_conn_pub *p = &l->pub[c->slot];
	uint8_t buf[16 + sizeof(p->detail) + sizeof(c->reason)];
	uint32_t next, zero = 0;
	const uint8_t *why;
	size_t wn;
	uint16_t code = c->fail_err ? c->fail_code : c->close_code;
	uint64_t delay;

	if (!c->rc_pending) {
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
	if (tl_loop_emit(l, c, TL_EV_RECONNECTING, buf, 16 + wn, code, c->fail_err, c->fail_aux, 0) < 0) {
		c->rc_pending = 1;
		tl_loop_stall(l, c);
		return;
	}
	c->rc_pending = 0;
	__atomic_store_n(&p->gap, 1, __ATOMIC_RELAXED);
	p->proto[0] = 0;
	delay = c->rc_delay_ns;
	/* Output of the dropped socket is never sent: retire its units so
	 * Go's admission (accepted - tx_done) starts the next attempt empty. */
	tl_conn_tx_drop_all(l, c);
	tl_conn_reset_keep(c);
	tl_loop_set_state(l, c, TL_ST_CONNECTING);
	c->rc_wait = 1;
	c->rc_delay_ns = delay;
	l->rc_waits++;
	tl_loop_set_deadline(l, c, delay);
}

/* end_or_reconnect ends c (final event) or, under a reconnect policy,
 * starts the wait for its next attempt. c's socket is closed and no
 * operation of it is in flight. */
static void end_or_reconnect(struct tl_loop *l, struct tl_conn *c)
{
	if (reconnect_wanted(l, c)) {
		reconnect_begin(l, c);
		return;
	}
	c->rc_pending = 0;
	free_dial(c->dial);
	c->dial = NULL;
	finish(l, c);
}

/* maybe_finish closes the socket once no operation is in flight. */
static void maybe_finish(struct tl_loop *l, struct tl_conn *c)
{
	if (!c->dying || c->rc_pending || rx_in_kernel(c) || c->send_inflight || c->cancel_inflight ||
	    c->connect_inflight)
		return;
	if (c->fd >= 0) {
		close(c->fd);
		c->fd = -1;
	}
	if (c->final_pending || c->state != TL_ST_IDLE) {
		tl_rxq_drain(&l->slots, &c->rxq, l->evq.head_cache);
		clear_deadline(l, c);
		hb_clear(l, c);
		if (c->rc_wait) {
			c->rc_wait = 0;
			l->rc_waits--;
		}
		tl_tls_free(c);
		free(c->hs);
		c->hs = NULL;
		if (c->final_pending)
			finish(l, c);
		else
			end_or_reconnect(l, c);
	}
}

/* tl_loop_teardown cancels c's operations; the final event follows when
 * they have all completed. */
void tl_loop_teardown(struct tl_loop *l, struct tl_conn *c)
{
	if (c->dying)
		return;
	c->dying = 1;
	c->discard = 1;
	rx_step(l, c, RX_TEARDOWN, 0);
	if (rx_in_kernel(c) || c->connect_inflight) {
		struct io_uring_sqe *sqe = tl_loop_sqe(l);
		if (sqe) {
			uint64_t target = rx_in_kernel(c) ? recv_ud(c) : tl_ud(TL_OPK_CONNECT, c->gen, c->slot);
			io_uring_prep_cancel64(sqe, target, 0);
			io_uring_sqe_set_data64(sqe, tl_ud(TL_OPK_CANCEL, c->gen, c->slot));
			c->cancel_inflight++;
		} else if (c->fd >= 0) {
			/* No SQE for the cancel: shutting the socket down ends the
			 * armed recv (res 0) and a pending connect just the same. */
			shutdown(c->fd, SHUT_RDWR);
		}
	}
	if (c->send_inflight && c->fd >= 0)
		shutdown(c->fd, SHUT_RDWR); /* a send blocked on a full socket must end too */
	maybe_finish(l, c);
}

/* tl_loop_fail records why c failed and starts its end: a close frame with
 * code when the connection is open (code 0: none), then teardown after the
 * peer answers or the close timeout. */
void tl_loop_fail(struct tl_loop *l, struct tl_conn *c, int err, int aux, uint16_t code, const char *detail)
{
	if (!c->fail_err) {
		c->fail_err = err;
		c->fail_aux = aux;
		c->fail_code = code;
		if (detail)
			tl_loop_detail(l, c, detail);
	}
	c->discard = 1;
	c->msg_ready = 0;
	c->ctrl_ready = 0;
	if (c->state == TL_ST_OPEN && code && code != 1006 && !c->close_sent && !c->eof && !c->send_errno && c->fd >= 0) {
		tl_conn_send_close(l, c, code, NULL, 0);
		tl_loop_set_state(l, c, TL_ST_CLOSING);
		tl_loop_flush(l, c);
		/* Give the peer a moment to read our close; then we go. */
		tl_loop_set_deadline(l, c, l->cfg.close_timeout_ns < 1000000000ull ? l->cfg.close_timeout_ns : 1000000000ull);
		return;
	}
	tl_loop_teardown(l, c);
}

/* tl_loop_abort ends c at once for Conn.Abort: output not yet handed to
 * the kernel is dropped, the socket is shut down both ways (the peer sees
 * the end now, and a send stuck on a full socket ends), and the final
 * event is EventError with TL_E_ABORTED whatever was under way. */
void tl_loop_abort(struct tl_loop *l, struct tl_conn *c)
{
	tl_loop_stop_reconnect(c); /* an abort is final, also during a backoff wait */
	if (c->dying)
		return;
	c->fail_err = TL_E_ABORTED;
	c->fail_aux = 0;
	c->fail_code = 1006;
	tl_loop_detail(l, c, "aborted by Conn.Abort");
	tl_conn_tx_drop_all(l, c); /* queued output is dropped, its units retired */
	c->msg_ready = 0;
	c->ctrl_ready = 0;
	c->open_pending = 0;
	if (c->fd >= 0 && !c->connect_inflight)
		shutdown(c->fd, SHUT_RDWR);
	tl_loop_teardown(l, c);
}

/* ---- commands ---- */

static void dial_start(struct tl_loop *l, struct tl_conn *c);

/* start_connect opens a socket for addr (bound to the dial's local
 * address, if any) and submits its asynchronous connect. Returns 0, or -1
 * after failing c. */
static int start_connect(struct tl_loop *l, struct tl_conn *c, const struct sockaddr_storage *addr)
{
	struct tl_dial *d = c->dial;
	struct io_uring_sqe *sqe;
	socklen_t alen = addr->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
	int one = 1, fd;

	fd = socket(addr->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		tl_loop_fail(l, c, TL_E_DIAL, errno, 0, strerror(errno));
		return -1;
	}
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c->fd = fd;
	if (d->local_len && bind(fd, (const struct sockaddr *)&d->local, d->local_len) < 0) {
		char msg[80];
		int e = errno;
		snprintf(msg, sizeof(msg), "binding the local address: %s", strerror(e));
		tl_loop_fail(l, c, TL_E_DIAL, e, 0, msg);
		return -1;
	}
	sqe = tl_loop_sqe(l);
	if (!sqe) {
		tl_loop_fail(l, c, TL_E_INTERNAL, 0, 0, "submission queue full");
		return -1;
	}
	io_uring_prep_connect(sqe, fd, (const struct sockaddr *)addr, alen);
	io_uring_sqe_set_data64(sqe, tl_ud(TL_OPK_CONNECT, c->gen, c->slot));
	c->connect_inflight = 1;
	return 0;
}

/* tl_loop_dial starts connection slot/gen with the parameters
 * tl_dial_prepare stored: socket, then an asynchronous connect. */
void tl_loop_dial(struct tl_loop *l, uint32_t slot, uint32_t gen)
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
		tl_loop_fail(l, c, TL_E_INTERNAL, 0, 0, "dial without parameters");
		return;
	}
	dial_start(l, c);
}

/* dial_start makes one attempt of c with c->dial: socket, then an
 * asynchronous connect (the first dial, and each reconnect). */
static void dial_start(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_dial *d = c->dial;

	c->rc_attempts++;
	c->is_tls = (uint8_t)d->tls;
	tl_loop_set_deadline(l, c, d->handshake_timeout_ns);
	d->next_alt = 0; /* every attempt starts from the first address */
	start_connect(l, c, &d->addr);
}

/* tl_loop_open_memory opens a socketless connection: Go feeds it server bytes with
 * TL_CMD_INJECT (benchmarks, replay of captured streams). */
void tl_loop_open_memory(struct tl_loop *l, uint32_t slot, uint32_t gen)
{
	struct tl_conn *c = &l->conns[slot];
	tl_conn_reset(c);
	c->slot = slot;
	c->gen = gen;
	l->live++;
	tl_loop_set_state(l, c, TL_ST_OPEN);
	if (tl_loop_emit(l, c, TL_EV_OPEN, NULL, 0, 0, 0, 0, 0) < 0) {
		c->open_pending = 1;
		tl_loop_stall(l, c);
	}
}

/* ---- completions ---- */

static void on_recv(struct tl_loop *l, struct tl_conn *c, struct io_uring_cqe *cqe, int hs)
{
	int more = !!(cqe->flags & IORING_CQE_F_MORE);

	if (cqe->flags & IORING_CQE_F_BUFFER) {
		uint32_t q = tl_slots_taken(&l->slots, hs, cqe->flags >> IORING_CQE_BUFFER_SHIFT);
		if (cqe->res <= 0 || c->discard) {
			tl_slots_recycle(&l->slots, q);
		} else {
			tl_loop_sample_rx(l, c, !c->is_tls && !c->stalled && tl_rxq_empty(&c->rxq));
			tl_rxq_push(&l->slots, &c->rxq, q, (uint32_t)cqe->res);
			PUB_ADD(&l->pub[c->slot], wire_in, (uint64_t)cqe->res);
			STAT_ADD(l, wire_bytes, (uint64_t)cqe->res);
			c->last_rx_ns = l->now_ns; /* heartbeat: one store per completion */
		}
	}
	if (!more)
		rx_step(l, c, RX_END, cqe->res);
	if (c->dying) {
		maybe_finish(l, c);
		return;
	}
	if (!c->stalled)
		tl_conn_drive(l, c);
	else if (c->eof)
		tl_loop_stall(l, c);
	if (c->stalled && !c->dying)
		rx_step(l, c, RX_PAUSE, 0);
	rx_step(l, c, RX_REGROUP, 0);
}

static void on_send(struct tl_loop *l, struct tl_conn *c, int res)
{
	struct tl_outbuf *ob = &c->out[c->cur ^ 1];

	c->send_inflight = 0;
	if (res < 0) {
		tl_loop_tx_retire(l, c, ob->units);
		ob->units = 0;
		ob->len = 0;
		ob->replies = 0;
		c->sent_off = 0;
		if (!c->dying && c->state >= TL_ST_OPEN && !c->fail_err && !c->close_rcvd && !c->send_errno) {
			/* The peer reset while we wrote (a pong racing its RST). What
			 * it sent before is still in our socket or slot queue,
			 * acknowledged: keep reading it (the recv ends with the same
			 * error or EOF, and on_eof fails the connection once the queue
			 * is parsed) rather than drop frames the server did send.
			 * Writes are dropped from here on; the close timeout bounds
			 * the wait. */
			c->send_errno = -res;
			tl_conn_tx_drop_all(l, c);
			if (!c->deadline_ns)
				tl_loop_set_deadline(l, c, l->cfg.close_timeout_ns);
			return;
		}
		if (!c->dying) {
			c->eof = 1;
			c->eof_errno = -res;
			tl_loop_fail(l, c, TL_E_LOST, -res, 1006, strerror(-res));
		}
		maybe_finish(l, c);
		return;
	}
	PUB_ADD(&l->pub[c->slot], wire_out, (uint64_t)res);
	c->sent_off += (size_t)res;
	if (c->sent_off < ob->len && !c->dying) {
		/* Short send: the rest goes before anything newer (tl_loop_flush
		 * resumes it if no SQE is free now). */
		submit_send(l, c, ob);
		return;
	}
	tl_loop_tx_retire(l, c, ob->units);
	ob->units = 0;
	ob->len = 0;
	ob->replies = 0;
	c->sent_off = 0;
	if (ob->cap > (1u << 20)) { /* give back memory after a burst */
		free(ob->p);
		ob->p = NULL;
		ob->cap = 0;
	}
	if (c->dying) {
		maybe_finish(l, c);
		return;
	}
	tl_loop_flush(l, c);
	if (c->stalled) /* input may have waited for send space */
		l->stall_kick = 1;
}

static void on_connect(struct tl_loop *l, struct tl_conn *c, int res)
{
	c->connect_inflight = 0;
	if (c->dying) {
		maybe_finish(l, c);
		return;
	}
	if (res < 0) {
		struct tl_dial *d = c->dial;
		if (d && d->next_alt < d->nalt) {
			/* The name had more addresses: try the next one (the
			 * handshake deadline bounds them all). Nothing else is in
			 * flight on this socket. */
			close(c->fd);
			c->fd = -1;
			start_connect(l, c, &d->alt[d->next_alt++]);
			return;
		}
		tl_loop_fail(l, c, TL_E_DIAL, -res, 0, strerror(-res));
		return;
	}
	rx_step(l, c, RX_ARM, 0);
	if (c->is_tls) {
		tl_loop_set_state(l, c, TL_ST_TLS);
		if (tl_tls_start(l, c) < 0)
			return;
	} else {
		tl_loop_set_state(l, c, TL_ST_UPGRADING);
		if (tl_conn_start_upgrade(l, c) < 0)
			return;
	}
	tl_loop_flush(l, c);
}

static void handle_cqe(struct tl_loop *l, struct io_uring_cqe *cqe)
{
	uint64_t ud = io_uring_cqe_get_data64(cqe);
	unsigned op = tl_ud_op(ud);
	uint32_t slot = tl_ud_slot(ud), gen = tl_ud_gen(ud);
	struct tl_conn *c;

	if (op == TL_OPK_EFD) {
		l->efd_armed = 0;
		STAT_ADD(l, loop_wakes, 1);
		return;
	}
	if (op == 0 || slot >= l->cfg.max_conns)
		return;
	c = &l->conns[slot];
	if (c->gen != gen || (c->state == TL_ST_IDLE && !c->final_pending)) {
		/* Stale: only a buffer may need to go back. */
		if (cqe->flags & IORING_CQE_F_BUFFER) {
			tl_slots_recycle(&l->slots, tl_slots_taken(&l->slots, op == TL_OPK_RECV_HS,
								   cqe->flags >> IORING_CQE_BUFFER_SHIFT));
		}
		return;
	}
	switch (op) {
	case TL_OPK_RECV:
	case TL_OPK_RECV_HS:
		on_recv(l, c, cqe, op == TL_OPK_RECV_HS);
		break;
	case TL_OPK_SEND:
		on_send(l, c, cqe->res);
		break;
	case TL_OPK_CONNECT:
		on_connect(l, c, cqe->res);
		break;
	case TL_OPK_CANCEL:
		c->cancel_inflight--;
		maybe_finish(l, c);
		break;
	}
}

/* ---- timers, stalls, re-arms ---- */

static void on_deadline(struct tl_loop *l, struct tl_conn *c)
{
	clear_deadline(l, c);
	if (c->dying)
		return;
	if (c->rc_wait) { /* the backoff is over: next attempt */
		c->rc_wait = 0;
		l->rc_waits--;
		dial_start(l, c);
		return;
	}
	if (c->state < TL_ST_OPEN) {
		tl_loop_fail(l, c, TL_E_TIMEOUT, 0, 0, "handshake timed out");
	} else if (c->fail_err) {
		tl_loop_teardown(l, c);
	} else if (c->close_rcvd) {
		/* The close frames crossed, but the peer did not end TCP in
		 * time: a timed-out close, not a clean one. */
		tl_loop_fail(l, c, TL_E_CLOSE_TIMEOUT, 0, c->close_code, "the peer did not close the connection in time");
		tl_loop_teardown(l, c);
	} else if (c->send_errno) {
		/* A send failed and the receive side did not end in time. (If it
		 * did end, on_eof follows once Go has taken the queued input.) */
		if (c->eof)
			return;
		tl_loop_fail(l, c, TL_E_LOST, c->send_errno, 1006, strerror(c->send_errno));
		tl_loop_teardown(l, c);
	} else {
		tl_loop_fail(l, c, TL_E_CLOSE_TIMEOUT, 0, 1006, "no close frame from the peer in time");
		tl_loop_teardown(l, c);
	}
}

/* conn_timers fires c's due timers and returns its earliest armed one
 * (0: none). */
static uint64_t conn_timers(struct tl_loop *l, struct tl_conn *c, uint64_t now)
{
	uint64_t next = 0;
	if (c->deadline_ns && c->deadline_ns <= now)
		on_deadline(l, c);
	if (c->hb_ns && c->hb_ns <= now)
		hb_due(l, c, now);
	if (c->deadline_ns)
		next = c->deadline_ns;
	if (c->hb_ns && (!next || c->hb_ns < next))
		next = c->hb_ns;
	return next;
}

/* run_timers scans the connections for due timers, only when the
 * earliest one is due (see Timers in loop.h). */
static void run_timers(struct tl_loop *l)
{
	uint64_t now, next = 0;
	if (!timers_armed(l))
		return;
	now = tl_loop_now_ns();
	if (now < l->next_timer_ns)
		return;
	l->next_timer_ns = 0; /* timers armed during the scan lower it again */
	for (uint32_t i = 0; i < l->cfg.max_conns && timers_armed(l); i++) {
		struct tl_conn *c = &l->conns[i];
		uint64_t t;
		if (!c->deadline_ns && !c->hb_ns)
			continue;
		t = conn_timers(l, c, now);
		if (t && (next == 0 || t < next))
			next = t;
	}
	if (next && (l->next_timer_ns == 0 || next < l->next_timer_ns))
		l->next_timer_ns = next;
}

/* release_deferred recycles consumed slots whose in-place payloads the pump
 * has passed. Slots are queued in release order, which is close to event
 * order; one still referenced holds back the ones behind it a little. */
static void release_deferred(struct tl_loop *l)
{
	if (!tl_slots_deferred(&l->slots))
		return;
	tl_evq_refresh(&l->evq);
	tl_slots_release_deferred(&l->slots, l->evq.head_cache);
}

static void run_stalled(struct tl_loop *l)
{
	struct tl_conn *list = l->stalled, *c;
	l->stalled = NULL;
	tl_evq_refresh(&l->evq);
	while ((c = list) != NULL) {
		list = c->stall_next;
		c->on_stall_list = 0;
		c->stalled = 0;
		if (c->final_pending) {
			finish(l, c);
			continue;
		}
		if (c->rc_pending) {
			end_or_reconnect(l, c);
			continue;
		}
		/* A connection may have ended while it sat on the list: its slot
		 * is Go's again and must not be driven (nor one waiting to
		 * reconnect: it has no socket). */
		if (c->dying || c->state == TL_ST_IDLE || c->rc_wait)
			continue;
		tl_conn_drive(l, c);
		rx_step(l, c, RX_RESUME, 0);
	}
}

/* run_rearms re-arms the recvs waiting in TL_RX_WANT when their group has
 * a slot to give (else -ENOBUFS again). With sweep set it also looks for a
 * connection whose recv ended without the state machine noting it: a
 * defence only - every end goes through rx_step - so a debug build
 * (TL_DEBUG: the cgo.mk test and fuzz builds) aborts if it finds one. */
static void run_rearms(struct tl_loop *l, int sweep)
{
	for (uint32_t i = 0; i < l->cfg.max_conns && (l->rx_want || sweep); i++) {
		struct tl_conn *c = &l->conns[i];
		if (sweep && c->rx == TL_RX_OFF && !c->dying && !c->eof && c->fd >= 0 && c->state != TL_ST_IDLE &&
		    c->state != TL_ST_CONNECTING) {
#ifdef TL_DEBUG
			fprintf(stderr, "talaris: sweep found slot %u with no recv (state %d)\n", c->slot, c->state);
			abort();
#endif
			rx_set(l, c, TL_RX_WANT);
		}
		if (c->rx == TL_RX_WANT)
			rx_step(l, c, RX_TICK, 0);
		/* Output left behind when no SQE was free (a short send's rest,
		 * a buffer never submitted): flush does nothing otherwise. */
		if (sweep && !c->send_inflight && !c->dying && c->fd >= 0 && c->state != TL_ST_IDLE &&
		    c->state != TL_ST_CONNECTING)
			tl_loop_flush(l, c);
	}
}

/* ---- the loop ---- */

static int space_freed(struct tl_loop *l)
{
	if (l->stall_kick)
		return 1;
	return (l->stalled || tl_slots_deferred(&l->slots)) && tl_evq_head_moved(&l->evq);
}

static void shutdown_all(struct tl_loop *l)
{
	/* Stalled connections go on (their events are dropped from now on,
	 * see ring_full in conn.c) so their close handshakes can be read. */
	if (l->stalled)
		l->stall_kick = 1; /* (cleared by run_stalled, which runs only when one is) */
	for (uint32_t i = 0; i < l->cfg.max_conns; i++) {
		struct tl_conn *c = &l->conns[i];
		if (c->final_pending) {
			finish(l, c); /* shutting down: the event is dropped if there is no room */
			continue;
		}
		if (c->rc_pending) {
			end_or_reconnect(l, c); /* no reconnect while shutting down: final */
			continue;
		}
		if (c->state == TL_ST_IDLE || c->dying)
			continue;
		if (!c->fail_err && !c->close_rcvd) {
			c->fail_err = TL_E_SHUTDOWN;
			c->fail_code = 1001;
			tl_loop_detail(l, c, "pool closed");
		}
		if (c->state == TL_ST_OPEN && !c->close_sent && c->fd >= 0 && !c->eof && !c->send_errno) {
			/* Going away: send 1001 and let the close handshake run (the
			 * echo, then TCP's end), bounded by the close timeout. */
			tl_conn_send_close(l, c, 1001, (const uint8_t *)"pool closed", 11);
			tl_loop_set_state(l, c, TL_ST_CLOSING);
			tl_loop_flush(l, c);
			tl_loop_set_deadline(l, c, l->cfg.close_timeout_ns);
			continue;
		}
		if (c->state == TL_ST_CLOSING && c->deadline_ns)
			continue; /* a close handshake under way ends by itself, bounded */
		tl_loop_teardown(l, c);
	}
}

/* adaptive_spin is TL_WAIT_ADAPTIVE's only spin. Right after the loop
 * published events a command often follows at once: the pump's callback
 * answers a message (an order acknowledged, the next order sent). While the
 * last answer came within spin_ns of its publish, the loop spins until
 * spin_ns after this publish, looking for a command (and completions)
 * rather than sleeping: the sender then finds it awake and writes no
 * eventfd, and the loop is spared a wake-up. A spin that ends empty stops
 * the spinning until an answer is seen in time again (measured on the
 * wake-up that answer causes), so a pool that only reads, or an idle one,
 * does not spin. Nothing spins while waiting for the network: on a small
 * machine the peer (or the feed) needs that CPU. Returns 1 when work
 * turned up, 0 when the caller should block. */
static int adaptive_spin(struct tl_loop *l)
{
	int get = !!(l->cfg.ring_flags & (IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN));
	uint64_t until;
	unsigned i = 0;

	if (!l->pub_ns || l->reply_gap_ns > l->cfg.spin_ns)
		return 0;
	until = l->pub_ns + l->cfg.spin_ns;
	while (tl_loop_now_ns() < until) {
		if (tl_cmdq_pending(&l->cmdq) || (!l->stop_done && __atomic_load_n(&l->stop_req, __ATOMIC_RELAXED)))
			return 1;
		/* The command ring is a load; completions cost a syscall under
		 * DEFER_TASKRUN, so look at them less often. The yield hands the
		 * CPU to the pump when it waits to run on this one (a busy
		 * 2-CPU machine): spinning over it delayed the very answer
		 * spun for by the whole spin (measured: p50 + spin_ns). */
		if ((++i & 7) == 0) {
			if (get)
				io_uring_get_events(&l->ring);
			if (io_uring_cq_ready(&l->ring) || space_freed(l))
				return 1;
			sched_yield();
		}
		__builtin_ia32_pause();
	}
	l->reply_gap_ns = UINT64_MAX;
	return 0;
}

static void loop_iteration_wait(struct tl_loop *l, int busy)
{
	struct __kernel_timespec ts;
	struct io_uring_cqe *cqe;
	uint64_t wait_ns = 0;
	int spin = l->cfg.loop_wait == TL_WAIT_SPIN;

	if (l->cfg.loop_wait == TL_WAIT_ADAPTIVE && !busy) {
		io_uring_submit(&l->ring);
		if (l->cfg.ring_flags & (IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN))
			io_uring_get_events(&l->ring);
		if (io_uring_cq_ready(&l->ring) || adaptive_spin(l))
			return;
	} else if (busy || spin || l->cfg.loop_wait == TL_WAIT_SPIN_THEN_BLOCK || l->cfg.loop_wait == TL_WAIT_DEFAULT) {
		io_uring_submit(&l->ring);
		if (l->cfg.ring_flags & (IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN))
			io_uring_get_events(&l->ring);
		if (io_uring_cq_ready(&l->ring) || busy || spin)
			return;
		/* spin-then-block: spin on the CQ and the command ring a while */
		uint64_t until = tl_loop_now_ns() + l->cfg.spin_ns;
		while (tl_loop_now_ns() < until) {
			if (l->cfg.ring_flags & (IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_COOP_TASKRUN))
				io_uring_get_events(&l->ring);
			if (io_uring_cq_ready(&l->ring) || tl_cmdq_pending(&l->cmdq) || space_freed(l))
				return;
			__builtin_ia32_pause();
		}
	}
	/* Block. Announce it, then look once more (Go checks the flag after
	 * publishing, so one of us sees the other). */
	arm_efd(l);
	__atomic_store_n(&l->cmdq.r->loop_sleeping, 1, __ATOMIC_SEQ_CST);
	/* Ask the pump for a wake-up when it frees space only if someone waits
	 * for it: a stalled connection, or a recv starved of slots that are
	 * held by unconsumed in-place payloads. Otherwise deferred slots go
	 * back on the next natural wake-up, without an extra syscall. */
	if (l->stalled || (tl_slots_deferred(&l->slots) && l->rx_want))
		__atomic_store_n(&l->evq.r->loop_wants_space, 1, __ATOMIC_SEQ_CST);
	if (tl_cmdq_pending(&l->cmdq) || space_freed(l) ||
	    (!l->stop_done && __atomic_load_n(&l->stop_req, __ATOMIC_SEQ_CST))) {
		__atomic_store_n(&l->cmdq.r->loop_sleeping, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&l->evq.r->loop_wants_space, 0, __ATOMIC_RELAXED);
		io_uring_submit(&l->ring);
		return;
	}
	if (timers_armed(l)) {
		uint64_t now = tl_loop_now_ns();
		/* No cap: next_timer_ns is never later than the earliest deadline
		 * (tl_loop_timer_at lowers it, run_timers recomputes it), and
		 * while a connection with a socket lives the sweep tick below
		 * bounds the wait anyway. Only handles waiting out a reconnect
		 * backoff then sleep until their deadline. */
		wait_ns = l->next_timer_ns > now ? l->next_timer_ns - now : 0;
	}
	if (l->rx_want && (wait_ns == 0 || wait_ns > 1000000ull))
		wait_ns = 1000000ull;
	/* Sweep tick: while connections live, wake at least every 20 ms and
	 * look at the parked ones again (stalled, waiting for a re-arm,
	 * holding deferred slots), so a missed wake-up costs a tick, never a
	 * hang. */
	if (l->live > l->rc_waits && (wait_ns == 0 || wait_ns > TL_SWEEP_NS))
		wait_ns = TL_SWEEP_NS;
	if (wait_ns) {
		ts.tv_sec = (long long)(wait_ns / 1000000000ull);
		ts.tv_nsec = (long long)(wait_ns % 1000000000ull);
		io_uring_submit_and_wait_timeout(&l->ring, &cqe, 1, &ts, NULL);
	} else if (timers_armed(l)) {
		io_uring_submit(&l->ring);
	} else {
		io_uring_submit_and_wait(&l->ring, 1);
	}
	__atomic_store_n(&l->cmdq.r->loop_sleeping, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&l->evq.r->loop_wants_space, 0, __ATOMIC_RELAXED);
}

static void loop_run(struct tl_loop *l)
{
	struct io_uring_cqe *cqes[TL_CQE_BATCH];
	int busy = 0;

	for (;;) {
		unsigned n;

		if (__atomic_load_n(&l->stop_req, __ATOMIC_ACQUIRE))
			l->shutting_down = 1;
		if (l->shutting_down && !l->stop_done) {
			shutdown_all(l);
			l->stop_done = 1;
		}
		if (l->stop_done && l->live == 0)
			break;
		loop_iteration_wait(l, busy);
		busy = 0;
		if (l->hb_timed) /* the clock receives are stamped with */
			l->now_ns = tl_loop_now_ns();
		while ((n = io_uring_peek_batch_cqe(&l->ring, cqes, TL_CQE_BATCH)) > 0) {
			for (unsigned i = 0; i < n; i++)
				handle_cqe(l, cqes[i]);
			io_uring_cq_advance(&l->ring, n);
			STAT_ADD(l, cqes, n);
			busy = 1;
		}
		if (tl_cmdq_drain(l)) {
			busy = 1;
			if (l->pub_ns) { /* adaptive wait: how fast the answer came */
				l->reply_gap_ns = tl_loop_now_ns() - l->pub_ns;
				l->pub_ns = 0;
			}
		}
		{
			uint64_t now = l->live > l->rc_waits && !busy ? tl_loop_now_ns() : 0;
			int sweep = now && now - l->last_sweep_ns >= TL_SWEEP_NS;
			if (sweep)
				l->last_sweep_ns = now;
			if (l->stalled && (sweep || space_freed(l) || l->stall_kick)) {
				l->stall_kick = 0;
				run_stalled(l);
				busy = 1;
			}
			release_deferred(l);
			if (l->rx_want || sweep)
				run_rearms(l, sweep);
		}
		run_timers(l);
		tl_slots_commit(&l->slots);
		if (l->evq.tail != l->evq.published) {
			tl_evq_publish(&l->evq);
			/* Adaptive wait: an answer is worth spinning for only when
			 * the pump is awake to send it. A pump this publish had to
			 * wake needs a CPU first, maybe the one the loop would spin
			 * on (measured: spinning then doubled the round trip). */
			if (l->cfg.loop_wait == TL_WAIT_ADAPTIVE)
				l->pub_ns = __atomic_load_n(&l->evq.r->cons_sleeping, __ATOMIC_RELAXED) ? 0 : tl_loop_now_ns();
		}
		/* With nothing submitted and a clean CQ, a spinning loop still
		 * needs the kernel to post deferred work: handled in wait. */
	}
	tl_evq_publish(&l->evq);
}

/* ---- setup ---- */

static int setup_ring(struct tl_loop *l)
{
	struct io_uring_params p;
	int ret;

	memset(&p, 0, sizeof(p));
	p.flags = l->cfg.ring_flags | IORING_SETUP_CQSIZE;
	p.cq_entries = l->cfg.cq_entries;
	if (p.flags & IORING_SETUP_SQPOLL) {
		p.sq_thread_idle = l->cfg.sq_thread_idle_ms;
		if (l->cfg.sq_thread_cpu >= 0) {
			p.flags |= IORING_SETUP_SQ_AFF;
			p.sq_thread_cpu = (uint32_t)l->cfg.sq_thread_cpu;
		}
	}
	ret = io_uring_queue_init_params(l->cfg.sq_entries, &l->ring, &p);
	if (ret < 0) {
		snprintf(l->setup_msg, sizeof(l->setup_msg), "io_uring_queue_init_params(flags=%#x): %s", p.flags,
			 strerror(-ret));
		return ret;
	}
	l->ring_ok = 1;
	/* Registered ring fd: fewer fd lookups per enter. Best effort. */
	io_uring_register_ring_fd(&l->ring);
	{
		unsigned workers[2] = {2, 2};
		io_uring_register_iowq_max_workers(&l->ring, workers);
	}
	if (l->cfg.loop_cpu >= 0) {
		cpu_set_t set;
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		CPU_ZERO(&set);
		for (long i = 0; i < ncpu && i < CPU_SETSIZE; i++)
			if (i != l->cfg.loop_cpu)
				CPU_SET(i, &set);
		if (CPU_COUNT(&set) > 0)
			io_uring_register_iowq_aff(&l->ring, sizeof(set), &set);
	}
	ret = tl_slots_register(&l->slots, &l->ring, l->cfg.buf_size, l->cfg.buf_count);
	if (ret < 0) {
		snprintf(l->setup_msg, sizeof(l->setup_msg), "provided buffer ring (%u x %u): %s", l->cfg.buf_count,
			 l->cfg.buf_size, strerror(-ret));
		return ret;
	}
	return 0;
}

/* name_loop_thread names the calling thread "talaris-loop" (its comm in
 * /proc/self/task/<tid>/comm), so tools and `talaris bench` can tell the loop
 * thread from the Go runtime's threads when they split CPU time per thread.
 * Best effort: a failure only leaves the inherited name. */
static void name_loop_thread(void)
{
	(void)pthread_setname_np(pthread_self(), "talaris-loop");
}

static void *loop_main(void *arg)
{
	struct tl_loop *l = arg;
	int ret;

	name_loop_thread();
	if (l->cfg.loop_cpu >= 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(l->cfg.loop_cpu, &set);
		ret = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
		if (ret) {
			snprintf(l->setup_msg, sizeof(l->setup_msg), "pin loop to CPU %d: %s", l->cfg.loop_cpu,
				 strerror(ret));
			ret = -ret;
			goto report;
		}
	}
	/* SINGLE_ISSUER makes the creating thread the submitter: create here. */
	ret = setup_ring(l);
report:
	pthread_mutex_lock(&l->mu);
	l->setup_state = ret < 0 ? ret : 1;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
	if (ret < 0)
		return NULL;
	loop_run(l);
	return NULL;
}

/* map_zero maps n zeroed bytes, populated up front: the hot path must not
 * take a page fault the first time it touches a ring or arena line. */
static void *map_zero(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static int pow2(uint64_t v) { return v && !(v & (v - 1)); }

/* loop_alloc makes a loop's memory (rings, arena, tables) without a thread
 * or io_uring. */
static struct tl_loop *loop_alloc(const struct tl_config *cfg, int *err, char *errbuf, size_t errcap)
{
	struct tl_loop *l;

	*err = 0;
	if (!pow2(cfg->event_ring_size) || !pow2(cfg->arena_size) || !pow2(cfg->cmd_ring_size) ||
	    !pow2(cfg->buf_size) || !pow2(cfg->buf_count) || cfg->max_conns == 0 || cfg->max_conns > TL_MAX_SLOTS ||
	    cfg->max_message == 0 || cfg->max_message > cfg->arena_size / 2 || cfg->cmd_ring_size < 4096) {
		*err = -EINVAL;
		snprintf(errbuf, errcap, "sizes must be powers of two, max message <= arena/2, cmd ring >= 4096");
		return NULL;
	}
	l = calloc(1, sizeof(*l));
	if (!l)
		goto nomem;
	l->cfg = *cfg;
	l->sample_left = cfg->sample_every;
	l->efd = -1;
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	l->stats = map_zero(sizeof(*l->stats));
	l->conns = calloc(cfg->max_conns, sizeof(*l->conns));
	l->pub = map_zero(sizeof(*l->pub) * cfg->max_conns);
	l->dials = calloc(cfg->max_conns, sizeof(*l->dials));
	if (!l->stats || !l->conns || !l->pub || !l->dials)
		goto nomem_free;
	if (tl_slots_alloc(&l->slots, cfg->buf_count) < 0)
		goto nomem_free;
	if (tl_evq_init(&l->evq, cfg->event_ring_size, cfg->arena_size, l->stats, cfg->sample_every != 0) < 0)
		goto nomem_free;
	if (tl_cmdq_init(&l->cmdq, cfg->cmd_ring_size) < 0)
		goto nomem_free;
	for (uint32_t i = 0; i < cfg->max_conns; i++) {
		l->conns[i].fd = -1;
		l->conns[i].slot = i;
		tl_rxq_init(&l->conns[i].rxq);
		l->conns[i].cur_q = -1;
	}
	return l;

nomem_free:
	tl_loop_free(l);
nomem:
	*err = -ENOMEM;
	snprintf(errbuf, errcap, "out of memory");
	return NULL;
}

struct tl_loop *tl_loop_new_detached(const struct tl_config *cfg)
{
	int err;
	char msg[128];
	return loop_alloc(cfg, &err, msg, sizeof(msg));
}

struct tl_loop *tl_loop_new(const struct tl_config *cfg, int *err, char *errbuf, size_t errcap)
{
	struct tl_loop *l = loop_alloc(cfg, err, errbuf, errcap);
	int ret;

	if (!l)
		return NULL;
	l->efd = eventfd(0, EFD_CLOEXEC);
	if (l->efd < 0) {
		*err = -errno;
		snprintf(errbuf, errcap, "eventfd: %s", strerror(errno));
		tl_loop_free(l);
		return NULL;
	}
	l->cmdq.r->efd = l->efd;
	ret = pthread_create(&l->thread, NULL, loop_main, l);
	if (ret) {
		*err = -ret;
		snprintf(errbuf, errcap, "pthread_create: %s", strerror(ret));
		tl_loop_free(l);
		return NULL;
	}
	l->started = 1;
	pthread_mutex_lock(&l->mu);
	while (l->setup_state == 0)
		pthread_cond_wait(&l->cv, &l->mu);
	pthread_mutex_unlock(&l->mu);
	if (l->setup_state < 0) {
		*err = l->setup_state;
		snprintf(errbuf, errcap, "%s", l->setup_msg);
		pthread_join(l->thread, NULL);
		l->started = 0;
		tl_loop_free(l);
		return NULL;
	}
	return l;
}

struct tl_evring *tl_loop_evring(struct tl_loop *l) { return l->evq.r; }
struct tl_cmdring *tl_loop_cmdring(struct tl_loop *l) { return l->cmdq.r; }
struct tl_conn_pub *tl_loop_conns(struct tl_loop *l) { return l->pub; }
struct tl_pool_stats *tl_loop_stats(struct tl_loop *l) { return l->stats; }

int tl_dial_prepare(struct tl_loop *l, uint32_t slot, const struct tl_dial_params *p)
{
	struct tl_dial *d;

	if (slot >= l->cfg.max_conns || p->addr_len > sizeof(p->addr) || p->local_len > sizeof(p->local) ||
	    p->nalt > 64 || (p->nalt && !p->alt))
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	memcpy(&d->addr, &p->addr, sizeof(d->addr));
	d->addr_len = p->addr_len;
	memcpy(&d->local, &p->local, sizeof(d->local));
	d->local_len = p->local_len;
	if (p->nalt) {
		d->alt = malloc(p->nalt * sizeof(*d->alt));
		if (!d->alt)
			goto fail;
		memcpy(d->alt, p->alt, p->nalt * sizeof(*d->alt));
		d->nalt = p->nalt;
	}
	d->tls = p->tls;
	d->insecure = p->insecure;
	d->handshake_timeout_ns = p->handshake_timeout_ns ? p->handshake_timeout_ns : l->cfg.handshake_timeout_ns;
	d->ping_interval_ns = p->ping_interval_ns;
	d->read_timeout_ns = p->read_timeout_ns;
	d->rc_enabled = p->rc_enabled && p->rc_min_ns && p->rc_max_ns >= p->rc_min_ns;
	d->rc_max_attempts = p->rc_max_attempts;
	d->rc_min_ns = p->rc_min_ns;
	d->rc_max_ns = p->rc_max_ns;
#define DUP(f)                                              \
	do {                                                \
		d->f = tl_dupn(p->f ? p->f : "", p->f##_len); \
		d->f##_len = p->f##_len;                    \
		if (!d->f)                                  \
			goto fail;                          \
	} while (0)
	DUP(host);
	DUP(path);
	DUP(headers);
	DUP(protocols);
	DUP(server_name);
	DUP(ca_file);
	DUP(ca_pem);
	DUP(subscribe);
#undef DUP
	if (p->tls && !(d->tlsx = tl_tlsv_dial_copy(p)))
		goto fail;
	free_dial(l->dials[slot]);
	l->dials[slot] = d;
	return 0;
fail:
	free_dial(d);
	return -ENOMEM;
}

size_t tl_loop_fail_head(struct tl_loop *l, uint32_t slot, uint32_t gen, char *buf, size_t cap)
{
	struct tl_conn *c;
	size_t n;

	if (!l->conns || slot >= l->cfg.max_conns)
		return 0;
	c = &l->conns[slot];
	if (c->gen != gen || !c->fail_head)
		return 0;
	n = c->fail_head_len < cap ? c->fail_head_len : cap;
	memcpy(buf, c->fail_head, n);
	return n;
}

void tl_loop_stop(struct tl_loop *l)
{
	uint64_t one = 1;

	if (!l->started)
		return;
	__atomic_store_n(&l->stop_req, 1, __ATOMIC_SEQ_CST);
	if (write(l->efd, &one, sizeof(one)) < 0) {
		/* the loop checks stop_req before every wait anyway */
	}
	pthread_join(l->thread, NULL);
	l->started = 0;
}

void tl_loop_free(struct tl_loop *l)
{
	if (!l)
		return;
	if (l->started)
		tl_loop_stop(l);
	if (l->conns) {
		for (uint32_t i = 0; i < l->cfg.max_conns; i++) {
			struct tl_conn *c = &l->conns[i];
			if (c->fd >= 0)
				close(c->fd);
			tl_tls_free(c);
			free_dial(c->dial);
			free(c->hs);
			free(c->fail_head);
			free(c->msg);
			free(c->out[0].p);
			free(c->out[1].p);
			free(c->sq.p);
		}
	}
	if (l->dials)
		for (uint32_t i = 0; i < l->cfg.max_conns; i++)
			free_dial(l->dials[i]);
	tl_slots_free(&l->slots, l->ring_ok ? &l->ring : NULL);
	if (l->ring_ok)
		io_uring_queue_exit(&l->ring);
	tl_tls_shared_free(&l->ts);
	if (l->efd >= 0)
		close(l->efd);
	tl_evq_free(&l->evq);
	tl_cmdq_free(&l->cmdq);
	if (l->stats)
		munmap(l->stats, sizeof(*l->stats));
	if (l->pub)
		munmap(l->pub, sizeof(*l->pub) * l->cfg.max_conns);
	free(l->conns);
	free(l->dials);
	tl_conn_shared_free(&l->cs);
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cv);
	free(l);
}
