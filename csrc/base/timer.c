/* base/timer.c - clock and timer bookkeeping (timer.h). Pure bookkeeping on
 * the loop's and the connection's timer fields: no io_uring, no call into
 * any other csrc file. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "base/timer.h"

#include <time.h>

#include "loop/state.h"

uint64_t tl_timer_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void tl_timer_at(struct tl_loop *l, uint64_t at)
{
	if (l->next_timer_ns == 0 || at < l->next_timer_ns)
		l->next_timer_ns = at;
}

void tl_timer_set_deadline(struct tl_loop *l, struct tl_conn *c, uint64_t ns_from_now)
{
	if (!c->deadline_ns)
		l->timed++;
	c->deadline_ns = tl_timer_now_ns() + ns_from_now;
	tl_timer_at(l, c->deadline_ns);
}

void tl_timer_clear_deadline(struct tl_loop *l, struct tl_conn *c)
{
	if (c->deadline_ns) {
		c->deadline_ns = 0;
		l->timed--;
	}
}

uint64_t tl_timer_hb_next(const struct tl_conn *c)
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

void tl_timer_hb_arm(struct tl_loop *l, struct tl_conn *c, uint64_t at)
{
	if (!c->hb_ns)
		l->hb_timed++;
	c->hb_ns = at;
	tl_timer_at(l, at);
}

void tl_timer_hb_clear(struct tl_loop *l, struct tl_conn *c)
{
	if (c->hb_ns) {
		c->hb_ns = 0;
		l->hb_timed--;
	}
}

void tl_timer_hb_start(struct tl_loop *l, struct tl_conn *c)
{
	uint64_t now;
	if (!c->dial || (!c->dial->ping_interval_ns && !c->dial->read_timeout_ns) || c->fd < 0)
		return;
	now = tl_timer_now_ns();
	/* The cached clock may be stale while no heartbeat ran: refresh it so
	 * this iteration's receives are not stamped in the past. */
	l->now_ns = now;
	c->last_rx_ns = now;
	c->last_ping_ns = 0;
	tl_timer_hb_arm(l, c, tl_timer_hb_next(c));
}
