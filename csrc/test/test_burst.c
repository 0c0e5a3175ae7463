/* test_burst.c - the parser's burst of whole small data frames
 * (feed_burst in conn.c, tl_evq_run in evq.h) against its general path.
 * A run of one byte never takes the burst (it needs a whole frame of at
 * least two bytes), so the same server bytes fed whole, in random cuts
 * and one byte at a time must give the same events: kinds, payloads,
 * close and error codes, final flags. Then the bounds the burst computes
 * up front: event ring room, the arena's wrap, a connection's share of
 * the ring (conn_held), max_message, invalid UTF-8 in the middle of a
 * burst. Detached loop, one memory connection, single-threaded (as the
 * Decoder and fuzz_conn drive it). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loop/loop.h"
#include "check.h"
#include "frames.h"

/* the event log of one pass: every event as kind, flags, code, err, len,
 * payload bytes */
struct evlog {
	uint8_t *p;
	size_t n, cap;
	int events, final;
};

static void log_put(struct evlog *g, const void *p, size_t n)
{
	if (g->n + n > g->cap) {
		g->cap = (g->n + n) * 2 + 4096;
		g->p = realloc(g->p, g->cap);
		CHECK(g->p != NULL);
	}
	memcpy(g->p + g->n, p, n);
	g->n += n;
}

/* drain moves the events appended so far into g and releases them (head),
 * as the pump would. */
static void drain(struct tl_loop *l, struct evlog *g)
{
	struct tl_evring *r = l->evq.r;
	for (uint64_t i = r->head; i != l->evq.tail; i++) {
		const struct tl_event *e = &r->ev[i & r->mask];
		uint8_t hdr[4] = {e->kind, e->flags, (uint8_t)(e->code >> 8), (uint8_t)e->code};
		CHECK(e->kind >= TL_EV_OPEN && e->kind <= TL_EV_ERROR);
		CHECK(e->len == 0 || e->ptr != NULL);
		log_put(g, hdr, sizeof(hdr));
		log_put(g, &e->err, sizeof(e->err));
		/* an error's detail text may name the same fault differently
		 * (a whole frame's check vs reassembly's): cause and code only */
		uint32_t len = e->kind == TL_EV_ERROR ? 0 : e->len;
		log_put(g, &len, sizeof(len));
		if (len)
			log_put(g, e->ptr, len);
		g->events++;
		if (e->flags & TL_EVF_FINAL)
			g->final = 1;
	}
	__atomic_store_n(&r->head, l->evq.tail, __ATOMIC_RELEASE);
}

static struct tl_loop *new_loop(uint32_t ev_size, uint64_t arena, uint64_t max_message)
{
	struct tl_config cfg = {
		.sq_entries = 8, .cq_entries = 16, .sq_thread_cpu = -1, .buf_size = 4096, .buf_count = 4,
		.loop_cpu = -1, .event_ring_size = ev_size, .arena_size = arena, .cmd_ring_size = 4096,
		.max_conns = 2, .max_message = max_message, .handshake_timeout_ns = 1, .close_timeout_ns = 1,
		.max_send_queue = 1 << 20, .conn_max_events = 1u << 30, .conn_max_bytes = 1ull << 40,
	};
	struct tl_loop *l = tl_loop_new_detached(&cfg);
	CHECK(l != NULL);
	return l;
}

/* end tears the connection down (as a pool close) unless it ended, and
 * drains its last events into g. */
static void end(struct tl_loop *l, struct tl_conn *c, struct evlog *g)
{
	if (c->state != TL_ST_IDLE) {
		if (!c->fail_err && !tl_conn_close_rcvd(c))
			c->fail_err = TL_E_SHUTDOWN;
		tl_life_teardown(l, c);
	}
	drain(l, g);
	l->stalled = NULL;
	l->timed = 0;
	c->deadline_ns = 0;
	c->out[0].len = c->out[1].len = 0;
}

/* caller_mode makes feed_cut feed each run as the Decoder does
 * (tl_decoder_feed): from a scratch copy, with c->cur_q TL_CUR_CALLER, so
 * whole frames are delivered in place, pointing into the scratch; after
 * each drain the scratch is overwritten, so an event that kept a pointer
 * into an earlier run would log the wrong bytes. */
static int caller_mode;

/* feed_cut feeds wire[0..n) to a fresh memory connection in runs whose
 * lengths come from cut (cut(i) for the i-th run), draining after each
 * call; a stalled call (ring or arena full) is drained and the rest of
 * its run offered again. Returns the log. */
