/* loop_harness.h - what the loop tests share: a harness that drives a loop
 * through the C API and the rings Go uses (push a command, wait for an event,
 * start a loop with the next test's settings), and a loopback server thread
 * that upgrades and then plays a script. Each test program is one
 * translation unit, so everything here is static; the programs use
 * different parts of it, hence the unused attributes. */
#ifndef TALARIS_TEST_LOOP_HARNESS_H
#define TALARIS_TEST_LOOP_HARNESS_H

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

static __attribute__((unused)) void push(struct harness *h, uint8_t op, uint8_t flags, uint16_t code, uint32_t slot, uint32_t gen,
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
static __attribute__((unused)) struct tl_stamp last_stamp;

/* inline_loop is the next loops' tl_config.inline_loop: no thread, and
 * next_event runs the loop on this thread while it waits (test_socket runs
 * both ways). */
static __attribute__((unused)) uint32_t inline_loop;

/* next_event waits (bounded) for one event and copies it out. */
static __attribute__((unused)) int next_event(struct harness *h, struct tl_event *out, uint8_t *payload, size_t cap)
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
static __attribute__((unused)) uint32_t recv_bundle;

/* min_wait_ns is the next loops' tl_config.min_wait_ns (0: off; with
 * min_wait_nr 8): test_socket runs once with minimum-wait batching on. */
static __attribute__((unused)) uint64_t min_wait_ns;

/* ring_flags is the next loops' tl_config.ring_flags (0: none). */
static __attribute__((unused)) uint32_t ring_flags;

/* start_cfg starts a loop with the harness's configuration: close_timeout_ns
 * bounds each close handshake (the tests' default is 200 ms). */
static __attribute__((unused)) void start_cfg(struct harness *h, uint32_t ev_size, uint32_t sample_every, uint64_t close_timeout_ns)
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

static __attribute__((unused)) void start_sampled(struct harness *h, uint32_t ev_size, uint32_t sample_every)
{
	start_cfg(h, ev_size, sample_every, 200000000ull);
}

static __attribute__((unused)) void start(struct harness *h, uint32_t ev_size) { start_sampled(h, ev_size, 0); }

static __attribute__((unused)) size_t frame(uint8_t *out, int fin, int op, const void *p, size_t n)
{
	return test_frame(out, fin, op, p, n, 0);
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
static __attribute__((unused)) int accept_request(int lfd, char *req, size_t cap)
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
static __attribute__((unused)) size_t upgrade_resp(const char *req, uint8_t *out, size_t cap)
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
static __attribute__((unused)) int listen_local(struct sockaddr_in *a)
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
static __attribute__((unused)) void local_dial(struct tl_dial_params *p, const struct sockaddr_in *a)
{
	memset(p, 0, sizeof(*p));
	memcpy(&p->addr, a, sizeof(*a));
	p->addr_len = sizeof(*a);
	p->host = "127.0.0.1";
	p->host_len = 9;
	p->path = "/";
	p->path_len = 1;
}

static __attribute__((unused)) void *serve(void *arg)
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

#endif
