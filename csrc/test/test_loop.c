/* test_loop.c - the loop, the frame parser and the rings under ASan/UBSan,
 * driven through the same C API and rings Go uses: memory connections fed
 * with TL_CMD_INJECT, and a real loopback socket served by a thread
 * (test_loop_faults.c has the send queue, the heartbeat and the receive
 * probe). */
#define _GNU_SOURCE
#include "loop_harness.h"

/* A stream of messages, fragmented with a ping between fragments, fed one
 * byte per command: every split point of header and payload. */
static void test_memory_stream(void)
{
	struct harness h;
	struct tl_event ev;
	static uint8_t wire[1 << 16], pl[1 << 16];
	size_t n = 0;

	start(&h, 64);
	push(&h, TL_CMD_DIAL, TL_CMDF_MEMORY, 0, 1, 7, NULL, 0);
	CHECK(next_event(&h, &ev, NULL, 0) && ev.kind == TL_EV_OPEN && ev.slot == 1 && ev.gen == 7);
	for (int i = 0; i < 100; i++) {
		char msg[64];
		int len = snprintf(msg, sizeof(msg), "{\"id\":%d}", i);
		if (i % 3 == 0) {
			n += frame(wire + n, 0, TL_OP_TEXT, msg, 3);
			n += frame(wire + n, 1, TL_OP_PING, "pp", 2);
			n += frame(wire + n, 1, TL_OP_CONT, msg + 3, (size_t)len - 3);
		} else {
			n += frame(wire + n, 1, i % 3 == 1 ? TL_OP_BINARY : TL_OP_TEXT, msg, (size_t)len);
		}
	}
	for (size_t i = 0; i < n; i++)
		push(&h, TL_CMD_INJECT, 0, 0, 1, 7, wire + i, 1);
	for (int i = 0; i < 100; i++) {
		char want[64];
		int len = snprintf(want, sizeof(want), "{\"id\":%d}", i);
		if (i % 3 == 0) {
			CHECK(next_event(&h, &ev, pl, sizeof(pl)) && ev.kind == TL_EV_PING && ev.len == 2);
		}
		CHECK(next_event(&h, &ev, pl, sizeof(pl)));
		CHECK(ev.kind == (i % 3 == 1 ? TL_EV_BINARY : TL_EV_TEXT));
		CHECK(ev.len == (uint32_t)len && memcmp(pl, want, (size_t)len) == 0);
	}
	/* a bad frame: reserved opcode -> final error with 1002 */
	{
		uint8_t bad[2] = {0x83, 0};
		push(&h, TL_CMD_INJECT, 0, 0, 1, 7, bad, 2);
		CHECK(next_event(&h, &ev, pl, sizeof(pl)));
		CHECK(ev.kind == TL_EV_ERROR && ev.code == 1002 && (ev.flags & TL_EVF_FINAL));
	}
	/* invalid UTF-8 -> 1007; a frame bigger than max_message -> 1009 */
	{
		uint8_t b[16];
		size_t k;
		push(&h, TL_CMD_DIAL, TL_CMDF_MEMORY, 0, 2, 1, NULL, 0);
		CHECK(next_event(&h, &ev, NULL, 0) && ev.kind == TL_EV_OPEN);
		k = frame(b, 1, TL_OP_TEXT, "\xed\xa0\x80", 3);
		push(&h, TL_CMD_INJECT, 0, 0, 2, 1, b, (uint32_t)k);
		CHECK(next_event(&h, &ev, pl, sizeof(pl)) && ev.kind == TL_EV_ERROR && ev.code == 1007);
		push(&h, TL_CMD_DIAL, TL_CMDF_MEMORY, 0, 3, 1, NULL, 0);
		CHECK(next_event(&h, &ev, NULL, 0) && ev.kind == TL_EV_OPEN);
		uint8_t big[10] = {0x82, 127, 0x40, 0, 0, 0, 0, 0, 0, 0}; /* 2^62 */
		push(&h, TL_CMD_INJECT, 0, 0, 3, 1, big, 10);
		CHECK(next_event(&h, &ev, pl, sizeof(pl)) && ev.kind == TL_EV_ERROR && ev.code == 1009);
	}
	tl_loop_stop(h.l);
	tl_loop_free(h.l);
}

