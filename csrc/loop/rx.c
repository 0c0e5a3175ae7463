/* loop/rx.c - the receive side of a connection: one state (c->rx, TL_RX_*)
 * changed only by tl_rx_step, which arms, pauses, regroups and re-arms its
 * multishot recv. Calls only uring.h and the slot tables. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/rx.h"

#include <errno.h>

#include "loop/uring.h"

#define STAT_ADD(l, f, n) __atomic_store_n(&(l)->stats->f, (l)->stats->f + (n), __ATOMIC_RELAXED)

uint64_t tl_rx_ud(const struct tl_conn *c)
{
	return tl_ud((c->rx_hs ? TL_OPK_RECV_HS : TL_OPK_RECV) | (unsigned)c->rx_epoch << TL_OPK_EPOCH_SHIFT, c->gen, c->slot);
}

/* tl_rx_in_kernel: a multishot recv is in the kernel (its final CQE, one
 * without IORING_CQE_F_MORE, is still to come). */
int tl_rx_in_kernel(const struct tl_conn *c)
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

int tl_rx_cancel(struct tl_loop *l, struct tl_conn *c, uint64_t target)
{
	struct io_uring_sqe *sqe = tl_uring_sqe(l);
	if (!sqe)
		return -1;
	io_uring_prep_cancel64(sqe, target, 0);
	io_uring_sqe_set_data64(sqe, tl_ud(TL_OPK_CANCEL, c->gen, c->slot));
	c->cancel_inflight++;
	c->probe.cancel_ticks = c->probe.ticks;
	return 0;
}

/* rx_end_here ends c's recv in the loop, which the kernel will not end
 * (RX_GONE) or has not (RX_STUCK): the epoch moves on, so a completion of
 * that recv coming after all is stale, and RX_END applies res. */
