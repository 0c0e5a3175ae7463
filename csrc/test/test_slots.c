/* test_slots.c - the TLS plaintext slots (taken, deferred while an event
 * points into them, released by Go's head, never lost or handed out
 * twice) and the parser's hold of a frame not all in its run
 * (tl_conn.rx_hold), under ASan/UBSan. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loop/life.h"
#include "loop/loop.h"
#include "codec/ws.h"
#include "check.h"
#include "config.h"

/* test_pt_pool: every plaintext slot is handed out once, lies inside the
 * pool, is deferred while ref says an unconsumed event points into it,
 * and comes back when the head passes it. */
static void test_pt_pool(void)
{
	struct tl_slots s;
	uint32_t n;
	int32_t got[256];
	int seen[256] = {0};

	CHECK_EQ(tl_slots_alloc(&s, 64), 0);
	n = s.pt_count;
	CHECK_EQ(n, tl_slots_pt_count(64));
	CHECK_EQ(n, 8);
	CHECK_EQ(tl_slots_pt_count(1024), 128);
	CHECK_EQ(tl_slots_pt_count(32768), 256);
	CHECK_EQ(tl_slots_pt_get(&s), -1); /* nothing mapped yet */
	CHECK_EQ(tl_slots_pt_map(&s), 0);
	CHECK_EQ(tl_slots_pt_map(&s), 0); /* once */
	for (uint32_t i = 0; i < n; i++) {
		got[i] = tl_slots_pt_get(&s);
		CHECK(got[i] >= 0);
		CHECK(tl_slots_is_pt(&s, (uint32_t)got[i]));
		CHECK(tl_slots_inplace(&s, (uint32_t)got[i]));
		CHECK_EQ(seen[got[i] - (int32_t)s.pt_first], 0);
		seen[got[i] - (int32_t)s.pt_first] = 1;
		uint8_t *p = tl_slots_ptr(&s, (uint32_t)got[i]);
		CHECK_EQ(tl_slots_origin(&s, p), TL_SLOTS_PT);
		CHECK_EQ(tl_slots_origin(&s, p + TL_PT_SLOT - 1), TL_SLOTS_PT);
		memset(p, (int)i, TL_PT_SLOT); /* all of it is ours (ASan) */
	}
	CHECK_EQ(tl_slots_pt_get(&s), -1);
	CHECK_EQ(tl_slots_origin(&s, (const uint8_t *)&s), 0);
	/* Slot 0 is referenced by the event before position 10, slot 1 by
	 * none: 1 comes back at once, 0 waits for the head. */
	s.ref[got[0]] = 10;
	tl_slots_release(&s, (uint32_t)got[0], 5);
	tl_slots_release(&s, (uint32_t)got[1], 5);
	CHECK(tl_slots_deferred(&s));
	CHECK_EQ(tl_slots_pt_get(&s), got[1]);
	CHECK_EQ(tl_slots_pt_get(&s), -1);
	tl_slots_release_deferred(&s, 9);
	CHECK_EQ(tl_slots_pt_get(&s), -1);
	tl_slots_release_deferred(&s, 10);
	CHECK(!tl_slots_deferred(&s));
	CHECK_EQ(s.ref[got[0]], 0);
	CHECK_EQ(tl_slots_pt_get(&s), got[0]);
	/* Everything back: the stack holds each id once. */
	for (uint32_t i = 0; i < n; i++)
		tl_slots_release(&s, (uint32_t)got[i], 0);
	CHECK_EQ(s.pt_nfree, n);
	tl_slots_free(&s, NULL);
}

/* feed runs tl_conn_feed on the detached loop's memory connection with
 * hold bytes of rx_hold and the run counted as plaintext slot q (-1:
 * none). */
static int feed(struct tl_loop *l, const uint8_t *p, size_t n, size_t hold, int32_t q, size_t *used)
{
	struct tl_conn *c = &l->conns[0];
	int r;

	c->rx_hold = hold;
	c->cur_q = q;
	r = tl_conn_feed(l, c, p, n, used);
	c->rx_hold = 0;
	c->cur_q = -1;
	return r;
}

/* srv_hdr writes an unmasked server frame header (len < 65536). */
static size_t srv_hdr(uint8_t *o, int fin, int op, size_t n)
{
	size_t i = 0;
	o[i++] = (uint8_t)((fin ? 0x80 : 0) | op);
	if (n < 126) {
		o[i++] = (uint8_t)n;
	} else {
		o[i++] = 126;
		o[i++] = (uint8_t)(n >> 8);
		o[i++] = (uint8_t)n;
	}
	return i;
}

