/* test_outcomes.c - the contract between the WebSocket state machine and
 * the loop (docs/ARCHITECTURE.md, "The C core"): ws/ reports what only
 * the loop can do in c->todo (TL_DO_*) and does not do it; tl_life_after
 * acts on it. Driven on a detached loop (no thread, no io_uring) through
 * the real parser, with real frames. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "loop/loop.h"
#include "codec/ws.h"
#include "check.h"

static struct tl_loop *new_loop(void)
{
	struct tl_config cfg = {
		.sq_entries = 8, .cq_entries = 16, .sq_thread_cpu = -1, .buf_size = 4096, .buf_count = 4,
		.loop_cpu = -1, .event_ring_size = 64, .arena_size = 1 << 20, .cmd_ring_size = 4096,
		.max_conns = 2, .max_message = 1 << 16, .handshake_timeout_ns = 1000000000ull,
		.close_timeout_ns = 1000000000ull, .max_send_queue = 1 << 20,
	};
	struct tl_loop *l = tl_loop_new_detached(&cfg);
	CHECK(l != NULL);
	return l;
}

/* ev returns the i-th event appended so far. */
static const struct tl_event *ev(struct tl_loop *l, uint64_t i) { return &l->evq.events[i & l->evq.mask]; }

/* frame writes an unmasked server frame; returns its length. */
static size_t frame(uint8_t *out, int op, const void *p, size_t n)
{
	out[0] = (uint8_t)(0x80 | op);
	out[1] = (uint8_t)n; /* n < 126 */
	memcpy(out + 2, p, n);
	return 2 + n;
}

/* A close frame on a memory connection: the parser asks for the teardown
 * and publishes nothing final itself; the loop's tl_life_after ends it. */
static void test_close_requests_teardown(void)
{
	struct tl_loop *l = new_loop();
	struct tl_conn *c = &l->conns[0];
	uint8_t buf[64], cl[4] = {0x03, 0xe8, 'o', 'k'}; /* 1000 "ok" */
	size_t n, used = 0;

	tl_life_open_memory(l, 0, 7);
	CHECK_EQ(l->evq.tail, 1);
	CHECK_EQ(ev(l, 0)->kind, TL_EV_OPEN);

	n = frame(buf, TL_OP_TEXT, "hi", 2);
	CHECK_EQ(tl_conn_feed(l, c, buf, n, &used), TL_FEED_OK);
	CHECK_EQ(used, n);
	CHECK_EQ(c->todo, 0); /* a data frame needs nothing from the loop */
	CHECK_EQ(l->evq.tail, 2);
	CHECK_EQ(ev(l, 1)->kind, TL_EV_TEXT);
	CHECK_EQ(ev(l, 1)->len, 2);
	CHECK(memcmp(ev(l, 1)->ptr, "hi", 2) == 0);

	n = frame(buf, TL_OP_CLOSE, cl, sizeof(cl));
	CHECK_EQ(tl_conn_feed(l, c, buf, n, &used), TL_FEED_DEAD);
	CHECK(c->todo & TL_DO_TEARDOWN);
	CHECK(tl_conn_ending(c));
	CHECK_EQ(c->dying, 0);              /* requested, not done: conn.c cannot */
	CHECK_EQ(c->state, TL_ST_CLOSING); /* published through pub.c */
	CHECK_EQ(l->evq.tail, 2);          /* no final event yet */

	tl_life_after(l, c);
	CHECK_EQ(c->todo, 0);
	CHECK_EQ(c->state, TL_ST_IDLE);
	CHECK_EQ(l->evq.tail, 3);
	CHECK_EQ(ev(l, 2)->kind, TL_EV_CLOSE);
	CHECK_EQ(ev(l, 2)->code, 1000);
	CHECK(ev(l, 2)->flags & TL_EVF_FINAL);
	CHECK_EQ(ev(l, 2)->len, 2);
	CHECK(memcmp(ev(l, 2)->ptr, "ok", 2) == 0);
	CHECK_EQ(l->live, 0);
	tl_loop_free(l);
}

/* A protocol error: tl_conn_fail records the cause and requests the
 * teardown; input after it is dropped; the final event is the error. */