/* Frames around the 7-bit/16-bit length boundary through the parser's
 * inline header path (parse_hdr in conn.c) and tl_ws_parse_hdr: whole
 * frames in one command, then the same stream one byte per command (a
 * header cut after 0x7E, after its first length byte), a non-minimal
 * 16-bit length, a fragmented message of 16-bit fragments; then the
 * frames the inline path leaves to tl_ws_parse_hdr must still fail: a
 * ping in the 16-bit form (1002), RSV1 on a 16-bit frame (1002). */
static void test_len16(void)
{
	static const size_t sizes[] = {0, 125, 126, 127, 255, 256, 1000, 4097, 65535};
	const int nsz = (int)(sizeof(sizes) / sizeof(sizes[0]));
	static uint8_t wire[1 << 18], pl[1 << 17], want[1 << 17];
	struct harness h;
	struct tl_event ev;
	size_t n = 0;

	for (size_t i = 0; i < sizeof(want); i++)
		want[i] = (uint8_t)('a' + i % 26);
	start(&h, 64);
	for (int pass = 0; pass < 2; pass++) {
		uint32_t slot = (uint32_t)(1 + pass);
		push(&h, TL_CMD_DIAL, TL_CMDF_MEMORY, 0, slot, 3, NULL, 0);
		CHECK(next_event(&h, &ev, NULL, 0) && ev.kind == TL_EV_OPEN && ev.slot == slot);
		n = 0;
		for (int i = 0; i < nsz; i++)
			n += frame(wire + n, 1, i % 2 ? TL_OP_TEXT : TL_OP_BINARY, want, sizes[i]);
		/* length 5 in the 16-bit form: accepted (not minimal, but legal) */
		wire[n++] = 0x82;
		wire[n++] = 126;
		wire[n++] = 0;
		wire[n++] = 5;
		memcpy(wire + n, want, 5);
		n += 5;
		/* 300 + 700 bytes in two 16-bit fragments */
		n += frame(wire + n, 0, TL_OP_BINARY, want, 300);
		n += frame(wire + n, 1, TL_OP_CONT, want + 300, 700);
		if (pass == 0) {
			for (size_t off = 0; off < n; off += 60000) {
				size_t k = n - off < 60000 ? n - off : 60000;
				push(&h, TL_CMD_INJECT, 0, 0, slot, 3, wire + off, (uint32_t)k);
			}
		} else {
			for (size_t i = 0; i < n; i++)
				push(&h, TL_CMD_INJECT, 0, 0, slot, 3, wire + i, 1);
		}
		for (int i = 0; i < nsz; i++) {
			CHECK(next_event(&h, &ev, pl, sizeof(pl)));
			CHECK(ev.kind == (i % 2 ? TL_EV_TEXT : TL_EV_BINARY) && ev.slot == slot);
			CHECK(ev.len == sizes[i] && memcmp(pl, want, sizes[i]) == 0);
		}
		CHECK(next_event(&h, &ev, pl, sizeof(pl)) && ev.kind == TL_EV_BINARY && ev.len == 5 &&
		      memcmp(pl, want, 5) == 0);
		CHECK(next_event(&h, &ev, pl, sizeof(pl)) && ev.kind == TL_EV_BINARY && ev.len == 1000 &&
		      memcmp(pl, want, 1000) == 0);
	}
	{
		uint8_t ping16[4 + 5] = {0x89, 126, 0, 5, 'h', 'e', 'l', 'l', 'o'};
		uint8_t rsv16[4 + 200] = {0xC2, 126, 0, 200};
		push(&h, TL_CMD_INJECT, 0, 0, 1, 3, ping16, sizeof(ping16));
		CHECK(next_event(&h, &ev, pl, sizeof(pl)));
		CHECK(ev.kind == TL_EV_ERROR && ev.code == 1002 && ev.slot == 1 && (ev.flags & TL_EVF_FINAL));
		push(&h, TL_CMD_INJECT, 0, 0, 2, 3, rsv16, sizeof(rsv16));
		CHECK(next_event(&h, &ev, pl, sizeof(pl)));
		CHECK(ev.kind == TL_EV_ERROR && ev.code == 1002 && ev.slot == 2 && (ev.flags & TL_EVF_FINAL));
	}
	tl_loop_stop(h.l);
	tl_loop_free(h.l);
}