static struct evlog feed_cut(struct tl_loop *l, const uint8_t *wire, size_t n, size_t (*cut)(unsigned))
{
	static uint8_t scratch[1 << 21];
	static uint32_t gen;
	struct tl_conn *c = &l->conns[0];
	struct evlog g = {0};
	size_t off = 0;
	unsigned i = 0;

	tl_life_open_memory(l, 0, ++gen);
	drain(l, &g);
	while (off < n && !c->dying && c->state != TL_ST_IDLE) {
		size_t run = cut(i++), k = n - off < run ? n - off : run;
		for (int spins = 0; k; spins++) {
			size_t used = 0;
			int r;
			if (caller_mode) {
				CHECK(k <= sizeof(scratch));
				memcpy(scratch, wire + off, k);
				c->cur_q = TL_CUR_CALLER;
				r = tl_conn_feed(l, c, scratch, k, &used);
				c->cur_q = -1;
			} else {
				r = tl_conn_feed(l, c, wire + off, k, &used);
			}
			tl_life_after(l, c);
			drain(l, &g);
			if (caller_mode)
				memset(scratch, 0xa5, k);
			CHECK(used <= k);
			off += used;
			k -= used;
			if (r == TL_FEED_DEAD || c->dying || c->state == TL_ST_IDLE)
				break;
			CHECK(r == TL_FEED_STALL || k == 0); /* no hold set: a run is taken whole */
			CHECK(spins < 100000);
		}
		if (c->dying || c->state == TL_ST_IDLE)
			break;
	}
	end(l, c, &g);
	return g;
}

static size_t cut_whole(unsigned i)
{
	(void)i;
	return SIZE_MAX;
}
static size_t cut_one(unsigned i)
{
	(void)i;
	return 1;
}
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static size_t cut_random(unsigned i)
{
	(void)i;
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return 1 + rng % 300;
}


/* same feeds wire whole, in random cuts and byte by byte, each copied
 * into the arena and in place from the caller's buffer (caller_mode), and
 * checks the six logs are equal; returns the whole-run log (caller
 * frees). */
static struct evlog same(struct tl_loop *l, const uint8_t *wire, size_t n, const char *what)
{
	struct evlog a = feed_cut(l, wire, n, cut_whole);
	struct evlog b = feed_cut(l, wire, n, cut_random);
	struct evlog c = feed_cut(l, wire, n, cut_one);
	struct evlog in[3];
	caller_mode = 1;
	in[0] = feed_cut(l, wire, n, cut_whole);
	in[1] = feed_cut(l, wire, n, cut_random);
	in[2] = feed_cut(l, wire, n, cut_one);
	caller_mode = 0;
	CHECK_CTX(what);
	CHECK_ROW_EQ(a.events, c.events);
	CHECK_ROW_EQ(b.events, c.events);
	CHECK_ROW(a.n == c.n && memcmp(a.p, c.p, a.n) == 0);
	CHECK_ROW(b.n == c.n && memcmp(b.p, c.p, b.n) == 0);
	for (int i = 0; i < 3; i++) {
		CHECK_ROW_EQ(in[i].events, c.events);
		CHECK_ROW(in[i].n == c.n && memcmp(in[i].p, c.p, c.n) == 0);
		free(in[i].p);
	}
	free(b.p);
	free(c.p);
	return a;
}

/* last_event returns the kind and code of the last event of a log. */
static void last_event(const struct evlog *g, uint8_t *kind, uint16_t *code)
{
	size_t off = 0, last = 0;
	while (off < g->n) {
		uint32_t len;
		last = off;
		memcpy(&len, g->p + off + 8, 4);
		off += 12 + len;
	}
	*kind = g->p[last];
	*code = (uint16_t)(g->p[last + 2] << 8 | g->p[last + 3]);
}

/* A feed of every shape the burst must take or leave: small text and
 * binary frames, empty ones, 125/126 bytes, 16-bit lengths (one not
 * minimal), a 64-bit length, pings and a pong between bursts, a
 * fragmented message with a ping inside, non-ASCII text; then each
 * failure the burst must leave to the general path at a frame in the
 * middle of a burst: invalid UTF-8 (1007), a frame over max_message
 * (1009), RSV bits (1002), a masked frame (1002), a new message inside a
 * fragmented one (1002), a close frame. */