/* next_data returns the next data event after *pos, skipping the open. */
static struct tl_event *next_data(struct tl_loop *l, uint64_t *pos)
{
	while (*pos < l->evq.tail) {
		struct tl_event *ev = &l->evq.events[*pos & l->evq.mask];
		++*pos;
		if (ev->kind == TL_EV_BINARY || ev->kind == TL_EV_TEXT)
			return ev;
	}
	return NULL;
}

/* test_hold: with rx_hold set the parser stops before a data frame that is
 * not all in the run (or a header cut short) and takes it whole when
 * offered again with the rest, in place; a frame larger than the hold,
 * fragments and control frames take the usual paths. */
static void test_hold(void)
{
	struct tl_config cfg = test_config(1, 1024);
	struct tl_loop *l = tl_loop_new_detached(&cfg);
	uint8_t pay[3000], buf[8192];
	size_t len = 0, used;
	uint64_t pos = 0;
	struct tl_event *ev;
	int32_t q;

	CHECK(l != NULL);
	tl_life_open_memory(l, 0, 1);
	CHECK_EQ(tl_slots_pt_map(&l->slots), 0);
	q = tl_slots_pt_get(&l->slots);
	CHECK(q >= 0);
	for (size_t i = 0; i < sizeof(pay); i++)
		pay[i] = (uint8_t)(i * 7 + 1);
	/* Three frames: 100, 3000 (16-bit length) and 50 bytes. */
	len += srv_hdr(buf + len, 1, TL_OP_BINARY, 100);
	memcpy(buf + len, pay, 100), len += 100;
	size_t f2 = len;
	len += srv_hdr(buf + len, 1, TL_OP_BINARY, 3000);
	memcpy(buf + len, pay, 3000), len += 3000;
	size_t f3 = len;
	len += srv_hdr(buf + len, 1, TL_OP_BINARY, 50);
	memcpy(buf + len, pay + 7, 50), len += 50;

	/* Every cut inside frame 2's header or payload: frame 1 is taken, frame
	 * 2 held with its header; offered again whole, it is delivered from the
	 * run, as is frame 3. */
	for (size_t cut = f2 + 1; cut < f3; cut += (cut < f2 + 8 ? 1 : 499)) {
		uint8_t *run = tl_slots_ptr(&l->slots, (uint32_t)q);
		memcpy(run, buf, len);
		CHECK_EQ(feed(l, run, cut, 4096, q, &used), TL_FEED_OK);
		CHECK_EQ(used, f2);
		ev = next_data(l, &pos);
		CHECK(ev && ev->len == 100 && ev->ptr == run + 2 && memcmp(ev->ptr, pay, 100) == 0);
		CHECK(next_data(l, &pos) == NULL);
		CHECK_EQ(feed(l, run + used, len - used, 4096, q, &used), TL_FEED_OK);
		CHECK_EQ(used, len - f2);
		ev = next_data(l, &pos);
		CHECK(ev && ev->len == 3000 && ev->ptr == run + f2 + 4 && memcmp(ev->ptr, pay, 3000) == 0);
		CHECK_EQ(tl_slots_origin(&l->slots, ev->ptr), TL_SLOTS_PT);
		ev = next_data(l, &pos);
		CHECK(ev && ev->len == 50 && ev->ptr == run + f3 + 2 && memcmp(ev->ptr, pay + 7, 50) == 0);
		CHECK_EQ(l->slots.ref[q], l->evq.tail);
		l->evq.head_cache = l->evq.r->head = l->evq.tail; /* the pump passed them */
	}
	/* Hold smaller than frame 2: it is reassembled (copied to the arena). */
	{
		uint8_t *run = tl_slots_ptr(&l->slots, (uint32_t)q);
		memcpy(run, buf, len);
		CHECK_EQ(feed(l, run, f2 + 1000, 2000, q, &used), TL_FEED_OK);
		CHECK_EQ(used, f2 + 1000);
		CHECK_EQ(feed(l, run + used, len - used, 2000, q, &used), TL_FEED_OK);
	}
	ev = next_data(l, &pos);
	CHECK(ev && ev->len == 100);
	ev = next_data(l, &pos);
	CHECK(ev && ev->len == 3000 && memcmp(ev->ptr, pay, 3000) == 0);
	CHECK(ev->ptr >= l->evq.arena && ev->ptr < l->evq.arena + l->evq.arena_size);
	ev = next_data(l, &pos);
	CHECK(ev && ev->len == 50);
	l->evq.head_cache = l->evq.r->head = l->evq.tail;
	/* A fragmented message is never held: its first fragment is taken. */
	{
		uint8_t fr[64];
		size_t k = srv_hdr(fr, 0, TL_OP_TEXT, 10);
		memcpy(fr + k, "abcdefghij", 10);
		CHECK_EQ(feed(l, fr, k + 4, 4096, q, &used), TL_FEED_OK);
		CHECK_EQ(used, k + 4);
		size_t k2 = srv_hdr(fr + k + 10, 1, TL_OP_CONT, 2);
		memcpy(fr + k + 10 + k2, "kl", 2);
		CHECK_EQ(feed(l, fr + 4 + k, 6 + k2 + 2, 4096, q, &used), TL_FEED_OK);
		ev = next_data(l, &pos);
		CHECK(ev && ev->len == 12 && memcmp(ev->ptr, "abcdefghijkl", 12) == 0);
		CHECK(ev->ptr >= l->evq.arena && ev->ptr < l->evq.arena + l->evq.arena_size);
	}
	tl_loop_free(l);
}

