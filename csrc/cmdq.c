/* cmdq.c - runs the commands Go sends: one handler per op. A handler
 * returns CMD_DONE when the record may be dropped, or CMD_WAIT to leave it
 * at the head of the ring and stop draining (it runs again on a later
 * iteration, once what it waits for - send queue or event ring room - has
 * come back). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

enum { CMD_DONE = 0, CMD_WAIT = 1 };

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

static int cmd_dial(struct tl_loop *l, const struct tl_cmd *cmd)
{
	/* A dial still in the ring when the pool closes is dropped: started
	 * after shutdown_all, it would keep the loop (and tl_loop_stop) alive
	 * for as long as the connection lasts. Go's Close wakes its dialer. */
	if (l->shutting_down)
		return CMD_DONE;
	if (cmd->slot < l->cfg.max_conns && l->conns[cmd->slot].state == TL_ST_IDLE && !l->conns[cmd->slot].dying) {
		if (cmd->flags & TL_CMDF_MEMORY)
			tl_loop_open_memory(l, cmd->slot, cmd->gen);
		else
			tl_loop_dial(l, cmd->slot, cmd->gen);
	}
	return CMD_DONE;
}

static int cmd_inject(struct tl_loop *l, const struct tl_cmd *cmd, const uint8_t *payload)
{
	struct tl_conn *c = cmd_conn(l, cmd);

	if (c && c->fd < 0 && !c->dying) {
		size_t used = 0;
		int r;
		if (l->cmdq.inject_off == 0) /* an INJECT is a memory connection's completion, parsed at once */
			tl_loop_sample_rx(l, c, 1);
		tl_loop_sample_pt(c);
		r = tl_conn_feed(l, c, payload + l->cmdq.inject_off, cmd->len - l->cmdq.inject_off, &used);
		if (r == TL_FEED_STALL) {
			/* No room: run the rest of this command again once Go has
			 * pumped. The record stays as Go wrote it. */
			l->cmdq.inject_off += (uint32_t)used;
			return CMD_WAIT;
		}
		tl_loop_sample_end(c);
	}
	l->cmdq.inject_off = 0;
	return CMD_DONE;
}

static int cmd_close(struct tl_loop *l, struct tl_conn *c, const struct tl_cmd *cmd, const uint8_t *payload)
{
	if ((cmd->flags & TL_CMDF_IF_DIALING) && c->state >= TL_ST_OPEN)
		return CMD_DONE; /* it opened first: Dial returns it after all */
	if (c->fd < 0 && c->state == TL_ST_OPEN) {
		/* memory connection: nobody to shake hands with */
		c->close_code = cmd->code;
		c->close_rcvd = 1;
		tl_loop_teardown(l, c);
	} else if (c->state == TL_ST_OPEN) {
		tl_conn_send_close(l, c, cmd->code, payload, cmd->len);
		/* Submit it now: without a send in flight nothing else would, and
		 * the frame sat queued until the close timeout (conformance cases
		 * X.6, X.13). */
		tl_loop_flush(l, c);
		tl_loop_set_state(l, c, TL_ST_CLOSING);
		tl_loop_set_deadline(l, c, l->cfg.close_timeout_ns);
	} else if (c->state < TL_ST_OPEN) {
		tl_loop_fail(l, c, TL_E_ABORTED, 0, 0, "closed before the handshake completed");
	}
	return CMD_DONE;
}

/* cmd_frame queues a SEND, PING or PONG. A frame that would push the
 * connection past max_send_queue waits at the head of the ring until that
 * connection's sends complete. */
static int cmd_frame(struct tl_loop *l, struct tl_conn *c, const struct tl_cmd *cmd, const uint8_t *payload)
{
	size_t queued = c->out[0].len + c->out[1].len;

	if (c->state != TL_ST_OPEN || c->close_sent || c->discard)
		return CMD_DONE;
	if (queued + cmd->len > l->cfg.max_send_queue && queued > 0)
		return CMD_WAIT;
	if (cmd->op == TL_CMD_SEND) {
		int op = (cmd->flags & TL_CMDF_CONT) ? TL_OP_CONT : (cmd->flags & 0xf);
		tl_conn_send_frame(l, c, op, !!(cmd->flags & TL_CMDF_FIN), payload, cmd->len);
		if (cmd->flags & TL_CMDF_FIN)
			PUB_ADD(&l->pub[c->slot], msgs_out, 1);
		PUB_ADD(&l->pub[c->slot], bytes_out, cmd->len);
	} else {
		tl_conn_send_frame(l, c, cmd->op == TL_CMD_PING ? TL_OP_PING : TL_OP_PONG, 1, payload, cmd->len);
	}
	tl_loop_flush(l, c);
	return CMD_DONE;
}

/* cmd_run dispatches one record. */
static int cmd_run(struct tl_loop *l, const struct tl_cmd *cmd, const uint8_t *payload)
{
	struct tl_conn *c;

	switch (cmd->op) {
	case TL_CMD_DIAL:
		return cmd_dial(l, cmd);
	case TL_CMD_INJECT:
		return cmd_inject(l, cmd, payload);
	case TL_CMD_CLOSE:
		c = cmd_conn(l, cmd);
		return c ? cmd_close(l, c, cmd, payload) : CMD_DONE;
	case TL_CMD_ABORT:
		/* At once: nothing queued for the connection is waited for. */
		c = cmd_conn(l, cmd);
		if (c)
			tl_loop_abort(l, c);
		return CMD_DONE;
	case TL_CMD_SEND:
	case TL_CMD_PING:
	case TL_CMD_PONG:
		c = cmd_conn(l, cmd);
		return c ? cmd_frame(l, c, cmd, payload) : CMD_DONE;
	}
	return CMD_DONE; /* unknown ops are skipped */
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
			if (cmd_run(l, cmd, (const uint8_t *)(cmd + 1)) == CMD_WAIT)
				break;
			rec = sizeof(*cmd) + ((cmd->len + TL_CMD_ALIGN - 1) & ~(size_t)(TL_CMD_ALIGN - 1));
		}
		q->head += rec;
		did = 1;
		if (q->head == q->tail_cache)
			q->tail_cache = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
	}
	/* Release: Go may overwrite the records only after we are done with
	 * them. */
	__atomic_store_n(&r->head, q->head, __ATOMIC_RELEASE);
	return did;
}

#undef PUB_ADD
