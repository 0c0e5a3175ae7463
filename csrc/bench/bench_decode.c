/* bench_decode.c - the decode path in C alone: the brief's workload (100k
 * messages, 1/3 binary u64, 2/3 text {"id":i}, fed in 4096-byte runs)
 * through tl_conn_feed and tl_life_emit into the event ring, consumed by summing
 * ids; twice: payloads copied into the arena (the loop's injected bytes)
 * and in place (the Decoder). Single thread, so it is the loop's own cost per message; the Go
 * benchmark adds the handoff and the callback. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loop/loop.h"

#define NMSG 100000

static uint64_t now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int main(void)
{
	struct tl_config cfg = {
		.sq_entries = 8, .cq_entries = 16, .sq_thread_cpu = -1, .buf_size = 4096, .buf_count = 4,
		.loop_cpu = -1, .event_ring_size = 1 << 16, .arena_size = 1 << 24, .cmd_ring_size = 4096,
		.max_conns = 1, .max_message = 1 << 20, .handshake_timeout_ns = 1, .close_timeout_ns = 1,
		.max_send_queue = 1 << 20,
	};
	struct tl_loop *l = tl_loop_new_detached(&cfg);
	static uint8_t wire[NMSG * 16];
	size_t n = 0;
	uint64_t sum = 0, want = 0, best = ~0ull;

	if (!l)
		return 1;
	for (int i = 0; i < NMSG; i++) {
		want += (uint64_t)i;
		if (i % 3 == 0) {
			uint64_t v = (uint64_t)i;
			wire[n++] = 0x82;
			wire[n++] = 8;
			memcpy(wire + n, &v, 8);
			n += 8;
		} else {
			char s[32];
			int k = snprintf(s, sizeof(s), "{\"id\":%d}", i);
			wire[n++] = 0x81;
			wire[n++] = (uint8_t)k;
			memcpy(wire + n, s, (size_t)k);
			n += (size_t)k;
		}
	}
	tl_life_open_memory(l, 0, 1);
	l->evq.r->head = l->evq.tail;
	/* pass 0: payloads copied into the arena (the loop's injected bytes);
	 * pass 1: in place, as the Decoder feeds (TL_CUR_CALLER) */
	for (int pass = 0; pass < 2; pass++, best = ~0ull) {
		for (int rep = 0; rep < (getenv("BENCH_REPS") ? atoi(getenv("BENCH_REPS")) : 30); rep++) {
			struct tl_conn *c = &l->conns[0];
			uint64_t t0 = now();
			sum = 0;
			for (size_t off = 0; off < n;) {
				size_t run = n - off < 4096 ? n - off : 4096, used = 0;
				c->cur_q = pass ? TL_CUR_CALLER : -1;
				tl_conn_feed(l, c, wire + off, run, &used);
				c->cur_q = -1;
				off += used;
				/* consume like the pump: one pass over the new events */
				struct tl_evring *r = l->evq.r;
				for (uint64_t i = r->head; i < l->evq.tail; i++) {
					const struct tl_event *e = &r->ev[i & r->mask];
					if (e->kind == TL_EV_BINARY) {
						uint64_t v;
						memcpy(&v, e->ptr, 8);
						sum += v;
					} else {
						uint64_t v = 0;
						for (uint32_t j = 6; j + 1 < e->len; j++)
							v = v * 10 + (uint64_t)(e->ptr[j] - '0');
						sum += v;
					}
				}
				r->head = l->evq.tail;
			}
			uint64_t dt = now() - t0;
			if (dt < best)
				best = dt;
		}
		if (sum != want) {
			fprintf(stderr, "bench_decode: sum %llu want %llu\n", (unsigned long long)sum, (unsigned long long)want);
			return 1;
		}
		printf("decode (C parse + emit + consume, 100k mixed, 4096-byte runs, %s): %.2f ns/msg (best of 30)\n",
		       pass ? "in place" : "arena copy", (double)best / NMSG);
	}
	tl_loop_free(l);
	return 0;
}