/* test_hold_text: a held text frame's bytes are validated as they come
 * (bad UTF-8 fails at once, 1007, as in the reassembly path; a sequence
 * cut by the end of the run is not an error), and a frame that completes
 * is delivered in place. */
static void test_hold_text(void)
{
	struct tl_config cfg = test_config(1, 64);
	struct tl_loop *l = tl_loop_new_detached(&cfg);
	struct tl_conn *c;
	uint8_t txt[1000];
	uint8_t *run;
	size_t hl, used;
	uint64_t pos = 0;
	struct tl_event *ev;
	int32_t q;

	CHECK(l != NULL);
	c = &l->conns[0];
	tl_life_open_memory(l, 0, 1);
	CHECK_EQ(tl_slots_pt_map(&l->slots), 0);
	q = tl_slots_pt_get(&l->slots);
	run = tl_slots_ptr(&l->slots, (uint32_t)q);
	for (size_t i = 0; i < sizeof(txt); i++)
		txt[i] = (uint8_t)('a' + i % 26);
	memcpy(txt + 500, "\xc3\xa9", 2); /* a 2-byte sequence, cut below */
	hl = srv_hdr(run, 1, TL_OP_TEXT, sizeof(txt));
	memcpy(run + hl, txt, sizeof(txt));
	/* Valid so far (the cut falls inside the sequence): held. */
	c->rx_held_ok = 0;
	CHECK_EQ(feed(l, run, hl + 501, 4096, q, &used), TL_FEED_OK);
	CHECK_EQ(used, 0);
	CHECK_EQ(c->rx_held_ok, 501);
	CHECK(next_data(l, &pos) == NULL);
	/* Re-offered with more (rx_held_ok kept), then whole: in place. */
	CHECK_EQ(feed(l, run, hl + 700, 4096, q, &used), TL_FEED_OK);
	CHECK_EQ(used, 0);
	CHECK_EQ(c->rx_held_ok, 700);
	CHECK_EQ(feed(l, run, hl + sizeof(txt), 4096, q, &used), TL_FEED_OK);
	CHECK_EQ(used, hl + sizeof(txt));
	ev = next_data(l, &pos);
	CHECK(ev && ev->kind == TL_EV_TEXT && ev->len == sizeof(txt) && ev->ptr == run + hl);
	/* F4 90 (above U+10FFFF) in the part that arrived: fails now. */
	memcpy(run + hl + 10, "\xf4\x90", 2);
	c->rx_held_ok = 0;
	CHECK_EQ(feed(l, run, hl + 40, 4096, q, &used), TL_FEED_DEAD);
	CHECK_EQ(c->fail_code, 1007);
	CHECK_EQ(c->fail_err, TL_E_UTF8);
	tl_loop_free(l);
}

int main(void)
{
	test_pt_pool();
	test_hold();
	test_hold_text();
	printf("test_slots: %lu checks passed\n", check_passed);
	return 0;
}
