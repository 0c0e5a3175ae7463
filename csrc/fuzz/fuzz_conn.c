/* fuzz_conn.c - the whole receive state machine (frame parser, reassembly,
 * UTF-8, control frames, close handshake, event emission) on a detached
 * loop: the input is server bytes for one memory connection, cut into runs
 * at fuzzer-chosen points. Every event must be well formed and every
 * delivered text message valid UTF-8; sanitizers catch the rest. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../loop.h"

static struct tl_loop *L;

static void drain(struct tl_loop *l, int *final)
{
	struct tl_evring *r = l->evq.r;
	uint64_t tail = l->evq.tail; /* single-threaded: no publish needed */
	for (uint64_t i = r->head; i < tail; i++) {
		const struct tl_event *e = &r->ev[i & r->mask];
		if (e->kind < TL_EV_OPEN || e->kind > TL_EV_ERROR)
			abort();
		if (e->len && !e->ptr)
			abort();
		if (e->kind == TL_EV_TEXT && !tl_utf8_valid(e->ptr, e->len))
			abort();
		if (e->len > l->cfg.max_message && e->kind <= TL_EV_BINARY)
			abort();
		if (e->flags & TL_EVF_FINAL)
			*final = 1;
	}
	__atomic_store_n(&r->head, tail, __ATOMIC_RELEASE);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint32_t gen;
	struct tl_conn *c;
	int final = 0;
	size_t off = 0;

	if (!L) {
		struct tl_config cfg = {
			.sq_entries = 8, .cq_entries = 16, .sq_thread_cpu = -1, .buf_size = 4096, .buf_count = 4,
			.loop_cpu = -1, .event_ring_size = 64, .arena_size = 1 << 20, .cmd_ring_size = 4096,
			.max_conns = 1, .max_message = 1 << 16, .handshake_timeout_ns = 1, .close_timeout_ns = 1,
			.max_send_queue = 1 << 20,
		};
		L = tl_loop_new_detached(&cfg);
		if (!L)
			abort();
	}
	if (size < 1)
		return 0;
	c = &L->conns[0];
	tl_life_open_memory(L, 0, ++gen);
	/* first byte: run length (1..64) used to cut the rest */
	size_t run = (size_t)(data[0] & 63) + 1;
	data++;
	size--;
	while (off < size && !c->dying && c->state != TL_ST_IDLE) {
		size_t n = size - off < run ? size - off : run, used = 0;
		int r = tl_conn_feed(L, c, data + off, n, &used);
		tl_life_after(L, c); /* what the parser asked of the loop (a close: teardown) */
		if (used > n)
			abort();
		drain(L, &final);
		if (r == -1 && used == 0) {
			/* stalled with nothing consumed: the ring was drained above,
			 * so the next call must make progress */
			r = tl_conn_feed(L, c, data + off, n, &used);
			tl_life_after(L, c);
			drain(L, &final);
			if (r == -1 && used == 0 && !c->open_pending && !c->msg_ready && !c->ctrl_ready)
				abort();
		}
		off += used;
		if (r == -2)
			break;
	}
	/* end the connection whatever state it is in, as a pool close would */
	if (c->state != TL_ST_IDLE) {
		if (!c->fail_err && !c->close_rcvd)
			c->fail_err = TL_E_SHUTDOWN;
		tl_life_teardown(L, c);
		drain(L, &final);
		while (c->final_pending) {
			c->stalled = 0;
			c->on_stall_list = 0;
			L->stalled = NULL;
			tl_life_teardown(L, c);
			drain(L, &final);
			break;
		}
	}
	L->stalled = NULL;
	L->timed = 0;
	c->deadline_ns = 0;
	c->out[0].len = c->out[1].len = 0;
	return 0;
}
