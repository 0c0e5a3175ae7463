/* loop/cmdq.c - runs the commands Go sends: one handler per op. Every command
 * leaves the ring when it runs: sends (and a memory connection's injected
 * input) go to their connection's own queue (Go admits them against
 * MaxSendQueue before they enter the ring), so one connection whose peer
 * does not read, or whose input waits for the pump, never holds up
 * another's commands. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/loop.h"

#include <errno.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define PUB_ADD(p, f, n) __atomic_store_n(&(p)->f, (p)->f + (n), __ATOMIC_RELAXED)

int tl_cmdq_init(struct tl_cmdq *q, uint64_t size)
{
	void *r = mmap(NULL, sizeof(*q->r), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	void *b;

	memset(q, 0, sizeof(*q));
	if (r == MAP_FAILED)
		return -ENOMEM;
	q->r = r;
	b = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (b == MAP_FAILED)
		return -ENOMEM;
	q->r->buf = b;
	q->r->size = size;
	q->r->efd = -1;
	return 0;
}

void tl_cmdq_free(struct tl_cmdq *q)
{
	if (q->r) {
		if (q->r->buf)
			munmap(q->r->buf, q->r->size);
		munmap(q->r, sizeof(*q->r));
	}
	memset(q, 0, sizeof(*q));
}

/* cmd_conn returns the live connection a command addresses, or NULL when
 * it has ended (or the slot was reused: the generation differs). */
static struct tl_conn *cmd_conn(struct tl_loop *l, const struct tl_cmd *cmd)
{
	struct tl_conn *c;
	if (cmd->slot >= l->cfg.max_conns)
		return NULL;
	c = &l->conns[cmd->slot];
	if (c->gen != cmd->gen || c->state == TL_ST_IDLE)
		return NULL;
	return c;
}

static void cmd_dial(struct tl_loop *l, const struct tl_cmd *cmd)
{
	/* A dial still in the ring when the pool closes is dropped: started
	 * after shutdown_all, it would keep the loop (and tl_loop_stop) alive
	 * for as long as the connection lasts. Go's Close wakes its dialer. */
	if (l->shutting_down)
		return;
	if (cmd->slot < l->cfg.max_conns && l->conns[cmd->slot].state == TL_ST_IDLE && !l->conns[cmd->slot].dying) {
		if (cmd->flags & TL_CMDF_MEMORY)
			tl_life_open_memory(l, cmd->slot, cmd->gen);
		else
			tl_life_dial(l, cmd->slot, cmd->gen);
	}
}

static void cmd_inject(struct tl_loop *l, const struct tl_cmd *cmd, const uint8_t *payload)
{
	struct tl_conn *c = cmd_conn(l, cmd);

	if (c && c->fd < 0 && !c->dying) {
		/* an INJECT is a memory connection's completion, parsed at once */
		tl_sample_rx(l, c, 1);
		tl_sample_pt(c);
		if (tl_conn_inject(l, c, payload, cmd->len) == TL_FEED_STALL)
			tl_life_stall(l, c);
	} else if (c) {
		tl_pub_tx_retire(l, c, cmd->len); /* (input that will not be parsed, not a send) */
	}
}

static void cmd_close(struct tl_loop *l, struct tl_conn *c, const struct tl_cmd *cmd, const uint8_t *payload)
{
	if ((cmd->flags & TL_CMDF_IF_DIALING) && c->state >= TL_ST_OPEN)
		return; /* it opened first: Dial returns it after all */
	tl_life_stop_reconnect(c);
	if (c->dying) /* ending already (or its EventReconnecting waits for room): now final */
		return;
	if (c->refusing && !c->fail_err && (cmd->flags & TL_CMDF_IF_DIALING)) {
		/* Dial's context ended while a refusal waited for its body: the
		 * refusal is what happened, with the body bytes that came. */
		tl_conn_refusal_end(l, c);
		tl_life_after(l, c);
		return;
	}
	if (c->rc == TL_RC_BACKOFF) {
		tl_life_fail(l, c, TL_E_ABORTED, 0, 1006, "closed while waiting to reconnect"); /* as an Abort */
	} else if (c->fd < 0 && c->state == TL_ST_OPEN) {
		/* memory connection: nobody to shake hands with */
		c->close_code = cmd->code;
		tl_conn_close_step(c, TL_CLOSE_RCVD);
		tl_life_teardown(l, c);
	} else if (c->state == TL_ST_OPEN) {
		/* Every message accepted before the Close goes first; the close
		 * timeout bounds that drain and the wait for the server's close. */
		tl_conn_close_after_queue(l, c, cmd->code, payload, cmd->len);
		tl_life_after(l, c);
		if (c->dying)
			return;
		/* Submit it now: without a send in flight nothing else would, and
		 * the frame sat queued until the close timeout (conformance cases
		 * X.6, X.13). */
		tl_life_flush(l, c);
		tl_pub_set_state(l, c, TL_ST_CLOSING);
		tl_timer_set_deadline(l, c, tl_conn_close_timeout(l, c));
	} else if (c->state < TL_ST_OPEN) {
		tl_life_fail(l, c, TL_E_ABORTED, 0, 1006, "closed before the handshake completed"); /* as an Abort: no close frame, 1006 */
	}
}

/* cmd_frame queues a SEND, PING or PONG on its connection; it never
 * waits. A SEND that arrives before the upgrade completed (right after
 * DialAsync) waits in the connection's send queue for it. Go counted the
 * frame's units against the connection's queue, so a frame the connection
 * will not send (a ping before it is open, closing, failed) retires them
 * at once. */