static void test_equivalence(void)
{
	static uint8_t wire[1 << 21], pl[1 << 17];
	struct tl_loop *l = new_loop(1 << 16, 1 << 22, 1 << 17);
	struct tl_loop *small = new_loop(1 << 16, 1 << 22, 1000);
	uint8_t kind;
	uint16_t code;
	size_t n = 0;

	for (size_t i = 0; i < sizeof(pl); i++)
		pl[i] = (uint8_t)('a' + i % 26);
	for (int i = 0; i < 3000; i++) {
		char msg[64];
		int len = snprintf(msg, sizeof(msg), "{\"id\":%d}", i);
		uint64_t v = (uint64_t)i;
		/* one frame of each shape in every 23 messages (row i % 23) */
		static const struct {
			int fin, op, len16;
			size_t len; /* bytes of pl; row 6 is overridden below */
		} shapes[] = {
			{1, TL_OP_PING, 0, 1},     {1, TL_OP_BINARY, 0, 0}, {1, TL_OP_TEXT, 0, 125},
			{1, TL_OP_BINARY, 0, 126}, {1, TL_OP_TEXT, 1, 5}, /* 16-bit form, not minimal */
			{1, TL_OP_BINARY, 0, 1000}, {1, TL_OP_BINARY, 0, 70000}, /* 64-bit length */
			{1, TL_OP_PONG, 0, 0},     {1, TL_OP_TEXT, 0, 0},
		};
		int row = i % 23;
		if (row == 7) {
			/* a fragmented message with a ping between its frames */
			n += test_frame(wire + n, 0, TL_OP_TEXT, msg, 3, 0);
			n += test_frame(wire + n, 1, TL_OP_PING, "in", 2, 0);
			n += test_frame(wire + n, 1, TL_OP_CONT, msg + 3, (size_t)len - 3, 0);
		} else if (row == 8) {
			n += test_frame(wire + n, 1, TL_OP_TEXT, "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 15, 0);
		} else if (row < 11) {
			int k = row < 7 ? row : row - 2;
			size_t plen = shapes[k].len;
			if (row == 5)
				plen += (size_t)i % 700;
			if (row == 6 && i >= 200)
				plen = 300; /* a few 64-bit lengths, then 16-bit ones */
			n += test_frame(wire + n, shapes[k].fin, shapes[k].op, pl, plen, shapes[k].len16);
		} else if (i % 3 == 0) {
			n += test_frame(wire + n, 1, TL_OP_BINARY, &v, 8, 0);
		} else {
			n += test_frame(wire + n, 1, TL_OP_TEXT, msg, (size_t)len, 0);
		}
	}
	size_t base = n;
	struct evlog g = same(l, wire, n, "mixed stream, clean close by teardown");
	CHECK(g.events > 3000 && g.final);
	free(g.p);

	/* the same stream, then a close frame with a reason: 1000 echoed */
	n = base + test_frame(wire + base, 1, TL_OP_CLOSE, "\x03\xe8" "bye", 5, 0);
	n += test_frame(wire + n, 1, TL_OP_TEXT, "after", 5, 0); /* ignored */
	g = same(l, wire, n, "close frame after a burst");
	last_event(&g, &kind, &code);
	CHECK(kind == TL_EV_CLOSE && code == 1000);
	free(g.p);

	static const struct {
		const char *what;
		uint8_t bad[8];
		size_t len;
		uint16_t code;
	} fails[] = {
		{"invalid UTF-8 in a text frame", {0x81, 3, 0xed, 0xa0, 0x80}, 5, 1007},
		{"a text frame ending inside a sequence", {0x81, 2, 'a', 0xc3}, 4, 1007},
		{"over max_message (16-bit form)", {0x82, 126, 0x03, 0xe9}, 4, 1009}, /* 1001 > 1000 */
		{"RSV1 on a small binary frame", {0xc2, 1, 'x'}, 3, 1002},
		{"a masked frame", {0x82, 0x81, 1, 2, 3, 4, 'x'}, 7, 1002},
		{"a continuation without a message", {0x80, 1, 'x'}, 3, 1002},
		{"a reserved opcode", {0x83, 1, 'x'}, 3, 1002},
	};
	for (size_t f = 0; f < sizeof(fails) / sizeof(fails[0]); f++) {
		/* the bad frame after the burst's first 40 frames, more good
		 * frames after it (never delivered) */
		size_t m = 0;
		for (int i = 0; i < 40; i++)
			m += test_frame(wire + m, 1, TL_OP_BINARY, pl, 8, 0);
		memcpy(wire + m, fails[f].bad, fails[f].len);
		m += fails[f].len;
		if (fails[f].code == 1009) {
			memset(wire + m, 0, 1001);
			m += 1001;
		}
		for (int i = 0; i < 40; i++)
			m += test_frame(wire + m, 1, TL_OP_TEXT, "late", 4, 0);
		g = same(small, wire, m, fails[f].what);
		last_event(&g, &kind, &code);
		CHECK_ROW(kind == TL_EV_ERROR && code == fails[f].code && g.final);
		CHECK_ROW_EQ(g.events, 1 + 40 + 1); /* open, the 40 frames, the error */
		free(g.p);
	}
	{
		/* a new text message inside a fragmented one: the burst is not
		 * entered while a message is under way */
		size_t m = 0;
		m += test_frame(wire + m, 0, TL_OP_BINARY, pl, 4, 0);
		for (int i = 0; i < 10; i++)
			m += test_frame(wire + m, 1, TL_OP_TEXT, "x", 1, 0);
		g = same(l, wire, m, "a new message inside a fragmented one");
		last_event(&g, &kind, &code);
		CHECK_ROW(kind == TL_EV_ERROR && code == 1002 && g.events == 2);
		free(g.p);
	}
	tl_loop_free(l);
	tl_loop_free(small);
}

/* The room the burst computes up front: an event ring of 8 (the burst
 * stops at it, the connection stalls, the rest follows after each
 * drain), an arena of 4 KiB that wraps many times under a copied burst;
 * every message arrives, in order, with its bytes. */
static void test_room(void)
{
	static uint8_t wire[1 << 20];
	uint32_t sizes[] = {8, 64};
	for (int s = 0; s < 2; s++) {
		struct tl_loop *l = new_loop(sizes[s], 4096, 1 << 10);
		size_t n = 0;
		for (int i = 0; i < 5000; i++) {
			uint8_t v[200];
			size_t len = (size_t)(i * 7) % sizeof(v);
			for (size_t j = 0; j < len; j++)
				v[j] = (uint8_t)(i + j) & 0x7f;
			n += test_frame(wire + n, 1, i % 2 ? TL_OP_TEXT : TL_OP_BINARY, v, len, 0);
		}
		struct evlog g = same(l, wire, n, sizes[s] == 8 ? "event ring of 8, arena of 4 KiB" : "ring 64");
		CHECK_EQ(g.events, 1 + 5000 + 1);
		/* payloads in order */
		size_t off = 0;
		int i = -1;
		while (off < g.n) {
			uint32_t len;
			memcpy(&len, g.p + off + 8, 4);
			if (i >= 0 && i < 5000) {
				CHECK_EQ(g.p[off], i % 2 ? TL_EV_TEXT : TL_EV_BINARY);
				CHECK_EQ(len, (uint32_t)((size_t)(i * 7) % 200));
				for (uint32_t j = 0; j < len; j++)
					CHECK(g.p[off + 12 + j] == (uint8_t)((i + j) & 0x7f));
			}
			off += 12 + len;
			i++;
		}
		free(g.p);
		tl_loop_free(l);
	}
}

/* A connection's share of the ring (conn_held): with counting on and
 * another connection light, a burst stops at conn_max_events pending
 * events and at conn_max_bytes pending bytes, as the per-message check
 * did: the feed stalls with exactly the share pending, and goes on once
 * the pump passed them. */
static void test_share(void)
{
	static uint8_t wire[1 << 16], pl[400];
	struct tl_loop *l = new_loop(1 << 12, 1 << 20, 1 << 16);
	struct tl_conn *c = &l->conns[0];
	struct evlog g = {0};
	size_t n = 0, off = 0, used;
	int r;

	l->cfg.conn_max_events = 10;
	l->cfg.conn_max_bytes = 1000;
	for (int i = 0; i < 100; i++)
		n += test_frame(wire + n, 1, TL_OP_BINARY, pl, 8, 0);
	n += test_frame(wire + n, 1, TL_OP_BINARY, pl, 400, 0);
	n += test_frame(wire + n, 1, TL_OP_BINARY, pl, 400, 0);
	n += test_frame(wire + n, 1, TL_OP_BINARY, pl, 400, 0);
	tl_life_open_memory(l, 0, 1);
	drain(l, &g);
	tl_evq_set_counting(&l->evq, 1);
	l->fair_light = 1; /* another connection would wait behind this one */
	for (int round = 0; round < 10; round++) {
		used = 0;
		r = tl_conn_feed(l, c, wire + off, n - off, &used);
		tl_life_after(l, c);
		CHECK_EQ(r, TL_FEED_STALL);
		CHECK_EQ(l->evq.own_events[0], 10);
		CHECK_EQ(used, 10 * 10);
		off += used;
		drain(l, &g);
		tl_evq_refresh(&l->evq);
		CHECK_EQ(l->evq.own_events[0], 0);
	}
	/* three 400-byte messages: two fit the 1000-byte share */
	used = 0;
	r = tl_conn_feed(l, c, wire + off, n - off, &used);
	tl_life_after(l, c);
	CHECK_EQ(r, TL_FEED_STALL);
	CHECK_EQ(l->evq.own_events[0], 2);
	CHECK_EQ(l->evq.own_bytes[0], 800);
	off += used;
	drain(l, &g);
	tl_evq_refresh(&l->evq);
	used = 0;
	r = tl_conn_feed(l, c, wire + off, n - off, &used);
	CHECK_EQ(r, TL_FEED_OK);
	CHECK_EQ(off + used, n);
	drain(l, &g);
	CHECK_EQ(g.events, 1 + 103);
	CHECK_EQ(c->msgs_in, 103);
	CHECK_EQ(l->pub[0].msgs_in, 103);
	CHECK_EQ(l->pub[0].bytes_in, 100 * 8 + 3 * 400);
	end(l, c, &g);
	free(g.p);
	tl_loop_free(l);
}

/* test_owner_runs: the per-owner counts kept through the run log
 * (tl_evq_own_add, tl_evq_refresh) equal a recount of the pending records
 * after every step of a random mix of single appends, runs of one owner
 * (tl_evq_run), head moves landing anywhere (inside runs too: the partial
 * credit) and counting turned off and on, over a 64-event ring that
 * wraps many times. */
static void test_owner_runs(void)
{
	struct tl_evq q;
	struct tl_pool_stats st;
	uint32_t cnt[4];
	uint64_t byt[4];
	uint64_t seed = 88172645463325252ull;
	static const uint8_t pl[64];

	memset(&st, 0, sizeof(st));
	CHECK_EQ(tl_evq_init(&q, 64, 4096, &st, 0, 4), 0);
	tl_evq_set_counting(&q, 1);
	for (int step = 0; step < 200000; step++) {
		uint64_t r;
		seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
		r = seed;
		uint32_t slot = (uint32_t)(r % 4), op = (uint32_t)((r >> 8) % 16);
		size_t n = (size_t)((r >> 16) % 65);
		if (op < 6) { /* one event */
			struct tl_evmeta m = {.slot = slot, .gen = 1, .kind = TL_EV_BINARY};
			if (q.tail - q.head_cache < q.size)
				CHECK_EQ(tl_evq_append_ref(&q, m, pl, n), 0);
		} else if (op < 10) { /* a run of up to 9 */
			struct tl_evq_run run;
			uint64_t k = (r >> 24) % 10;
			tl_evq_run_begin(&q, &run, slot, 1, 0, k);
			for (uint64_t i = 0; i < k; i++)
				if (tl_evq_run_add(&run, TL_EV_BINARY, pl, (n + i) % 65, 0) < 0)
					break;
			if (run.tail != q.tail)
				tl_evq_run_end(&q, &run);
		} else if (op < 15) { /* Go passes some of what was published */
			tl_evq_publish(&q);
			uint64_t pend = q.tail - q.head_cache;
			uint64_t adv = pend ? (r >> 24) % (pend + 1) : 0;
			__atomic_store_n(&q.r->head, q.head_cache + adv, __ATOMIC_RELEASE);
			tl_evq_refresh(&q);
		} else {
			tl_evq_set_counting(&q, (r >> 24) & 1);
		}
		if (!q.counting)
			continue;
		memset(cnt, 0, sizeof(cnt));
		memset(byt, 0, sizeof(byt));
		for (uint64_t i = q.head_cache; i != q.tail; i++) {
			cnt[q.events[i & q.mask].slot]++;
			byt[q.events[i & q.mask].slot] += q.events[i & q.mask].len;
		}
		for (int o = 0; o < 4; o++) {
			CHECK_EQ(q.own_events[o], cnt[o]);
			CHECK_EQ(q.own_bytes[o], byt[o]);
		}
		CHECK(q.run_tail - q.run_head <= q.tail - q.head_cache);
	}
	tl_evq_free(&q);
}

int main(void)
{
	test_equivalence();
	test_room();
	test_share();
	test_owner_runs();
	CHECK_DONE("test_burst");
}
