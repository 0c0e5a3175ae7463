/* test_loop.c - the loop, the frame parser and the rings under ASan/UBSan,
 * driven through the same C API and rings Go uses: memory connections fed
 * with TL_CMD_INJECT, and a real loopback socket served by a thread. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "codec/http.h"
#include "loop/loop.h" /* test_dial_during_stop puts the loop in its shutdown state */
#include "loop/rx.h"    /* test_lost_recv loses a recv */
#include "loop/uring.h"
#include "talaris.h"
#include "codec/ws.h"
#include "check.h"
#include "frames.h"

struct harness {
	struct tl_loop *l;
	struct tl_evring *er;
	struct tl_cmdring *cr;
	uint64_t head, tail;
};

static void push(struct harness *h, uint8_t op, uint8_t flags, uint16_t code, uint32_t slot, uint32_t gen,
		 const void *p, uint32_t n)
{
	struct tl_cmdring *r = h->cr;
	size_t rec = sizeof(struct tl_cmd) + ((n + 15) & ~15u);
	for (;;) {
		uint64_t head = __atomic_load_n(&r->head, __ATOMIC_ACQUIRE);
		uint64_t off = h->tail & (r->size - 1);
		uint64_t pad = off + rec > r->size ? r->size - off : 0;
		if (h->tail + pad + rec - head <= r->size) {
			if (pad) {
				struct tl_cmd *c = (struct tl_cmd *)(r->buf + off);
				memset(c, 0, sizeof(*c));
				c->len = (uint32_t)(pad - sizeof(*c));
				h->tail += pad;
				off = 0;
			}
			struct tl_cmd *c = (struct tl_cmd *)(r->buf + off);
			c->len = n;
			c->op = op;
			c->flags = flags;
			c->code = code;
			c->slot = slot;
			c->gen = gen;
			if (n)
				memcpy(c + 1, p, n);
			h->tail += rec;
			__atomic_store_n(&r->tail, h->tail, __ATOMIC_SEQ_CST);
			if (__atomic_load_n(&r->loop_sleeping, __ATOMIC_SEQ_CST)) {
				uint64_t one = 1;
				CHECK(write(r->efd, &one, 8) == 8);
			}
			return;
		}
		usleep(100);
	}
}

/* last_stamp is the stamp table entry of the event next_event returned
 * last (zero when the table is off or the event is not stamped). */
static struct tl_stamp last_stamp;

/* inline_loop is the next loops' tl_config.inline_loop: no thread, and
 * next_event runs the loop on this thread while it waits (test_socket runs
 * both ways). */
static uint32_t inline_loop;

/* next_event waits (bounded) for one event and copies it out. */
static int next_event(struct harness *h, struct tl_event *out, uint8_t *payload, size_t cap)
{
	for (int i = 0; i < 20000; i++) {
		if (inline_loop && i > 0)
			CHECK(tl_loop_inline_run(h->l, TL_INLINE_BLOCK) >= 0);
		uint64_t tail = __atomic_load_n(&h->er->tail, __ATOMIC_ACQUIRE);
		if (tail != h->head) {
			*out = h->er->ev[h->head & h->er->mask];
			memset(&last_stamp, 0, sizeof(last_stamp));
			if (h->er->stamps && (out->flags & TL_EVF_STAMPED))
				last_stamp = h->er->stamps[h->head & h->er->mask];
			if (out->len && payload) {
				CHECK(out->len <= cap);
				memcpy(payload, out->ptr, out->len);
			}
			h->head++;
			__atomic_store_n(&h->er->head, h->head, __ATOMIC_SEQ_CST);
			if (__atomic_load_n(&h->er->loop_wants_space, __ATOMIC_SEQ_CST)) {
				uint64_t one = 1;
				CHECK(write(h->cr->efd, &one, 8) == 8);
			}
			return 1;
		}
		if (!inline_loop)
			usleep(500);
	}
	return 0;
}

