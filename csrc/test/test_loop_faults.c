/* test_loop_faults.c - the loop against peers and threads that misbehave,
 * under ASan/UBSan: a peer that reads only after the close (the send
 * queue), a stalled loop thread (the heartbeat), a receive the kernel
 * never completes (the receive probe), and an inline loop run from the
 * wrong thread. */
#define _GNU_SOURCE
#include "loop_harness.h"

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
 * connection, and the close waits behind them. When the peer reads it sees
 * every message whole and in order, the fragmented one whole, the ping,
 * and the close last; every unit is retired as written in tx_done, none
 * dropped. */
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
	local_dial(&p, &a);
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
			units += 30000 + TL_UNIT_MSG + 2 + TL_CTRL_UNITS + TL_UNIT_MSG;
		}
		sq_payload(m, SQ_MSG, (uint64_t)i);
		push(&h, TL_CMD_SEND, TL_OP_BINARY | TL_CMDF_FIN, 0, 2, 7, m, SQ_MSG);
		units += SQ_MSG + TL_UNIT_MSG;
	}
	push(&h, TL_CMD_CLOSE, 0, 1000, 2, 7, "bye", 3);
	__atomic_store_n(&s.go, 1, __ATOMIC_RELEASE);
	CHECK(next_event(&h, &ev, NULL, 0));
	CHECK(ev.kind == TL_EV_CLOSE && ev.code == 1000 && (ev.flags & TL_EVF_FINAL));
	pthread_join(th, NULL);
	CHECK(s.bad == 0);
	CHECK(s.close_code == 1000);
	CHECK(s.msgs == before + after && s.frag_seen && s.pings == 1); /* Close kept what it accepted */
	CHECK(__atomic_load_n(&tl_loop_conns(h.l)[2].tx_done, __ATOMIC_ACQUIRE) == units);
	CHECK(__atomic_load_n(&tl_loop_conns(h.l)[2].tx_dropped, __ATOMIC_ACQUIRE) == 0);
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
	c->probe.debug_lose_end = 1;
	for (int i = 0; i < 2000 && (c->cancel_inflight || c->probe.debug_lose_end); i++) {
		CHECK(tl_loop_inline_run(h.l, TL_INLINE_NOWAIT) >= 0);
		usleep(100);
	}
	CHECK(!c->cancel_inflight && !c->probe.debug_lose_end);
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

	c->probe.debug_lose_end = 1;
	if (closing) {
		push(&h, TL_CMD_CLOSE, 0, 1000, 5, 9, "bye", 3); /* the close timeout tears it down */
	} else {
		tl_rx_step(h.l, c, RX_REVIVE, 0);
		CHECK(c->rx == TL_RX_REARMING && c->cancel_inflight);
	}
	for (int i = 0; i < 30000 && (c->cancel_inflight || c->probe.debug_lose_end); i++) { /* up to 3 s */
		CHECK(tl_loop_inline_run(h.l, TL_INLINE_NOWAIT) >= 0);
		usleep(100);
	}
	CHECK(!c->cancel_inflight && !c->probe.debug_lose_end && c->probe.cancel_hit);
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
	/* The inline loop, run by this thread while it waits for events. */
	inline_loop = 1;
	test_inline_other_thread();
	recv_bundle = 1;
	test_lost_recv();
	recv_bundle = 0;
	test_lost_recv();
	test_stuck_end(0);
	test_stuck_end(1);
	inline_loop = 0;
	test_send_queue();
	test_heartbeat_stall();
	printf("test_loop_faults: %lu checks passed\n", check_passed);
	return 0;
}