/* Back-pressure: an event ring of 4 and 1000 messages injected at once;
 * a consumer that reads slowly still gets every one, in order. */
static void test_backpressure(void)
{
	struct harness h;
	struct tl_event ev;
	static uint8_t wire[1 << 16], pl[256];
	size_t n = 0;

	start(&h, 4);
	push(&h, TL_CMD_DIAL, TL_CMDF_MEMORY, 0, 0, 3, NULL, 0);
	for (int i = 0; i < 1000; i++) {
		uint8_t v[8];
		memcpy(v, &i, 4);
		memset(v + 4, 0xab, 4);
		n += frame(wire + n, 1, TL_OP_BINARY, v, 8);
	}
	push(&h, TL_CMD_INJECT, 0, 0, 0, 3, wire, (uint32_t)n);
	CHECK(next_event(&h, &ev, NULL, 0) && ev.kind == TL_EV_OPEN);
	for (int i = 0; i < 1000; i++) {
		int got;
		if (i % 100 == 0)
			usleep(2000);
		CHECK(next_event(&h, &ev, pl, sizeof(pl)) && ev.kind == TL_EV_BINARY && ev.len == 8);
		memcpy(&got, pl, 4);
		CHECK(got == i);
	}
	tl_loop_stop(h.l);
	tl_loop_free(h.l);
}

static void test_socket(void)
{
	struct harness h;
	struct tl_event ev;
	/* With minimum-wait batching on, chunks of 8 KiB 300 us apart: the
	 * loop catches up, sleeps and is woken by two slots of data at a
	 * time, which opens the batched wait's gate. */
	struct server s = {.frames = 5000, .chunk = min_wait_ns ? 8192 : 0, .gap_us = min_wait_ns ? 300 : 0};
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	pthread_t th;
	static uint8_t pl[256];

	s.lfd = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s.lfd >= 0);
	CHECK(bind(s.lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
	CHECK(listen(s.lfd, 4) == 0);
	CHECK(getsockname(s.lfd, (struct sockaddr *)&a, &al) == 0);
	CHECK(pthread_create(&th, NULL, serve, &s) == 0);

	/* The first address refuses (bound, not listening): the loop goes on
	 * to the alternative, from a socket bound to the local address. */
	struct sockaddr_in r = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t rl = sizeof(r);
	int rfd = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(rfd >= 0);
	CHECK(bind(rfd, (struct sockaddr *)&r, sizeof(r)) == 0);
	CHECK(getsockname(rfd, (struct sockaddr *)&r, &rl) == 0);
	struct sockaddr_storage alt[1];
	memset(alt, 0, sizeof(alt));
	memcpy(&alt[0], &a, sizeof(a));
	struct sockaddr_in local = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};

	start(&h, 1024);
	struct tl_dial_params p;
	local_dial(&p, &r);
	p.alt = alt;
	p.nalt = 1;
	memcpy(&p.local, &local, sizeof(local));
	p.local_len = sizeof(local);
	CHECK(tl_dial_prepare(h.l, 5, &p) == 0);
	push(&h, TL_CMD_DIAL, 0, 0, 5, 9, NULL, 0);
	CHECK(next_event(&h, &ev, NULL, 0) && ev.kind == TL_EV_OPEN);
	for (int i = 0; i < s.frames; i++) {
		CHECK(next_event(&h, &ev, pl, sizeof(pl)));
		CHECK(ev.kind == TL_EV_BINARY && ev.len == 100 && pl[0] == (uint8_t)i && pl[99] == (uint8_t)i);
	}
	CHECK(next_event(&h, &ev, pl, sizeof(pl)));
	CHECK(ev.kind == TL_EV_CLOSE && ev.code == 1000 && ev.len == 4 && memcmp(pl, "done", 4) == 0);
	CHECK(ev.flags & TL_EVF_FINAL);
	pthread_join(th, NULL);
	close(s.lfd);
	/* Only the refusing address: the final error carries the errno. */
	p.nalt = 0;
	p.alt = NULL;
	CHECK(tl_dial_prepare(h.l, 6, &p) == 0);
	push(&h, TL_CMD_DIAL, 0, 0, 6, 3, NULL, 0);
	CHECK(next_event(&h, &ev, pl, sizeof(pl)));
	CHECK(ev.kind == TL_EV_ERROR && ev.err == TL_E_DIAL && ev.aux == ECONNREFUSED && (ev.flags & TL_EVF_FINAL));
	CHECK(tl_loop_fail_head(h.l, 6, 3, (char *)pl, sizeof(pl)) == 0);
	p.nalt = 65; /* too many alternatives */
	p.alt = alt;
	CHECK(tl_dial_prepare(h.l, 7, &p) == -EINVAL);
	close(rfd);
	tl_loop_stop(h.l);
	/* Every receive slot is back in its ring, or deferred (an event the
	 * pump passed may still be the last to point into it): none lost,
	 * and every completion was claimed in ring order. */
	{
		const struct tl_slots *s = &h.l->slots;
		CHECK_EQ(s->main.in_use + s->hs.in_use, s->defer_tail - s->defer_head);
		CHECK_EQ(s->main.ooo + s->hs.ooo, 0);
		CHECK_EQ(s->main.nparked + s->hs.nparked, 0);
	}
	if (min_wait_ns) {
		printf("test_socket: %lu batched waits (min_wait_ns %lu)\n", (unsigned long)h.l->stats->min_waits,
		       (unsigned long)min_wait_ns);
		CHECK(h.l->stats->min_waits > 0);
	} else {
		CHECK_EQ(h.l->stats->min_waits, 0);
	}
	tl_loop_free(h.l);
}