/* recv_bundle is the next loops' tl_config.recv_bundle (test_socket runs
 * with and without recv bundles). */
static uint32_t recv_bundle;

/* min_wait_ns is the next loops' tl_config.min_wait_ns (0: off; with
 * min_wait_nr 8): test_socket runs once with minimum-wait batching on. */
static uint64_t min_wait_ns;

/* ring_flags is the next loops' tl_config.ring_flags (0: none). */
static uint32_t ring_flags;

/* start_cfg starts a loop with the harness's configuration: close_timeout_ns
 * bounds each close handshake (the tests' default is 200 ms). */
static void start_cfg(struct harness *h, uint32_t ev_size, uint32_t sample_every, uint64_t close_timeout_ns)
{
	struct tl_config cfg = {
		.sq_entries = 64, .cq_entries = 256, .ring_flags = ring_flags, .sq_thread_cpu = -1,
		.buf_size = 4096, .buf_count = 16, .loop_cpu = -1, .loop_wait = 1,
		.event_ring_size = ev_size, .arena_size = 1 << 22, .cmd_ring_size = 1 << 16,
		.max_conns = 8, .max_message = 1 << 20, .handshake_timeout_ns = 5000000000ull,
		.close_timeout_ns = close_timeout_ns, .max_send_queue = 1 << 20, .sample_every = sample_every,
		.recv_bundle = recv_bundle, .inline_loop = inline_loop,
		.min_wait_ns = min_wait_ns, .min_wait_nr = min_wait_ns ? 8 : 0,
	};
	int err = 0;
	char msg[160];
	memset(h, 0, sizeof(*h));
	h->l = tl_loop_new(&cfg, &err, msg, sizeof(msg));
	if (!h->l)
		fprintf(stderr, "tl_loop_new: %d %s\n", err, msg);
	CHECK(h->l != NULL);
	h->er = tl_loop_evring(h->l);
	h->cr = tl_loop_cmdring(h->l);
}

static void start_sampled(struct harness *h, uint32_t ev_size, uint32_t sample_every)
{
	start_cfg(h, ev_size, sample_every, 200000000ull);
}

static void start(struct harness *h, uint32_t ev_size) { start_sampled(h, ev_size, 0); }

static size_t frame(uint8_t *out, int fin, int op, const void *p, size_t n)
{
	return test_frame(out, fin, op, p, n, 0);
}

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

/* ---- a real socket: a thread plays the server ---- */

struct server {
	int lfd;
	uint16_t port;
	int frames;
	int refuse; /* answer 429 with Retry-After and a body, then close */
	size_t chunk;    /* write the frames in chunks of about this many bytes (0: 1 MiB) */
	unsigned gap_us; /* and sleep this long after each */
	int gate;        /* > 0: write the 101 alone, then read a byte from this fd before the frames */
	int gate_only;   /* after the gate, close at once (the client has ended) */
};

/* accept_request accepts one connection on lfd and reads its upgrade
 * request into req (NUL-terminated). Returns the socket. */
static int accept_request(int lfd, char *req, size_t cap)
{
	size_t got = 0;
	int fd = accept(lfd, NULL, NULL);
	CHECK(fd >= 0);
	while (got < cap - 1) {
		ssize_t r = read(fd, req + got, cap - 1 - got);
		CHECK(r > 0);
		got += (size_t)r;
		req[got] = 0;
		if (strstr(req, "\r\n\r\n"))
			break;
	}
	return fd;
}

/* upgrade_resp writes the 101 answering req to out; returns its length. */
static size_t upgrade_resp(const char *req, uint8_t *out, size_t cap)
{
	char acc[TL_WS_ACCEPT_LEN + 1];
	const char *k = strcasestr(req, "Sec-WebSocket-Key: ");
	CHECK(k != NULL);
	k += strlen("Sec-WebSocket-Key: ");
	tl_ws_accept(k, TL_WS_KEY_LEN, acc);
	int rl = snprintf((char *)out, cap,
			  "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
			  "Sec-WebSocket-Accept: %s\r\n\r\n",
			  acc);
	CHECK(rl > 0 && (size_t)rl < cap);
	return (size_t)rl;
}

