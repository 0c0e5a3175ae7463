/* loop/decoder.c - the synchronous decoder (decoder_linux.go, which tests
 * and the bench reach as testhook.Decoder): the frame parser, event ring
 * and arena of a detached loop with one memory connection, fed on the
 * caller's thread. No thread, socket or io_uring. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/loop.h"

struct tl_loop *tl_decoder_new(uint64_t max_message, uint32_t ring_size, uint64_t arena_size)
{
	struct tl_config cfg = {
		.sq_entries = 8, .cq_entries = 16, .sq_thread_cpu = -1, .buf_size = 4096, .buf_count = 4,
		.loop_cpu = -1, .event_ring_size = ring_size, .arena_size = arena_size, .cmd_ring_size = 4096,
		.max_conns = 1, .max_message = max_message, .handshake_timeout_ns = 1, .close_timeout_ns = 1,
		.max_send_queue = 1 << 20,
	};
	struct tl_loop *l = tl_loop_new_detached(&cfg);
	if (!l)
		return NULL;
	tl_life_open_memory(l, 0, 1);
	return l;
}

int tl_decoder_feed(struct tl_loop *l, const uint8_t *p, size_t n, size_t *used)
{
	struct tl_conn *c = &l->conns[0];
	int r;

	*used = 0;
	if (c->state != TL_ST_OPEN)
		return -2;
	/* In place: whole frames' events point into p, which the Go side
	 * keeps (pinned) until it has consumed every event of this call. */
	c->cur_q = TL_CUR_CALLER;
	r = tl_conn_feed(l, c, p, n, used);
	c->cur_q = -1;
	tl_life_after(l, c); /* a close frame ends the memory connection */
	l->evq.r->tail = l->evq.tail; /* same thread: no publish protocol needed */
	l->evq.published = l->evq.tail;
	return r;
}

void tl_decoder_free(struct tl_loop *l)
{
	tl_loop_free(l);
}
