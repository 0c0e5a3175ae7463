/* fuzz_conn.c - the whole receive state machine (frame parser, reassembly,
 * UTF-8, control frames, close handshake, event emission) on a detached
 * loop: the input is server bytes for one memory connection, cut into runs
 * at fuzzer-chosen points, optionally with the TLS transport's hold
 * (tl_conn.rx_hold: a partial frame is left unconsumed and offered again
 * with more bytes). Every event must be well formed and every delivered
 * text message valid UTF-8; sanitizers catch the rest. The same input fed
 * again one byte per run (no hold) must give the same events: a one-byte
 * run never takes the parser's burst of whole small frames (feed_burst)
 * nor its whole-frame path, so this compares them with reassembly. With
 * bit 7 of the first byte set the first pass feeds each run as the
 * Decoder does (c->cur_q TL_CUR_CALLER: whole frames delivered in place)
 * from a scratch copy overwritten after each drain, so an event left
 * pointing into an earlier run changes the hash. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loop/loop.h"

static struct tl_loop *L;

/* the events of one pass: kind, code, err, payload (an error's detail
 * text aside: the same fault may be named differently by the whole-frame
 * check and by reassembly), hashed in order */
static uint64_t evhash;
static uint32_t evcount;

/* caller mode (see the top): the scratch run and its length */
static int caller;
static uint8_t scratch[1 << 20];
static size_t scratch_n;

/* feed is tl_conn_feed of p[0..n), in caller mode from the scratch. */
static int feed(struct tl_conn *c, const uint8_t *p, size_t n, size_t *used)
{
	int r;

	if (!caller || n > sizeof(scratch))
		return tl_conn_feed(L, c, p, n, used);
	memcpy(scratch, p, n);
	scratch_n = n;
	c->cur_q = TL_CUR_CALLER;
	r = tl_conn_feed(L, c, scratch, n, used);
	c->cur_q = -1;
	return r;
}

static void note(const struct tl_event *e)
{
	uint64_t h = evhash ^ ((uint64_t)e->kind << 56 | (uint64_t)e->code << 32 | (uint32_t)e->err);
	h *= 0x100000001b3ull;
	if (e->kind != TL_EV_ERROR) {
		for (uint32_t i = 0; i < e->len; i++)
			h = (h ^ e->ptr[i]) * 0x100000001b3ull;
		h ^= e->len;
	}
	evhash = h;
	evcount++;
}

static void drain(struct tl_loop *l, int *final)
{
	struct tl_evring *r = l->evq.r;
	uint64_t tail = l->evq.tail; /* single-threaded: no publish needed */
	for (uint64_t i = r->head; i < tail; i++) {
		const struct tl_event *e = &r->ev[i & r->mask];
		note(e);
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
	/* consumed: a caller's run may be reused now */
	memset(scratch, 0xa5, scratch_n);
	scratch_n = 0;
}

/* pass feeds data in runs of run bytes (hold: as the TLS transport) to a
 * fresh memory connection, then ends it. */
static void pass(const uint8_t *data, size_t size, size_t run, size_t hold);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint64_t h;
	uint32_t n;

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
	/* first byte: run length (1..64) used to cut the rest; bit 6: hold
	 * frames of up to 512 bytes as the TLS transport does */
	evhash = 0, evcount = 0;
	caller = data[0] >> 7;
	pass(data + 1, size - 1, (size_t)(data[0] & 63) + 1, data[0] & 64 ? 512 : 0);
	caller = 0;
	h = evhash, n = evcount;
	evhash = 0, evcount = 0;
	pass(data + 1, size - 1, 1, 0);
	if (h != evhash || n != evcount)
		abort(); /* the burst or whole-frame path disagrees with reassembly */
	return 0;
}

static void pass(const uint8_t *data, size_t size, size_t run, size_t hold)
{
	static uint32_t gen;
	struct tl_conn *c = &L->conns[0];
	int final = 0;
	size_t off = 0, want = run;
	int reoffer = 0;

	tl_life_open_memory(L, 0, ++gen);
	while (off < size && !c->dying && c->state != TL_ST_IDLE) {
		size_t n = size - off < want ? size - off : want, used = 0;
		c->rx_hold = hold;
		if (!reoffer)
			c->rx_held_ok = 0; /* as the TLS transport: a run not starting with the held frame */
		reoffer = 0;
		int r = feed(c, data + off, n, &used);
		c->rx_hold = 0;
		tl_life_after(L, c); /* what the parser asked of the loop (a close: teardown) */
		if (used > n)
			abort();
		want = run;
		if (r == 0 && used < n) {
			/* held: only with hold set, and only a frame that fits it */
			if (!hold || n - used > hold)
				abort();
			if (n == size - off) {
				drain(L, &final);
				break; /* the input ends inside the held frame: a cut stream */
			}
			want = n - used + run; /* offer it again with more bytes */
			reoffer = 1;
		}
		drain(L, &final);
		if (r == -1 && used == 0) {
			/* stalled with nothing consumed: the ring was drained above,
			 * so the next call must make progress */
			c->rx_hold = hold;
			r = feed(c, data + off, n, &used);
			c->rx_hold = 0;
			tl_life_after(L, c);
			drain(L, &final);
			if (r == -1 && used == 0 && c->pending == TL_PEND_NONE)
				abort();
		}
		off += used;
		if (r == -2)
			break;
	}
	/* end the connection whatever state it is in, as a pool close would */
	if (c->state != TL_ST_IDLE) {
		if (!c->fail_err && !tl_conn_close_rcvd(c))
			c->fail_err = TL_E_SHUTDOWN;
		tl_life_teardown(L, c);
		drain(L, &final);
		if (c->dying == TL_DYING_FINAL) {
			/* the final event waited for ring room, which the drain
			 * above made: publish it as the stall list's retry does */
			c->stalled = 0;
			c->on_stall_list = 0;
			L->stalled = NULL;
			tl_life_finish(L, c);
			drain(L, &final);
			if (c->dying != TL_DYING_NO)
				abort();
		}
	}
	L->stalled = NULL;
	L->timed = 0;
	c->deadline_ns = 0;
	c->out[0].len = c->out[1].len = 0;
}
