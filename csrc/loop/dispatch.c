/* loop/dispatch.c - completions: every CQE the loop reaps goes to its
 * connection by its user_data (op, generation, slot; loop/uring.h), stale
 * ones only give their buffers back: recv (slots onto the connection's
 * queue, then the transport parses them), send (the rest of a short send,
 * then the next flush), connect (the next address, or TLS or the upgrade
 * request, or a proxy's handshake first), cancel. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/internal.h"
#include "transport/proxy.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

/* tl_loop_recv_settle moves c on after a recv completion (or the probe's ending
 * of a stuck recv): a dying connection may finish, a live one parses
 * what it has (and fails once its queue is parsed after an EOF or an
 * error), pauses when stalled, leaves the handshake group once open. */
void tl_loop_recv_settle(struct tl_loop *l, struct tl_conn *c)
{
	if (c->dying) {
		tl_life_maybe_finish(l, c);
		return;
	}
	if (!c->stalled)
		tl_life_drive(l, c);
	else if (c->eof)
		tl_life_stall(l, c);
	if (c->stalled && !c->dying)
		tl_rx_step(l, c, RX_PAUSE, 0);
	tl_rx_step(l, c, RX_REGROUP, 0);
}

static void on_recv(struct tl_loop *l, struct tl_conn *c, struct io_uring_cqe *cqe, int hs)
{
	int more = !!(cqe->flags & IORING_CQE_F_MORE);

#ifdef TL_DEBUG
	if (c->probe.debug_lose_end && !more && cqe->res == -ECANCELED) {
		c->probe.debug_lose_end = 0; /* a test's lost completion: the recv stays ARMED */
		return;
	}
#endif
	c->probe.ticks++;
	if (cqe->flags & IORING_CQE_F_BUFFER) {
		/* One buffer, or a bundle's several (tl_slots_take). */
		uint32_t last, n;
		uint32_t q = tl_slots_take(&l->slots, hs, cqe->flags >> IORING_CQE_BUFFER_SHIFT, cqe->res, &last, &n);
		if (cqe->res <= 0 || (c->discard && !tl_conn_watch_notify(c))) {
			if (cqe->res > 0 && c->discard && !c->dying) {
				tl_conn_late_input(c); /* after the server's close frame: the grace ends */
				if (c->todo)
					tl_life_after(l, c);
			}
			tl_slots_recycle_chain(&l->slots, q);
		} else {
			tl_sample_rx(l, c, !c->is_tls && !c->stalled && tl_rxq_empty(&c->rxq));
			tl_rxq_push_chain(&l->slots, &c->rxq, q, last, n);
			PUB_ADD(&l->pub[c->slot], wire_in, (uint64_t)cqe->res);
			STAT_ADD(l, wire_bytes, (uint64_t)cqe->res);
			c->last_rx_ns = l->now_ns; /* heartbeat: one store per completion */
		}
	}
	if (!more)
		tl_rx_step(l, c, RX_END, cqe->res);
	tl_loop_recv_settle(l, c);
}