/* listen_local listens on an ephemeral loopback port: *a gets the address. */
static int listen_local(struct sockaddr_in *a)
{
	socklen_t al = sizeof(*a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CHECK(fd >= 0);
	CHECK(bind(fd, (struct sockaddr *)a, sizeof(*a)) == 0);
	CHECK(listen(fd, 4) == 0);
	CHECK(getsockname(fd, (struct sockaddr *)a, &al) == 0);
	return fd;
}

/* local_dial fills p for ws://127.0.0.1/ at a. */
static void local_dial(struct tl_dial_params *p, const struct sockaddr_in *a)
{
	memset(p, 0, sizeof(*p));
	memcpy(&p->addr, a, sizeof(*a));
	p->addr_len = sizeof(*a);
	p->host = "127.0.0.1";
	p->host_len = 9;
	p->path = "/";
	p->path_len = 1;
}

static void *serve(void *arg)
{
	struct server *s = arg;
	char req[4096];
	int fd = accept_request(s->lfd, req, sizeof(req));
	if (s->refuse) {
		static const char no[] = "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\n"
					 "Content-Length: 9\r\n\r\nslow down";
		CHECK(write(fd, no, sizeof(no) - 1) == (ssize_t)(sizeof(no) - 1));
		close(fd);
		return NULL;
	}
	/* 101 and the first frames in one write */
	static uint8_t out[1 << 20];
	size_t n = upgrade_resp(req, out, 512);
	if (s->gate > 0) {
		char go;
		CHECK(write(fd, out, n) == (ssize_t)n);
		n = 0;
		CHECK(read(s->gate, &go, 1) == 1);
		if (s->gate_only) {
			close(fd);
			return NULL;
		}
	}
	for (int i = 0; i < s->frames; i++) {
		uint8_t v[100];
		memset(v, (uint8_t)i, sizeof(v));
		n += frame(out + n, 1, TL_OP_BINARY, v, sizeof(v));
		if (n > sizeof(out) - 256 || (s->chunk && n >= s->chunk)) {
			CHECK(write(fd, out, n) == (ssize_t)n);
			n = 0;
			if (s->gap_us)
				usleep(s->gap_us);
		}
	}
	n += frame(out + n, 1, TL_OP_CLOSE, "\x03\xe8" "done", 6);
	CHECK(write(fd, out, n) == (ssize_t)n);
	/* read the client's close frame (masked, 2+4+6 bytes), then FIN */
	uint8_t cf[64];
	ssize_t r = read(fd, cf, sizeof(cf));
	CHECK(r >= 6 && (cf[0] & 0x0f) == TL_OP_CLOSE && (cf[1] & 0x80));
	close(fd);
	return NULL;
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
	memset(&p, 0, sizeof(p));
	memcpy(&p.addr, &r, sizeof(r));
	p.addr_len = sizeof(r);
	p.alt = alt;
	p.nalt = 1;
	memcpy(&p.local, &local, sizeof(local));
	p.local_len = sizeof(local);
	p.host = "127.0.0.1";
	p.host_len = 9;
	p.path = "/";
	p.path_len = 1;
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

/* ---- the send queue: a peer that reads only after the close ---- */

struct sink {
	int lfd;
	int go;          /* set (atomic) when the sink may read */
	int msgs;        /* whole data messages read, in order */
	int frag_seen;   /* the fragmented message arrived whole */
	int pings;
	int close_code;
	int bad;         /* a check failed (the thread does not CHECK after reading starts) */
};

#define SQ_MSG 8192
#define SQ_FRAG_ID 1000000

static void sq_payload(uint8_t *p, size_t n, uint64_t id)
{
	memcpy(p, &id, 8);
	for (size_t j = 8; j < n; j++)
		p[j] = (uint8_t)(id + j);
}

/* read_full reads n bytes; 0 on EOF or error. */
static int read_full(int fd, uint8_t *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);
		if (r <= 0)
			return 0;
		p += r;
		n -= (size_t)r;
	}
	return 1;
}