static void rx_end_here(struct tl_loop *l, struct tl_conn *c, int res)
{
	c->rx_epoch = (c->rx_epoch + 1) % TL_OPK_EPOCHS;
	tl_rx_step(l, c, RX_END, res);
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

/* tl_rx_step is every transition of the receive side (c->rx):
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
 *   OFF       --LOST-->     WANT: the sweep found a live connection with no
 *                           recv (never expected: TL_DEBUG builds abort first)
 *   ARMED     --REVIVE-->   REARMING: the probe found the socket ready and the
 *                           recv silent twice in a row (loop/probe.c, tl_loop_probe_recvs)
 *   REARMING  --GONE-->     WANT, or OFF when dying: the probe's cancel (or a
 *   (or any state in      teardown's) found nothing in the kernel (-ENOENT),
 *   the kernel)             so no END will come; the recv epoch moves on
 *   in the kernel --STUCK--> OFF: a cancel found the recv (res 0) but its
 *                         END did not follow for TL_PROBE_STUCK probes
 *                         (loop/probe.c); the epoch moves on and the recv ends here,
 *                         with -EIO (c->eof: the connection fails) unless
 *                         dying
 *
 * res is the recv's result for RX_END. */
void tl_rx_step(struct tl_loop *l, struct tl_conn *c, int ev, int res)
{
	struct io_uring_sqe *sqe;

	switch (ev) {
	case RX_ARM:
		if (tl_rx_in_kernel(c) || c->dying || c->fd < 0)
			return;
		sqe = tl_uring_sqe(l);
		if (!sqe) {
			rx_set(l, c, TL_RX_WANT); /* tl_loop_run_rearms tries again */
			return;
		}
		c->rx_hs = c->state < TL_ST_OPEN;
		c->rx_cap = 0;
		io_uring_prep_recv_multishot(sqe, c->fd, NULL, 0, 0);
		sqe->flags |= IOSQE_BUFFER_SELECT;
		/* A bundle fills as many buffers as the socket has bytes for, in
		 * one completion (tl_slots_take unpacks it). Not while
		 * handshaking: those few bytes fit one slot. */
		if (l->recv_bundle && !c->rx_hs) {
			sqe->ioprio |= IORING_RECVSEND_BUNDLE;
			sqe->len = l->bundle_len;
			c->rx_cap = l->bundle_len != 0;
		}
		sqe->buf_group = c->rx_hs ? TL_HS_BGID : TL_BGID;
		io_uring_sqe_set_data64(sqe, tl_rx_ud(c));
		rx_set(l, c, TL_RX_ARMED);
		c->probe.ticks++; /* not silent at the next probe, which clears probe.suspect */
		c->probe.revived = 0;
		c->probe.cancel_hit = 0;
		return;
	case RX_END:
		if (res == -EINVAL && c->rx_cap) {
			/* A kernel with bundles but no per-recv cap for multishot
			 * recvs (before Linux 6.1x) refuses sqe->len: arm without
			 * it from now on. Per recv, not per loop: every recv armed
			 * with the cap before the first refusal came back is
			 * refused the same way (several connections opening in
			 * one iteration), and is no connection loss either. */
			l->bundle_len = 0;
			res = -ECANCELED; /* re-armed like a regroup */
		}
		c->probe.cancel_hit = 0;
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
		if (c->rx == TL_RX_REARMING || tl_rx_cancel(l, c, tl_rx_ud(c)) == 0)
			rx_set(l, c, TL_RX_PAUSING); /* (a regroup's cancel is already on the way) */
		return;
	case RX_RESUME:
		if (c->stalled || c->dying || c->eof)
			return;
		if (c->rx == TL_RX_PAUSING) {
			rx_set(l, c, TL_RX_REARMING);
		} else if (c->rx == TL_RX_PAUSED) {
			rx_set(l, c, TL_RX_OFF);
			tl_rx_step(l, c, RX_ARM, 0);
			STAT_ADD(l, rearms, 1);
		}
		return;
	case RX_REGROUP:
		if (c->rx == TL_RX_ARMED && c->rx_hs && c->state >= TL_ST_OPEN && !c->dying && tl_rx_cancel(l, c, tl_rx_ud(c)) == 0)
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
			tl_rx_step(l, c, RX_ARM, 0);
			STAT_ADD(l, rearms, 1);
		}
		return;
	}
	case RX_TEARDOWN:
		if (!tl_rx_in_kernel(c))
			rx_set(l, c, TL_RX_OFF);
		return; /* the caller cancels a recv in the kernel; END gives OFF */
	case RX_LOST:
		if (c->rx == TL_RX_OFF)
			rx_set(l, c, TL_RX_WANT);
		return;
	case RX_REVIVE:
		if (c->rx == TL_RX_ARMED && !c->dying && tl_rx_cancel(l, c, tl_rx_ud(c)) == 0) {
			rx_set(l, c, TL_RX_REARMING);
			c->probe.revived = 1;
			STAT_ADD(l, recv_revived, 1);
		}
		return;
	case RX_GONE:
		/* A cancel found no recv while one is armed here: the kernel
		 * lost it (a recv that ended on its own posted its END before
		 * the cancel's -ENOENT, so the state is no longer in the
		 * kernel). Taken after the probe's cancel and a teardown's,
		 * whose connection would otherwise wait for that END forever;
		 * a pause's or regroup's cancel has a recv the kernel still
		 * serves. */
		if (tl_rx_in_kernel(c) && (c->probe.revived || c->dying))
			rx_end_here(l, c, -ECANCELED);
		return;
	case RX_STUCK:
		/* A cancel found the recv (res 0) but its END never followed:
		 * the kernel may still hold it, so a second recv on the socket
		 * could split the stream between them. The connection ends
		 * instead (a dying one finishes). */
		if (tl_rx_in_kernel(c))
			rx_end_here(l, c, c->dying ? -ECANCELED : -EIO);
		return;
	}
}

#undef STAT_ADD