static void test_protocol_error(void)
{
	struct tl_loop *l = new_loop();
	struct tl_conn *c = &l->conns[1];
	uint8_t buf[64];
	size_t n, used = 0;

	tl_life_open_memory(l, 1, 3);
	buf[0] = 0x83; /* FIN, reserved opcode 3 */
	buf[1] = 0;
	n = 2 + frame(buf + 2, TL_OP_TEXT, "late", 4);
	CHECK_EQ(tl_conn_feed(l, c, buf, n, &used), TL_FEED_DEAD);
	CHECK_EQ(used, n); /* the rest does not count */
	CHECK(c->todo & TL_DO_TEARDOWN);
	CHECK_EQ(c->fail_err, TL_E_PROTOCOL);
	CHECK_EQ(l->evq.tail, 1); /* only EventOpen: "late" was not published */
	CHECK_EQ(tl_conn_feed(l, c, buf + 2, n - 2, &used), TL_FEED_OK); /* discarded */
	CHECK_EQ(l->evq.tail, 1);

	tl_life_after(l, c);
	CHECK_EQ(l->evq.tail, 2);
	CHECK_EQ(ev(l, 1)->kind, TL_EV_ERROR);
	CHECK_EQ(ev(l, 1)->err, TL_E_PROTOCOL);
	CHECK_EQ(ev(l, 1)->code, 1002);
	CHECK_EQ(ev(l, 1)->slot, 1);
	CHECK_EQ(ev(l, 1)->gen, 3);
	CHECK(ev(l, 1)->flags & TL_EVF_FINAL);
	tl_loop_free(l);
}

/* A failure on an open socket connection: conn.c queues the close frame
 * in the connection's out buffer, arms the close deadline and asks for a
 * flush; it submits nothing itself (a detached loop has no ring: a
 * submission here would crash). */
static void test_fail_open_requests_flush(void)
{
	struct tl_loop *l = new_loop();
	struct tl_conn *c = &l->conns[0];
	int sv[2];
	uint8_t pl[2];
	const uint8_t *o;

	CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
	tl_life_open_memory(l, 0, 1);
	c->fd = sv[0]; /* a socket connection now, as far as conn.c can tell */
	tl_conn_fail(l, c, TL_E_TOO_BIG, 0, 1009, "too big");
	CHECK_EQ(c->todo, TL_DO_FLUSH);
	CHECK_EQ(c->state, TL_ST_CLOSING);
	CHECK(tl_conn_close_sent(c));
	CHECK(c->deadline_ns != 0);
	CHECK_EQ(l->timed, 1);
	CHECK_EQ(c->send_inflight, 0);
	/* the masked close frame with code 1009 waits in the out buffer:
	 * FIN|close, MASK|2, the key, the masked code */
	o = c->out[c->cur].p;
	CHECK_EQ(c->out[c->cur].len, 8);
	CHECK_EQ(o[0], 0x80 | TL_OP_CLOSE);
	CHECK_EQ(o[1], 0x80 | 2);
	tl_ws_mask(pl, o + 6, 2, o + 2, 0);
	CHECK_EQ((pl[0] << 8) | pl[1], 1009);
	CHECK_EQ(c->out[c->cur].replies, 8); /* counted as the loop's own reply */
	CHECK(strcmp(l->pub[0].detail, "too big") == 0);

	/* A second cause does not replace the first; the close is not
	 * queued twice; now the loop is asked to tear down. */
	c->todo = 0;
	tl_conn_fail(l, c, TL_E_NOMEM, 0, 1011, "later");
	CHECK_EQ(c->todo, TL_DO_TEARDOWN);
	CHECK_EQ(c->fail_err, TL_E_TOO_BIG);
	CHECK_EQ(c->out[c->cur].len, 8);

	close(sv[0]);
	close(sv[1]);
	c->fd = -1;
	tl_life_after(l, c);
	CHECK_EQ(c->state, TL_ST_IDLE);
	CHECK_EQ(ev(l, l->evq.tail - 1)->kind, TL_EV_ERROR);
	CHECK_EQ(ev(l, l->evq.tail - 1)->code, 1009);
	CHECK_EQ(l->timed, 0); /* the teardown cleared the deadline */
	tl_loop_free(l);
}

int main(void)
{
	test_close_requests_teardown();
	test_protocol_error();
	test_fail_open_requests_flush();
	printf("test_outcomes: %lu checks passed\n", check_passed);
	return 0;
}