/* A refused upgrade: the error event carries the status, and the
 * response (head and body) is kept for tl_loop_fail_head until the slot's
 * next dial, which frees it. */
static void test_refused_upgrade(void)
{
	struct harness h;
	struct tl_event ev;
	struct server s = {.refuse = 1};
	struct sockaddr_in a;
	pthread_t th;
	static uint8_t pl[256];
	static char head[TL_FAIL_HEAD_MAX];

	s.lfd = listen_local(&a);
	start(&h, 1024);
	struct tl_dial_params p;
	local_dial(&p, &a);
	for (uint32_t gen = 1; gen <= 2; gen++) {
		CHECK(pthread_create(&th, NULL, serve, &s) == 0);
		CHECK(tl_dial_prepare(h.l, 3, &p) == 0);
		push(&h, TL_CMD_DIAL, 0, 0, 3, gen, NULL, 0);
		CHECK(next_event(&h, &ev, pl, sizeof(pl)));
		CHECK(ev.kind == TL_EV_ERROR && ev.err == TL_E_HTTP && ev.code == 429 && (ev.flags & TL_EVF_FINAL));
		size_t n = tl_loop_fail_head(h.l, 3, gen, head, sizeof(head));
		CHECK(n > 0 && n < sizeof(head));
		head[n] = 0;
		CHECK(strncmp(head, "HTTP/1.1 429", 12) == 0 && strstr(head, "Retry-After: 1\r\n") != NULL);
		CHECK(n >= 9 && memcmp(head + n - 9, "slow down", 9) == 0);
		CHECK(tl_loop_fail_head(h.l, 3, gen + 7, head, sizeof(head)) == 0); /* another generation */
		CHECK(tl_loop_fail_head(h.l, 3, gen, head, 4) == 4);                /* bounded by cap */
		pthread_join(th, NULL);
	}
	close(s.lfd);
	tl_loop_stop(h.l);
	tl_loop_free(h.l);
}

/* Sampling (sample_every 2): every second INJECT (a memory connection's
 * completion) is stamped; the first data message it yields carries the
 * stamps (ordered, on CLOCK_MONOTONIC) and the flag; an INJECT that yields
 * no data message leaves no stamp for a later one; the pool counters count
 * messages and bytes. */