static void on_send(struct tl_loop *l, struct tl_conn *c, int res)
{
	struct tl_outbuf *ob = &c->out[c->cur ^ 1];

	c->send_inflight = 0;
	if (res < 0) {
		tl_pub_tx_drop(l, c, ob->units);
		ob->units = 0;
		ob->len = 0;
		ob->replies = 0;
		c->sent_off = 0;
		if (!c->dying && c->state >= TL_ST_OPEN && !c->fail_err && !tl_conn_close_rcvd(c) && !c->send_errno) {
			/* The peer reset while we wrote (a pong racing its RST). What
			 * it sent before is still in our socket or slot queue,
			 * acknowledged: keep reading it (the recv ends with the same
			 * error or EOF, and tl_conn_on_eof fails the connection once the queue
			 * is parsed) rather than drop frames the server did send.
			 * Writes are dropped from here on; the close timeout bounds
			 * the wait. */
			c->send_errno = -res;
			tl_conn_tx_drop_all(l, c);
			if (!c->deadline_ns)
				tl_timer_set_deadline(l, c, tl_conn_close_timeout(l, c));
			return;
		}
		if (!c->dying) {
			c->eof = 1;
			c->eof_errno = -res;
			tl_life_fail(l, c, TL_E_LOST, -res, 1006, strerror(-res));
		}
		tl_life_maybe_finish(l, c);
		return;
	}
	PUB_ADD(&l->pub[c->slot], wire_out, (uint64_t)res);
	c->sent_off += (size_t)res;
	if (c->sent_off < ob->len && !c->dying) {
		/* Short send: the rest goes before anything newer (tl_life_flush
		 * resumes it if no SQE is free now). */
		tl_tx_submit(l, c, ob);
		return;
	}
	tl_pub_tx_retire(l, c, ob->units);
	tl_outbuf_reset(ob);
	c->sent_off = 0;
	if (c->dying) {
		tl_life_maybe_finish(l, c);
		return;
	}
	tl_life_flush(l, c);
	if (c->stalled) /* input may have waited for send space */
		l->stall_kick = 1;
}

static void on_connect(struct tl_loop *l, struct tl_conn *c, int res)
{
	int r;

	c->connect_inflight = 0;
	if (c->dying) {
		tl_life_maybe_finish(l, c);
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
			tl_life_start_connect(l, c, &d->alt[d->next_alt++]);
			return;
		}
		tl_life_fail(l, c, TL_E_DIAL, -res, 0, strerror(-res));
		return;
	}
	tl_rx_step(l, c, RX_ARM, 0);
	r = tl_proxy_start(l, c); /* through a proxy: its handshake first (tl_life_drive goes on) */
	if (r == 0)
		r = tl_life_session_start(l, c);
	tl_life_after(l, c);
	if (r < 0 || c->dying)
		return;
	tl_life_flush(l, c);
}

static void handle_cqe(struct tl_loop *l, struct io_uring_cqe *cqe)
{
	uint64_t ud = io_uring_cqe_get_data64(cqe);
	unsigned raw = tl_ud_op(ud), op = raw & TL_OPK_MASK;
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
	if (c->gen != gen || (c->state == TL_ST_IDLE && c->dying != TL_DYING_FINAL) ||
	    ((op == TL_OPK_RECV || op == TL_OPK_RECV_HS) && raw >> TL_OPK_EPOCH_SHIFT != c->rx_epoch)) {
		/* Stale: only buffers may need to go back (a bundle's all). */
		if (cqe->flags & IORING_CQE_F_BUFFER) {
			uint32_t last, n;
			tl_slots_recycle_chain(&l->slots, tl_slots_take(&l->slots, op == TL_OPK_RECV_HS,
									cqe->flags >> IORING_CQE_BUFFER_SHIFT,
									cqe->res, &last, &n));
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
		if (cqe->res == -ENOENT)
			tl_rx_step(l, c, RX_GONE, 0);
		else if (cqe->res == 0 && tl_rx_in_kernel(c) && c->probe.ticks == c->probe.cancel_ticks)
			/* Found, and nothing of that recv (an END, a re-arm) has come
			 * since: its END is due (tl_loop_probe_recvs). */
			c->probe.cancel_hit = 1;
		tl_life_maybe_finish(l, c);
		break;
	}
}

/* tl_loop_reap handles every completion in the CQ. Returns 1 when there was one. */
int tl_loop_reap(struct tl_loop *l)
{
	struct io_uring_cqe *cqes[TL_CQE_BATCH];
	unsigned n;
	int any = 0;

	while ((n = io_uring_peek_batch_cqe(&l->ring, cqes, TL_CQE_BATCH)) > 0) {
		for (unsigned i = 0; i < n; i++)
			handle_cqe(l, cqes[i]);
		io_uring_cq_advance(&l->ring, n);
		STAT_ADD(l, cqes, n);
		any = 1;
	}
	return any;
}