static void *serve_sink(void *arg)
{
	struct sink *s = arg;
	char req[4096];
	uint8_t resp[512];
	int fd = accept_request(s->lfd, req, sizeof(req));
	static uint8_t msg[1 << 16], want[1 << 16];
	size_t mlen = 0, rl = upgrade_resp(req, resp, sizeof(resp));
	int in_msg = 0;

	CHECK(write(fd, resp, rl) == (ssize_t)rl);
	while (!__atomic_load_n(&s->go, __ATOMIC_ACQUIRE))
		usleep(1000);
	for (;;) {
		uint8_t h[14], key[4];
		uint64_t n;
		if (!read_full(fd, h, 2))
			break;
		n = h[1] & 0x7f;
		if (!(h[1] & 0x80)) {
			s->bad = 1; /* client frames are masked */
			break;
		}
		if (n == 126) {
			if (!read_full(fd, h + 2, 2))
				break;
			n = ((uint64_t)h[2] << 8) | h[3];
		} else if (n == 127) {
			if (!read_full(fd, h + 2, 8))
				break;
			n = 0;
			for (int i = 0; i < 8; i++)
				n = n << 8 | h[2 + i];
		}
		if (n > sizeof(msg) - mlen || !read_full(fd, key, 4) || !read_full(fd, msg + mlen, (size_t)n)) {
			s->bad = 2;
			break;
		}
		for (uint64_t j = 0; j < n; j++)
			msg[mlen + j] ^= key[j & 3];
		int op = h[0] & 0x0f, fin = h[0] >> 7;
		if (op == TL_OP_PING) {
			s->pings++;
			continue;
		}
		if (op == TL_OP_CLOSE) {
			s->close_code = n >= 2 ? (msg[mlen] << 8 | msg[mlen + 1]) : 1005;
			uint8_t cf[4] = {0x88, 2, msg[mlen], msg[mlen + 1]};
			if (write(fd, cf, 4) != 4)
				s->bad = 3;
			break;
		}
		if ((op == TL_OP_CONT) != in_msg) {
			s->bad = 4; /* fragments of two messages interleaved, or a message cut short */
			break;
		}
		mlen += (size_t)n;
		in_msg = !fin;
		if (!fin)
			continue;
		uint64_t id;
		memcpy(&id, msg, 8);
		sq_payload(want, mlen, id);
		if (memcmp(msg, want, mlen) != 0)
			s->bad = 5;
		else if (id == SQ_FRAG_ID && mlen == 3 * 10000)
			s->frag_seen = 1;
		else if (id != (uint64_t)s->msgs || mlen != SQ_MSG)
			s->bad = 6;
		else
			s->msgs++;
		mlen = 0;
	}
	if (in_msg)
		s->bad = 7; /* the close came inside a started message */
	close(fd);
	return NULL;
}

/* test_send_queue: 32 MiB of sends, a fragmented message, a ping, more
 * sends and a close, all pushed while the peer does not read: the loop
 * drains every command at once (no admission here), queues the frames per
 * connection, and the close jumps the queue. When the peer reads it sees
 * whole messages in order, the fragmented one whole or not at all, the
 * close last and well before the end of what was queued; every unit is
 * retired (written or dropped) in tx_done. */