static void test_sampling(void)
{
	struct harness h;
	struct tl_event ev;
	uint8_t wire[256];
	size_t n;
	struct timespec ts;
	uint64_t t0, t1;
	/* per INJECT: data frames (0 = a ping only), whether it is sampled */
	static const struct { int frames, sampled; } plan[] = {{3, 0}, {3, 1}, {0, 0}, {0, 1}, {1, 0}, {1, 1}};
	uint64_t msgs = 0, bytes = 0;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	t0 = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	start_sampled(&h, 64, 2);
	CHECK(h.er->stamps != NULL);
	push(&h, TL_CMD_DIAL, TL_CMDF_MEMORY, 0, 2, 9, NULL, 0);
	CHECK(next_event(&h, &ev, NULL, 0) && ev.kind == TL_EV_OPEN && !(ev.flags & TL_EVF_STAMPED));
	for (size_t k = 0; k < sizeof(plan) / sizeof(plan[0]); k++) {
		n = 0;
		if (plan[k].frames == 0)
			n += frame(wire + n, 1, TL_OP_PING, "p", 1);
		for (int i = 0; i < plan[k].frames; i++)
			n += frame(wire + n, 1, TL_OP_TEXT, "hello", 5);
		push(&h, TL_CMD_INJECT, 0, 0, 2, 9, wire, (uint32_t)n);
		if (plan[k].frames == 0) {
			CHECK(next_event(&h, &ev, NULL, 0) && ev.kind == TL_EV_PING && !(ev.flags & TL_EVF_STAMPED));
			continue;
		}
		for (int i = 0; i < plan[k].frames; i++) {
			CHECK(next_event(&h, &ev, NULL, 0) && ev.kind == TL_EV_TEXT && ev.len == 5);
			msgs++;
			bytes += 5;
			int want = plan[k].sampled && i == 0;
			CHECK(!!(ev.flags & TL_EVF_STAMPED) == want);
			if (!want)
				continue;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			t1 = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
			CHECK(last_stamp.cqe >= t0);
			CHECK(last_stamp.cqe <= last_stamp.plaintext);
			CHECK(last_stamp.plaintext <= last_stamp.publish);
			CHECK(last_stamp.publish <= t1);
			CHECK(last_stamp.wire == 0);
		}
	}
	{
		struct tl_pool_stats *st = tl_loop_stats(h.l);
		CHECK(__atomic_load_n(&st->msgs, __ATOMIC_RELAXED) == msgs);
		CHECK(__atomic_load_n(&st->bytes, __ATOMIC_RELAXED) == bytes);
	}
	tl_loop_stop(h.l);
	tl_loop_free(h.l);
}

/* A DIAL still in the command ring when the loop stops is dropped: the
 * loop must not start a connection after it shut the others down (that
 * one would live on, and tl_loop_stop would wait for it forever). Go
 * publishes every command before tl_loop_stop, but a busy loop can see
 * the stop request before it drains them. Reproduced here by putting the
 * sleeping loop in its "shut down" state, then sending a DIAL. */
static void test_dial_during_stop(void)
{
	struct harness h;

	start(&h, 1024);
	for (int i = 0; i < 20000 && !__atomic_load_n(&h.cr->loop_sleeping, __ATOMIC_SEQ_CST); i++)
		usleep(100);
	usleep(20000); /* past its last look at the ring: asleep in the kernel */
	h.l->shutting_down = 1;
	h.l->stop_done = 1; /* as after shutdown_all: it exits once nothing is live */
	push(&h, TL_CMD_DIAL, TL_CMDF_MEMORY, 0, 1, 1, NULL, 0); /* wakes it */
	tl_loop_stop(h.l); /* joins: hangs if the DIAL started a connection */
	CHECK(tl_loop_conns(h.l)[1].state == 0); /* never started */
	tl_loop_free(h.l);
}

int main(void)
{
	test_memory_stream();
	test_len16();
	test_backpressure();
	test_socket();
	/* Bundles: 5000 frames over 16 slots of 4 KiB, read one event at a
	 * time - completions of several slots, the ring emptied (a bundle
	 * then ends and is re-armed), slots held by in-place payloads. */
	recv_bundle = 1;
	test_socket();
	/* The same with minimum-wait batching on (loop/wait.c, wait_batched):
	 * whether its gate opens depends on timing, what arrives does not. */
	min_wait_ns = 50000;
	test_socket();
	min_wait_ns = 0;
	recv_bundle = 0;
	/* The inline loop: the same stream with the loop run by this thread
	 * while it waits for events (tl_loop_inline_run), stopped here. */
	inline_loop = 1;
	test_socket();
	inline_loop = 0;
	test_sampling();
	test_refused_upgrade();
	test_dial_during_stop();
	printf("test_loop: %lu checks passed\n", check_passed);
	return 0;
}
