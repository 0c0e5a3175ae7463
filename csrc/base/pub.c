/* base/pub.c - a connection's public record for Go (pub.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "base/pub.h"

#include <linux/futex.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "loop/state.h"
#include "base/timer.h"

/* pub_tx_notify tells Go that c's send accounting or state changed: bump
 * the futex word, and wake only when a SendContext announced that it
 * sleeps (it sets tx_waiters, then rechecks; we bump, then check: seq_cst
 * on both sides, Dekker style). */
static void pub_tx_notify(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_conn_pub *p = &l->pub[c->slot];
	__atomic_fetch_add(&p->tx_seq, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&p->tx_waiters, __ATOMIC_SEQ_CST))
		syscall(SYS_futex, &p->tx_seq, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

void tl_pub_tx_retire(struct tl_loop *l, struct tl_conn *c, uint64_t units)
{
	if (!units)
		return;
	c->tx_done += units;
	__atomic_store_n(&l->pub[c->slot].tx_done, c->tx_done, __ATOMIC_RELEASE);
	pub_tx_notify(l, c);
}

void tl_pub_tx_drop(struct tl_loop *l, struct tl_conn *c, uint64_t units)
{
	struct tl_conn_pub *p = &l->pub[c->slot];

	if (!units)
		return;
	/* Before tx_done: a Flush that sees its units retired then finds
	 * the drop among them. */
	__atomic_store_n(&p->tx_dropped, p->tx_dropped + units, __ATOMIC_RELEASE);
	if (units >= TL_UNIT_MSG)
		__atomic_store_n(&l->stats->send_dropped, l->stats->send_dropped + units / TL_UNIT_MSG,
				 __ATOMIC_RELAXED);
	tl_pub_tx_retire(l, c, units);
}

void tl_pub_set_state(struct tl_loop *l, struct tl_conn *c, int st)
{
	struct tl_conn_pub *p = &l->pub[c->slot];
	if (st == TL_ST_OPEN && c->state != TL_ST_OPEN)
		tl_timer_hb_start(l, c);
	c->state = (uint8_t)st;
	/* Dial tells "opened, then ended before Dial looked" (the events are
	 * in the ring: a success) from "failed during the handshake". */
	if (st == TL_ST_OPEN) {
		__atomic_store_n(&p->opened, 1, __ATOMIC_RELAXED);
		c->was_open = 1;
		if (++c->opens > 1) { /* a reconnect policy's re-open */
			__atomic_store_n(&p->reconnects, c->opens - 1, __ATOMIC_RELAXED);
			__atomic_store_n(&l->stats->reconnects, l->stats->reconnects + 1, __ATOMIC_RELAXED);
		}
		__atomic_store_n(&p->gap, 0, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&p->state, (uint32_t)st, __ATOMIC_RELEASE);
	/* Dial may be waiting on this word. State changes are rare. */
	syscall(SYS_futex, &p->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
	pub_tx_notify(l, c); /* and a SendContext on tx_seq: it returns once the connection ends */
}

int tl_pub_claim_open(struct tl_loop *l, struct tl_conn *c)
{
	uint32_t *w = &l->pub[c->slot].dial_claim, none = TL_CLAIM_NONE;
	/* Acquire/release pair with Go's CAS: one of the two wins. */
	if (__atomic_compare_exchange_n(w, &none, TL_CLAIM_LOOP, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return 0;
	return none == TL_CLAIM_ABANDONED ? -1 : 0;
}

void tl_pub_detail(struct tl_loop *l, struct tl_conn *c, const char *msg)
{
	struct tl_conn_pub *p = &l->pub[c->slot];
	snprintf(p->detail, sizeof(p->detail), "%s", msg ? msg : "");
}
