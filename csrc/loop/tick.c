/* loop/tick.c - firing the timers timer.c arms: the scan that runs only when
 * the earliest timer is due (see Timers in state.h), a lifecycle
 * deadline's consequence (handshake or close timeout, the end of a
 * reconnect backoff) and the heartbeat (read timeout, pings). Calls
 * life.c, ws/ and the layers below. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/tick.h"

#include <string.h>

#include "loop/life.h"
#include "transport/proxy.h"
#include "base/pub.h"
#include "loop/rx.h"
#include "base/timer.h"

/* hb_due runs c's heartbeat at now: fail it when nothing arrived for the
 * read timeout, send a ping when nothing arrived (and no ping left) for
 * the ping interval, then re-arm for the next check. The read timeout
 * measures the silence up to seen, the loop's last look at its
 * completions (run_timers, loop/run.c), not up to now: if the loop thread did
 * not run (a saturated machine, a stop), the peer's data may be waiting
 * in the kernel, and the check is left to the next iteration, which looks
 * first. A peer silent for the read timeout before that look is silent. */
static void hb_due(struct tl_loop *l, struct tl_conn *c, uint64_t now, uint64_t seen)
{
	const struct tl_dial *d = c->dial;

	if (c->state != TL_ST_OPEN || c->dying || !d) {
		tl_timer_hb_clear(l, c); /* closing or ended: the close timeout rules */
		return;
	}
	if (c->stalled || c->rx == TL_RX_PAUSING || c->rx == TL_RX_PAUSED || c->rx == TL_RX_WANT)
		c->last_rx_ns = now; /* we stopped reading (back-pressure), not the peer */
	if (d->read_timeout_ns && seen > c->last_rx_ns && seen - c->last_rx_ns >= d->read_timeout_ns) {
		tl_timer_hb_clear(l, c);
		tl_life_fail(l, c, TL_E_READ_TIMEOUT, 0, 1006, "no data, ping, pong or close from the peer");
		return;
	}
	if (d->ping_interval_ns && !tl_conn_close_sent(c) && !c->send_errno) {
		uint64_t base = c->last_ping_ns > c->last_rx_ns ? c->last_ping_ns : c->last_rx_ns;
		/* (A peer that does not read gets no more pings piled up.) */
		if (now - base >= d->ping_interval_ns && c->out[0].len + c->out[1].len + c->tx_pt.len < l->cfg.max_send_queue) {
			if (tl_conn_send_frame(l, c, TL_OP_PING, 1, NULL, 0) < 0) {
				tl_life_after(l, c); /* c failed */
				return;
			}
			c->last_ping_ns = now;
			tl_life_flush(l, c);
		}
	}
	tl_timer_hb_arm(l, c, tl_timer_hb_next(c));
}

static void on_deadline(struct tl_loop *l, struct tl_conn *c)
{
	tl_timer_clear_deadline(l, c);
	if (c->dying)
		return;
	if (c->rc == TL_RC_BACKOFF) { /* the backoff is over: next attempt */
		tl_life_rc_set(l, c, TL_RC_NONE);
		tl_life_dial_start(l, c);
		return;
	}
	if (c->refusing && !c->fail_err) {
		/* The refused upgrade's body did not come in time: report the
		 * refusal with what came. */
		tl_conn_refusal_end(l, c);
		tl_life_after(l, c);
	} else if (c->px) {
		tl_proxy_timeout(l, c); /* the proxy's handshake: ErrProxy wrapping ErrTimeout */
		tl_life_after(l, c);
	} else if (c->state < TL_ST_OPEN) {
		tl_life_fail(l, c, TL_E_TIMEOUT, 0, 0, "handshake timed out");
	} else if (c->fail_err) {
		tl_life_teardown(l, c);
	} else if (tl_conn_close_rcvd(c) && c->shut_wr == TL_SHUT_DONE) {
		/* The close frames crossed and ours is out (the sending side
		 * is shut): the grace for the server's FIN is over, a clean end
		 * (a server whose writer keeps going never sends one). */
		tl_life_teardown(l, c);
	} else if (tl_conn_close_rcvd(c)) {
		/* The close frames crossed, but our output did not drain (the
		 * peer does not read) in time: a timed-out close, not a clean one. */
		tl_life_fail(l, c, TL_E_CLOSE_TIMEOUT, 0, c->close_code, "the peer did not close the connection in time");
		tl_life_teardown(l, c);
	} else if (c->send_errno) {
		/* A send failed and the receive side did not end in time. (If it
		 * did end, tl_conn_on_eof follows once Go has taken the queued input.) */
		if (c->eof)
			return;
		tl_life_fail(l, c, TL_E_LOST, c->send_errno, 1006, strerror(c->send_errno));
		tl_life_teardown(l, c);
	} else {
		tl_life_fail(l, c, TL_E_CLOSE_TIMEOUT, 0, 1006, "no close frame from the peer in time");
		tl_life_teardown(l, c);
	}
}

/* conn_timers fires c's due timers and returns its earliest armed one
 * (0: none). */
static uint64_t conn_timers(struct tl_loop *l, struct tl_conn *c, uint64_t now, uint64_t seen)
{
	uint64_t next = 0;
	if (c->deadline_ns && c->deadline_ns <= now)
		on_deadline(l, c);
	if (c->hb_ns && c->hb_ns <= now)
		hb_due(l, c, now, seen);
	if (c->deadline_ns)
		next = c->deadline_ns;
	if (c->hb_ns && (!next || c->hb_ns < next))
		next = c->hb_ns;
	return next;
}

/* tl_tick_run scans the connections for due timers, only when the
 * earliest one is due (see Timers in loop.h). */
void tl_tick_run(struct tl_loop *l, uint64_t now, uint64_t seen)
{
	uint64_t next = 0;
	if (!tl_tick_armed(l) || now < l->next_timer_ns)
		return;
	l->next_timer_ns = 0; /* timers armed during the scan lower it again */
	for (uint32_t i = 0; i < l->cfg.max_conns && tl_tick_armed(l); i++) {
		struct tl_conn *c = &l->conns[i];
		uint64_t t;
		if (!c->deadline_ns && !c->hb_ns)
			continue;
		t = conn_timers(l, c, now, seen);
		if (t && (next == 0 || t < next))
			next = t;
	}
	if (next && (l->next_timer_ns == 0 || next < l->next_timer_ns))
		l->next_timer_ns = next;
}
