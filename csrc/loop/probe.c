/* loop/probe.c - the defence against a recv completion that never comes:
 * the sockets of silent recvs are polled now and then, a lost recv is
 * cancelled and re-armed, a stuck one ended (see tl_loop_probe_recvs). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/internal.h"

#include <poll.h>
#include <sys/socket.h>

/* probe_flush polls the n sockets of pf at once (no wait) and applies
 * what tl_loop_probe_recvs says to each, whose slot is in slot. */
static void probe_flush(struct tl_loop *l, struct pollfd *pf, const uint32_t *slot, uint32_t n)
{
	if (!n || poll(pf, n, 0) < 0)
		return; /* EINTR, ENOMEM: the next probe looks again */
	for (uint32_t k = 0; k < n; k++) {
		struct tl_conn *c = &l->conns[slot[k]];
		if (!(pf[k].revents & (POLLIN | POLLRDHUP | POLLERR | POLLHUP))) {
			c->probe.suspect = 0;
		} else if (!c->probe.suspect) {
			c->probe.suspect = 1; /* ready and silent once: look again next time */
		} else {
			c->probe.suspect = 0;
			tl_rx_step(l, c, RX_REVIVE, 0);
		}
	}
}

/* tl_loop_probe_recvs is the defence against a recv completion that never
 * comes. The kernel behaviour: on Linux 6.18, an IORING_OP_RECV with
 * IORING_RECV_MULTISHOT and a provided-buffer ring (bundles on or off;
 * ring flags SINGLE_ISSUER|DEFER_TASKRUN or none) sometimes never posts
 * its final CQE when the peer resets the TCP connection while the recv
 * is still draining the stream (one larger than the socket buffers, so
 * the reset comes while the client still reads). The ring's fdinfo still lists the
 * recv in its PollList (op=27) with no task work pending, the CQ is empty
 * and nothing overflowed, while the socket, closed by the reset, polls
 * ready: the wake-up for the reset was lost. Measured on loopback with
 * tests/peer_reset_test.go (TestPeerResetLostRecv, the probe off through
 * testhook.Knobs.NoRecvProbe): 9 lost ends in 12,472 sequential streams
 * of up to 5000 messages with the ring on the caller's Go thread
 * (Config.Tuning.InlineLoop), none in 8000 with it on the loop's own
 * thread, none in 190,000 streams of at most 400 messages (the reset
 * then finds the stream read). Without this probe such a connection
 * waits for its end for good.
 *
 * Every TL_PROBE_NS (busy or not), after running the
 * kernel's deferred work and reaping, it polls (one poll(2) per 64) the
 * sockets whose recv is armed and has neither completed nor been armed
 * since the last probe. A socket ready (data, an error, a hang-up) at two
 * probes in a row, with nothing between them, has lost its recv:
 * RX_REVIVE cancels it and the re-arm reads the socket again, as after a
 * regroup; a cancel that finds nothing ends it here (RX_GONE, which moves
 * the recv epoch on so a late completion of the lost recv is stale). Nothing
 * is lost: the socket keeps what the recv did not take. A recv whose
 * cancel came back (it found the recv) but whose END then never did, for
 * TL_PROBE_STUCK probes, is ended here too (RX_STUCK): the connection
 * fails with EIO, or finishes when it was closing, rather than wait for
 * good; the epoch moves on as for RX_GONE. Cost per probe: a
 * scan of the slots, io_uring_get_events and one poll(2) per 64 silent
 * recvs (an idle connection's is silent); nothing per message.
 * Metrics.RecvRevived counts revivals. Returns 1 when it reaped
 * completions. */
int tl_loop_probe_recvs(struct tl_loop *l)
{
	struct pollfd pf[64];
	uint32_t slot[64];
	uint32_t n = 0;
	int got;

	/* What the kernel completed so far counts first (probe.ticks). */
	if (loop_defers(l))
		io_uring_get_events(&l->ring);
	got = tl_loop_reap(l);
	for (uint32_t i = 0; i < l->cfg.max_conns; i++) {
		struct tl_conn *c = &l->conns[i];
		int quiet = c->probe.ticks == c->probe.mark;
		int silent = c->rx == TL_RX_ARMED && !c->dying && c->fd >= 0 && quiet;
		/* A cancel (a pause's, a regroup's, a revival's, a teardown's)
		 * found the recv, and no END since. Not after -EALREADY: a
		 * recv the kernel was running then may go on. */
		int waiting = tl_rx_in_kernel(c) && c->probe.cancel_hit && !c->cancel_inflight && quiet;
		c->probe.mark = c->probe.ticks;
		c->probe.stuck = waiting ? c->probe.stuck + 1 : 0;
		if (c->probe.stuck >= TL_PROBE_STUCK) {
			c->probe.stuck = 0;
			/* The kernel may still hold the recv, and with it the socket:
			 * closing the fd alone would send no FIN. The shutdown ends
			 * the connection on the wire (and such a recv, stale now). */
			if (c->fd >= 0)
				shutdown(c->fd, SHUT_RDWR);
			tl_rx_step(l, c, RX_STUCK, 0);
			tl_loop_recv_settle(l, c);
			continue;
		}
		if (!silent) {
			c->probe.suspect = 0;
			continue;
		}
		pf[n].fd = c->fd;
		pf[n].events = POLLIN | POLLRDHUP;
		pf[n].revents = 0;
		slot[n++] = i;
		if (n == 64) {
			probe_flush(l, pf, slot, n);
			n = 0;
		}
	}
	probe_flush(l, pf, slot, n);
	return got;
}