static void test_send_queue(void)
{
	struct harness h;
	struct tl_event ev;
	struct sink s = {0};
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	pthread_t th;
	static uint8_t m[30000];
	const int before = 4000, after = 50;
	uint64_t units = 0;

	s.lfd = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(s.lfd >= 0);
	CHECK(bind(s.lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
	CHECK(listen(s.lfd, 4) == 0);
	CHECK(getsockname(s.lfd, (struct sockaddr *)&a, &al) == 0);
	CHECK(pthread_create(&th, NULL, serve_sink, &s) == 0);

	/* The close handshake ends when the sink has read the megabytes the
	 * kernel buffered before the close frame: how long that takes depends
	 * on the machine's load (200 ms was not always enough), not on the
	 * loop. No close timer is under test here, so none may cut it short:
	 * next_event's patience (over 10 s) is the bound. */
	start_cfg(&h, 1024, 0, 60000000000ull);
	struct tl_dial_params p;
	memset(&p, 0, sizeof(p));
	memcpy(&p.addr, &a, sizeof(a));
	p.addr_len = sizeof(a);
	p.host = "127.0.0.1";
	p.host_len = 9;
	p.path = "/";
	p.path_len = 1;
	CHECK(tl_dial_prepare(h.l, 2, &p) == 0);
	push(&h, TL_CMD_DIAL, 0, 0, 2, 7, NULL, 0);
	CHECK(next_event(&h, &ev, NULL, 0) && ev.kind == TL_EV_OPEN);
	for (int i = 0; i < before + after; i++) {
		if (i == before) {
			sq_payload(m, sizeof(m), SQ_FRAG_ID);
			push(&h, TL_CMD_SEND, TL_OP_BINARY, 0, 2, 7, m, 10000);
			push(&h, TL_CMD_SEND, TL_CMDF_CONT, 0, 2, 7, m + 10000, 10000);
			push(&h, TL_CMD_SEND, TL_CMDF_CONT | TL_CMDF_FIN, 0, 2, 7, m + 20000, 10000);
			push(&h, TL_CMD_PING, 0, 0, 2, 7, "hb", 2);
			units += 30000 + 2 + TL_CTRL_UNITS;
		}
		sq_payload(m, SQ_MSG, (uint64_t)i);
		push(&h, TL_CMD_SEND, TL_OP_BINARY | TL_CMDF_FIN, 0, 2, 7, m, SQ_MSG);
		units += SQ_MSG;
	}
	push(&h, TL_CMD_CLOSE, 0, 1000, 2, 7, "bye", 3);
	__atomic_store_n(&s.go, 1, __ATOMIC_RELEASE);
	CHECK(next_event(&h, &ev, NULL, 0));
	CHECK(ev.kind == TL_EV_CLOSE && ev.code == 1000 && (ev.flags & TL_EVF_FINAL));
	pthread_join(th, NULL);
	CHECK(s.bad == 0);
	CHECK(s.close_code == 1000);
	CHECK(s.msgs > 0 && s.msgs < before); /* the close jumped most of the queue */
	CHECK(__atomic_load_n(&tl_loop_conns(h.l)[2].tx_done, __ATOMIC_ACQUIRE) == units);
	printf("test_send_queue: %d of %d messages before the close\n", s.msgs, before + after);
	close(s.lfd);
	tl_loop_stop(h.l);
	tl_loop_free(h.l);
}

/* ---- heartbeat: a stalled loop thread is not a silent peer ---- */

#define HB_PINGS 30
#define HB_PING_GAP_MS 50

/* serve_pinger upgrades, sends HB_PINGS pings HB_PING_GAP_MS apart (a
 * peer that is alive), then stays connected and silent until the client
 * ends the connection (its read timeout), reading what it sends. */
static void *serve_pinger(void *arg)
{
	struct server *s = arg;
	char req[4096];
	uint8_t out[512], in[4096];
	int fd = accept_request(s->lfd, req, sizeof(req));
	size_t n = upgrade_resp(req, out, sizeof(out));

	CHECK(write(fd, out, n) == (ssize_t)n);
	for (int i = 0; i < HB_PINGS; i++) {
		uint8_t id = (uint8_t)i;
		usleep(HB_PING_GAP_MS * 1000);
		n = frame(out, 1, TL_OP_PING, &id, 1);
		CHECK(write(fd, out, n) == (ssize_t)n);
	}
	while (read(fd, in, sizeof(in)) > 0) /* pongs, until the client's FIN */
		;
	close(fd);
	return NULL;
}

static uint64_t mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* stall_handler stops the thread it runs on for 1 s: the loop thread,
 * signalled by test_heartbeat_stall. Async-signal-safe (nanosleep). */
static void stall_handler(int sig)
{
	struct timespec left = {.tv_sec = 1};
	(void)sig;
	while (nanosleep(&left, &left) < 0 && errno == EINTR)
		;
}

/* test_heartbeat_stall: a read timeout of 300 ms on a peer that pings
 * every 50 ms. The loop thread is stopped for 1 s twice (a signal handler
 * that sleeps on it: the loop does not run, as on a saturated machine)
 * while the peer goes on pinging; its pings wait in the kernel (with
 * DEFER_TASKRUN nothing completes until the loop enters it again). The
 * connection must stay open - every ping arrives - and once the peer
 * really goes silent, the read timeout must still end it: no sooner than
 * 300 ms after the last ping, and not much later. */
static void test_heartbeat_stall(void)
{
	struct harness h;
	struct tl_event ev;
	struct server s = {0};
	struct sockaddr_in a;
	struct sigaction sa;
	pthread_t th;
	uint8_t pl[256];
	int pings = 0, stalls = 0;
	uint64_t last_ping = 0, t_open;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = stall_handler;
	CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
	s.lfd = listen_local(&a);
	CHECK(pthread_create(&th, NULL, serve_pinger, &s) == 0);

	ring_flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN; /* the Pool's default */
	start(&h, 1024);
	ring_flags = 0;
	struct tl_dial_params p;
	local_dial(&p, &a);
	p.read_timeout_ns = 300000000ull;
	CHECK(tl_dial_prepare(h.l, 1, &p) == 0);
	push(&h, TL_CMD_DIAL, 0, 0, 1, 4, NULL, 0);
	CHECK(next_event(&h, &ev, NULL, 0) && ev.kind == TL_EV_OPEN);
	t_open = mono_ms();
	for (;;) {
		/* Stall the loop 1 s after 150 ms and again after 900 ms. */
		uint64_t t = mono_ms() - t_open;
		if ((stalls == 0 && t >= 150) || (stalls == 1 && t >= 900)) {
			CHECK(pthread_kill(h.l->thread, SIGUSR1) == 0);
			stalls++;
		}
		CHECK(next_event(&h, &ev, pl, sizeof(pl)));
		if (ev.kind == TL_EV_PING) {
			CHECK(ev.len == 1 && pl[0] == (uint8_t)pings);
			pings++;
			last_ping = mono_ms();
			continue;
		}
		break;
	}
	uint64_t quiet = mono_ms() - last_ping;
	printf("test_heartbeat_stall: %d pings over %d loop stalls of 1 s, then the read timeout after %llu ms\n",
	       pings, stalls, (unsigned long long)quiet);
	CHECK_EQ(pings, HB_PINGS); /* not ended while the loop, not the peer, was stopped */
	CHECK_EQ(stalls, 2);
	CHECK(ev.kind == TL_EV_ERROR && ev.err == TL_E_READ_TIMEOUT && (ev.flags & TL_EVF_FINAL));
	CHECK(quiet >= 250);       /* (the pump's own clock reads lag the loop's a little) */
	pthread_join(th, NULL);
	close(s.lfd);
	tl_loop_stop(h.l);
	tl_loop_free(h.l);
	sa.sa_handler = SIG_DFL;
	CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
}

static void *inline_intruder(void *arg)
{
	struct tl_loop *l = arg;
	/* Not the ring's thread: refused, and a stop marks the loop dead. */
	CHECK(tl_loop_inline_run(l, TL_INLINE_NOWAIT) == -EPERM);
	CHECK(tl_loop_inline_owner(l) == 0);
	tl_loop_stop(l);
	return NULL;
}

/* open_gated starts an inline loop (a 1024-event ring) and server s,
 * held at a new gate (gate[1] opens it), on its own thread th; dials slot
 * 5 (gen 9) to it and runs the loop until the open connection's recv is
 * armed in the main group (the regroup done) with no cancel in flight.
 * Returns that connection. */
static struct tl_conn *open_gated(struct harness *h, struct server *s, int gate[2], pthread_t *th)
{
	struct tl_event ev;
	struct sockaddr_in a;
	struct tl_dial_params p;

	CHECK(pipe(gate) == 0);
	s->gate = gate[0];
	s->lfd = listen_local(&a);
	CHECK(pthread_create(th, NULL, serve, s) == 0);
	start(h, 1024);
	local_dial(&p, &a);
	CHECK(tl_dial_prepare(h->l, 5, &p) == 0);
	push(h, TL_CMD_DIAL, 0, 0, 5, 9, NULL, 0);
	CHECK(next_event(h, &ev, NULL, 0) && ev.kind == TL_EV_OPEN);
	struct tl_conn *c = &h->l->conns[5];
	for (int i = 0; i < 2000 && !(c->rx == TL_RX_ARMED && !c->rx_hs && !c->cancel_inflight); i++) {
		CHECK(tl_loop_inline_run(h->l, TL_INLINE_NOWAIT) >= 0);
		usleep(100);
	}
	CHECK(c->rx == TL_RX_ARMED && !c->rx_hs && !c->cancel_inflight);
	return c;
}

/* close_gated undoes open_gated once its server has ended. */
static void close_gated(struct harness *h, struct server *s, int gate[2], pthread_t th)
{
	pthread_join(th, NULL);
	close(s->lfd);
	close(gate[0]);
	close(gate[1]);
	tl_loop_stop(h->l);
	tl_loop_free(h->l);
}

/* test_lost_recv: a multishot recv whose end the loop never sees (the
 * kernel's, in the field: tl_loop_probe_recvs in loop/probe.c) while the peer sends a
 * stream and closes. The test cancels the open connection's recv and
 * swallows its -ECANCELED (TL_DEBUG), which leaves the connection ARMED
 * with nothing in the kernel; then the server sends. The probe finds the
 * socket ready and the recv silent twice, revives it (its cancel finds
 * nothing: RX_GONE), and every frame and the close arrive in order. An
 * alarm bounds the test: without the probe the loop would wait forever. */
static void test_lost_recv(void)
{
	struct harness h;
	struct tl_event ev;
	int gate[2];
	pthread_t th;
	static uint8_t pl[256];
	struct server s = {.frames = 3000};
	struct tl_conn *c = open_gated(&h, &s, gate, &th);

	struct io_uring_sqe *sqe = io_uring_get_sqe(&h.l->ring);
	CHECK(sqe != NULL);
	io_uring_prep_cancel64(sqe, tl_rx_ud(c), 0);
	io_uring_sqe_set_data64(sqe, tl_ud(TL_OPK_CANCEL, c->gen, c->slot));
	c->cancel_inflight++;
	c->debug_lose_end = 1;
	for (int i = 0; i < 2000 && (c->cancel_inflight || c->debug_lose_end); i++) {
		CHECK(tl_loop_inline_run(h.l, TL_INLINE_NOWAIT) >= 0);
		usleep(100);
	}
	CHECK(!c->cancel_inflight && !c->debug_lose_end);
	CHECK(c->rx == TL_RX_ARMED); /* lost: nothing in the kernel */
	CHECK_EQ(h.l->stats->recv_revived, 0);
	alarm(20);
	CHECK(write(gate[1], "g", 1) == 1);
	for (int i = 0; i < s.frames; i++) {
		CHECK(next_event(&h, &ev, pl, sizeof(pl)));
		CHECK(ev.kind == TL_EV_BINARY && ev.len == 100 && pl[0] == (uint8_t)i && pl[99] == (uint8_t)i);
	}
	CHECK(next_event(&h, &ev, pl, sizeof(pl)));
	CHECK(ev.kind == TL_EV_CLOSE && ev.code == 1000 && (ev.flags & TL_EVF_FINAL));
	alarm(0);
	CHECK_EQ(h.l->stats->recv_revived, 1);
	close_gated(&h, &s, gate, th);
}

/* test_stuck_end: a cancel that finds the recv (res 0) whose END then
 * never comes. Live (a revival's cancel): the connection fails as lost
 * with EIO instead of waiting for good; closing (the teardown's cancel
 * after its close timed out): it finishes. Either within a few probes, well inside the
 * alarm; with RX_STUCK taken out both hang until it. */
static void test_stuck_end(int closing)
{
	struct harness h;
	struct tl_event ev;
	int gate[2];
	pthread_t th;
	struct server s = {.frames = 10, .gate_only = 1};
	struct tl_conn *c = open_gated(&h, &s, gate, &th);

	c->debug_lose_end = 1;
	if (closing) {
		push(&h, TL_CMD_CLOSE, 0, 1000, 5, 9, "bye", 3); /* the close timeout tears it down */
	} else {
		tl_rx_step(h.l, c, RX_REVIVE, 0);
		CHECK(c->rx == TL_RX_REARMING && c->cancel_inflight);
	}
	for (int i = 0; i < 30000 && (c->cancel_inflight || c->debug_lose_end); i++) { /* up to 3 s */
		CHECK(tl_loop_inline_run(h.l, TL_INLINE_NOWAIT) >= 0);
		usleep(100);
	}
	CHECK(!c->cancel_inflight && !c->debug_lose_end && c->rx_cancel_hit);
	CHECK(tl_rx_in_kernel(c)); /* as far as the loop knows: its END is lost */
	alarm(20);
	CHECK(next_event(&h, &ev, NULL, 0));
	CHECK(ev.slot == 5 && (ev.flags & TL_EVF_FINAL));
	if (closing)
		CHECK(ev.kind == TL_EV_ERROR && ev.err == TL_E_CLOSE_TIMEOUT);
	else
		CHECK(ev.kind == TL_EV_ERROR && ev.err == TL_E_LOST && ev.aux == EIO && ev.code == 1006);
	alarm(0);
	CHECK(c->rx == TL_RX_OFF);
	CHECK(write(gate[1], "g", 1) == 1); /* the server ends */
	close_gated(&h, &s, gate, th);
}

/* An inline loop run from another thread: -EPERM; stopped from another
 * thread while no one runs it: dead at once, and its own thread's next
 * call says so. */
static void test_inline_other_thread(void)
{
	struct harness h;
	pthread_t th;

	start(&h, 1024);
	CHECK(tl_loop_inline_owner(h.l) == 1);
	CHECK(tl_loop_inline_run(h.l, TL_INLINE_NOWAIT) == TL_INLINE_IDLE);
	CHECK(pthread_create(&th, NULL, inline_intruder, h.l) == 0);
	pthread_join(th, NULL);
	CHECK(tl_loop_inline_run(h.l, TL_INLINE_BLOCK) == -ESHUTDOWN);
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
	/* The same with minimum-wait batching on (loop.c, wait_batched):
	 * whether its gate opens depends on timing, what arrives does not. */
	min_wait_ns = 50000;
	test_socket();
	min_wait_ns = 0;
	recv_bundle = 0;
	/* The inline loop: the same stream with the loop run by this thread
	 * while it waits for events (tl_loop_inline_run), stopped here. */
	inline_loop = 1;
	test_socket();
	test_inline_other_thread();
	recv_bundle = 1;
	test_lost_recv();
	recv_bundle = 0;
	test_lost_recv();
	test_stuck_end(0);
	test_stuck_end(1);
	inline_loop = 0;
	test_send_queue();
	test_sampling();
	test_refused_upgrade();
	test_dial_during_stop();
	test_heartbeat_stall();
	printf("test_loop: %lu checks passed\n", check_passed);
	return 0;
}