static void cmd_frame(struct tl_loop *l, struct tl_conn *c, const struct tl_cmd *cmd, const uint8_t *payload)
{
	uint64_t units = cmd->op == TL_CMD_SEND ? cmd->len + ((cmd->flags & TL_CMDF_FIN) ? TL_UNIT_MSG : 0)
						: cmd->len + TL_CTRL_UNITS + TL_UNIT_MSG;
	/* Only a first dial queues sends for its open: after a reconnect
	 * policy's drop, a send that raced the gap is dropped (Go refuses
	 * sends during the gap), never sent on the next connection. */
	int early = cmd->op == TL_CMD_SEND && c->state < TL_ST_OPEN && !c->discard && !c->dying && !c->opens;

	if (!early && (c->state != TL_ST_OPEN || tl_conn_close_sent(c) || c->discard || c->send_errno)) {
		tl_pub_tx_drop(l, c, units);
		return;
	}
	if (cmd->op == TL_CMD_SEND) {
		int op = (cmd->flags & TL_CMDF_CONT) ? TL_OP_CONT : (cmd->flags & 0xf);
		if (tl_conn_send_data(l, c, op, !!(cmd->flags & TL_CMDF_FIN), payload, cmd->len, units) < 0)
			return;
		if (cmd->flags & TL_CMDF_FIN)
			PUB_ADD(&l->pub[c->slot], msgs_out, 1);
		PUB_ADD(&l->pub[c->slot], bytes_out, cmd->len);
	} else {
		/* Control frames go straight to the out buffer, between two data
		 * frames: a heartbeat does not wait behind queued data. */
		if (tl_conn_send_frame(l, c, cmd->op == TL_CMD_PING ? TL_OP_PING : TL_OP_PONG, 1, payload, cmd->len) < 0)
			return;
		if (c->fd < 0)
			tl_pub_tx_retire(l, c, units);
		else
			tl_conn_wbuf(c)->units += units;
	}
	/* A batch's frames collect until its last record: one write for all. */
	if (!(cmd->flags & TL_CMDF_MORE))
		tl_life_flush(l, c);
}

/* cmd_run dispatches one record. */
static void cmd_run(struct tl_loop *l, const struct tl_cmd *cmd, const uint8_t *payload)
{
	struct tl_conn *c;

	switch (cmd->op) {
	case TL_CMD_DIAL:
		cmd_dial(l, cmd);
		break;
	case TL_CMD_INJECT:
		cmd_inject(l, cmd, payload);
		break;
	case TL_CMD_CLOSE:
		if ((c = cmd_conn(l, cmd)) != NULL)
			cmd_close(l, c, cmd, payload);
		break;
	case TL_CMD_ABORT:
		/* At once: nothing queued for the connection is waited for. */
		if ((c = cmd_conn(l, cmd)) != NULL)
			tl_life_abort(l, c);
		break;
	case TL_CMD_DIRECT: {
		uint64_t units;
		if (cmd->len < sizeof(units))
			break;
		memcpy(&units, payload, sizeof(units));
		if ((c = cmd_conn(l, cmd)) != NULL) {
			if (tl_tx_direct_rest(l, c, cmd->code, payload + sizeof(units), cmd->len - sizeof(units), units))
				tl_life_maybe_finish(l, c);
			else
				tl_life_after(l, c);
		}
		break;
	}
	case TL_CMD_SEND:
	case TL_CMD_PING:
	case TL_CMD_PONG:
		if ((c = cmd_conn(l, cmd)) != NULL)
			cmd_frame(l, c, cmd, payload);
		break;
	default:
		return; /* unknown ops are skipped */
	}
	/* What the connection layer asked for (a failed frame's teardown, a
	 * flush) is done before the next command. */
	if (cmd->op != TL_CMD_DIAL && (c = cmd_conn(l, cmd)) != NULL && c->todo)
		tl_life_after(l, c);
}

int tl_cmdq_drain(struct tl_loop *l)
{
	struct tl_cmdq *q = &l->cmdq;
	struct tl_cmdring *r = q->r;
	int did = 0;

	if (q->head == q->tail_cache) {
		/* Acquire: the record bytes Go wrote before its release store of
		 * tail are visible once we see the tail. */
		q->tail_cache = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
		if (q->head == q->tail_cache)
			return 0;
	}
	while (q->head != q->tail_cache) {
		const struct tl_cmd *cmd = (const struct tl_cmd *)(r->buf + (q->head & (r->size - 1)));
		size_t rec;

		if (cmd->op == TL_CMD_PAD) {
			rec = sizeof(*cmd) + cmd->len; /* to the end of the ring */
		} else {
			cmd_run(l, cmd, (const uint8_t *)(cmd + 1));
			rec = sizeof(*cmd) + ((cmd->len + TL_CMD_ALIGN - 1) & ~(size_t)(TL_CMD_ALIGN - 1));
		}
		q->head += rec;
		did = 1;
		if (q->head == q->tail_cache)
			q->tail_cache = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
	}
	if (!did)
		return 0;
	/* Go may overwrite the records only after we are done with them
	 * (release). seq_cst: a producer waiting for room sets prod_waiting
	 * and then reads head; we store head and then read prod_waiting
	 * (Dekker), so one of us sees the other. */
	__atomic_store_n(&r->head, q->head, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&r->prod_waiting, __ATOMIC_SEQ_CST)) {
		__atomic_fetch_add(&r->space_seq, 1, __ATOMIC_SEQ_CST);
		syscall(SYS_futex, &r->space_seq, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
	}
	return did;
}

#undef PUB_ADD
