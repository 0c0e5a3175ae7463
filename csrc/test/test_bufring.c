/* test_bufring.c - the buffer ring's consumption order (bufring.h): the
 * ids a completion hands over, in order, however slots come back; claims
 * out of order stay exact (nothing lost, nothing handed out twice); and
 * against the kernel, recv bundles over a loopback TCP socket with slots
 * recycled out of order deliver the byte stream intact. Under ASan/UBSan. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/bufring.h"
#include "base/slots.h"
#include "loop/uring.h"
#include "check.h"

/* ring_ids checks that the positions the kernel may still hand out
 * ([head, tail)) and the ids held (held[0..nheld)) and parked together
 * hold every id exactly once: no slot lost, none in two places. */
static void ring_ids(const struct tl_bufring *b, const uint32_t *held, uint32_t nheld)
{
	int seen[64] = {0};
	uint32_t n = 0;

	CHECK(b->count <= 64);
	for (uint32_t p = b->head; p != b->tail; p++) {
		if (b->taken[p & b->mask])
			continue;
		CHECK_EQ(seen[tl_bufring_bid_at(b, p)]++, 0);
		n++;
	}
	for (uint32_t i = 0; i < nheld; i++, n++)
		CHECK_EQ(seen[held[i]]++, 0);
	for (uint32_t i = 0; i < b->nparked; i++, n++)
		CHECK_EQ(seen[b->parked[i]]++, 0);
	CHECK_EQ(n, b->count);
	CHECK_EQ(b->in_use, nheld + b->nparked);
}

/* claim is tl_bufring_claim of n buffers that the ring holds unclaimed:
 * none of them is cut. */
static uint32_t claim(struct tl_bufring *b, uint32_t bid, uint32_t n)
{
	uint32_t k = n, p = tl_bufring_claim(b, bid, &k);
	CHECK_EQ(k, n);
	return p;
}

/* test_order: claims in ring order, slots recycled out of order, then a
 * claim that skips a position (the kernel never does; the ring must stay
 * exact anyway), parking while the skipped position holds head back. */
static void test_order(void)
{
	struct io_uring ring;
	struct tl_bufring b;
	uint32_t held[8], p;

	CHECK_EQ(io_uring_queue_init(8, &ring, 0), 0);
	CHECK_EQ(tl_bufring_init(&b, &ring, 3, 64, 8), 0);
	ring_ids(&b, NULL, 0);
	/* a bundle of 3 from the start: ids 0, 1, 2 */
	p = claim(&b, 0, 3);
	CHECK_EQ(p, 0);
	CHECK_EQ(tl_bufring_bid_at(&b, p + 1), 1);
	CHECK_EQ(tl_bufring_bid_at(&b, p + 2), 2);
	held[0] = 2;
	ring_ids(&b, (uint32_t[]){0, 1, 2}, 3);
	/* 1 and 0 come back (reversed): positions 8 and 9 */
	tl_bufring_recycle(&b, 1);
	tl_bufring_recycle(&b, 0);
	tl_bufring_commit(&b);
	ring_ids(&b, held, 1);
	CHECK_EQ(claim(&b, 3, 1), 3);
	/* out of order: positions 5 and 6 (ids 5, 6) before position 4 */
	p = claim(&b, 5, 2);
	CHECK_EQ(p, 5);
	CHECK_EQ(b.ooo, 1);
	CHECK_EQ(b.head, 4);
	held[1] = 3, held[2] = 5, held[3] = 6;
	ring_ids(&b, held, 4);
	/* entries run out while position 4 holds head back: 2 and 3 park */
	tl_bufring_recycle(&b, 5);
	tl_bufring_recycle(&b, 6);
	tl_bufring_recycle(&b, 2);
	tl_bufring_recycle(&b, 3);
	CHECK_EQ(b.nparked, 2);
	ring_ids(&b, NULL, 0);
	tl_bufring_commit(&b);
	CHECK_EQ(b.nparked, 2); /* still no free entry */
	/* position 4 is claimed: head passes 4, 5, 6; the parked ids go in */
	CHECK_EQ(claim(&b, 4, 1), 4);
	CHECK_EQ(b.head, 7);
	CHECK_EQ(b.ntaken, 0);
	tl_bufring_commit(&b);
	CHECK_EQ(b.nparked, 0);
	ring_ids(&b, (uint32_t[]){4}, 1);
	/* in order again: positions 7, 8, 9 are ids 7, 1, 0 */
	p = claim(&b, 7, 3);
	CHECK_EQ(p, 7);
	CHECK_EQ(tl_bufring_bid_at(&b, p + 1), 1);
	CHECK_EQ(tl_bufring_bid_at(&b, p + 2), 0);
	CHECK_EQ(b.ooo, 1);
	ring_ids(&b, (uint32_t[]){4, 7, 1, 0}, 4);
	tl_bufring_free(&b, &ring);
	io_uring_queue_exit(&ring);
}

/* test_overlap: an out-of-order claim that runs into positions an earlier
 * claim took (the kernel never sends one) is cut there: no buffer is
 * handed out twice, ntaken returns to 0 once head passes them and the
 * fast path is back. (Before: the overlap was counted twice, ntaken never
 * reached 0 and every later claim took the slow path.) */
static void test_overlap(void)
{
	struct io_uring ring;
	struct tl_bufring b;
	uint32_t k, p;

	CHECK_EQ(io_uring_queue_init(8, &ring, 0), 0);
	CHECK_EQ(tl_bufring_init(&b, &ring, 3, 64, 8), 0);
	CHECK_EQ(claim(&b, 2, 2), 2); /* positions 2, 3 first */
	k = 4;                        /* then 4 from position 0: 0, 1 only */
	p = tl_bufring_claim(&b, 0, &k);
	CHECK_EQ(p, 0);
	CHECK_EQ(k, 2);
	CHECK_EQ(b.head, 4);
	CHECK_EQ(b.ntaken, 0);
	ring_ids(&b, (uint32_t[]){0, 1, 2, 3}, 4);
	k = 3; /* a claim past the ring's tail: cut at the tail */
	p = tl_bufring_claim(&b, 4, &k);
	CHECK_EQ(p, 4);
	CHECK_EQ(k, 3);
	k = 5;
	p = tl_bufring_claim(&b, 7, &k);
	CHECK_EQ(p, 7);
	CHECK_EQ(k, 1);
	CHECK_EQ(b.ooo, 3);
	CHECK_EQ(b.ntaken, 0);
	ring_ids(&b, (uint32_t[]){0, 1, 2, 3, 4, 5, 6, 7}, 8);
	for (uint32_t i = 0; i < 8; i++)
		tl_bufring_recycle(&b, i);
	tl_bufring_commit(&b);
	CHECK_EQ(claim(&b, 0, 2), 8); /* the fast path again */
	CHECK_EQ(b.ooo, 3);
	tl_bufring_free(&b, &ring);
	io_uring_queue_exit(&ring);
}

/* test_wrap: positions are 32-bit counters that wrap (every 2^32 buffers:
 * hours at full rate); a bundle that starts at position 0xffffffff is a
 * bundle like any other, and tl_slots_take links all its buffers. (Before:
 * that position doubled as the "no position" answer, so only the first
 * buffer was taken: the rest of the bundle's bytes were lost and its
 * other slots never came back.) */
static void test_wrap(void)
{
	struct io_uring ring;
	struct tl_slots s;
	uint32_t last, n, q, want[3];

	CHECK_EQ(io_uring_queue_init(8, &ring, 0), 0);
	CHECK_EQ(tl_slots_alloc(&s, 16), 0);
	CHECK_EQ(tl_slots_register(&s, &ring, 64, 16), 0);
	/* Shift the positions by a multiple of the ring's size: the entries
	 * stay where they are. */
	s.main.head += 0xfffffff0u;
	s.main.tail += 0xfffffff0u;
	for (int i = 0; i < 15; i++) {
		q = tl_slots_take(&s, 0, tl_bufring_bid_at(&s.main, s.main.head), 64, &last, &n);
		CHECK_EQ(n, 1);
		tl_slots_recycle_chain(&s, q);
		tl_slots_commit(&s);
	}
	CHECK_EQ(s.main.head, 0xffffffffu);
	for (uint32_t i = 0; i < 3; i++)
		want[i] = tl_bufring_bid_at(&s.main, s.main.head + i);
	q = tl_slots_take(&s, 0, want[0], 2 * 64 + 10, &last, &n);
	CHECK_EQ(n, 3);
	CHECK_EQ(q, want[0]);
	CHECK_EQ(s.len[q], 64);
	CHECK_EQ((uint32_t)s.next[q], want[1]);
	CHECK_EQ(s.len[want[1]], 64);
	CHECK_EQ((uint32_t)s.next[want[1]], want[2]);
	CHECK_EQ(s.len[want[2]], 10);
	CHECK_EQ(s.next[want[2]], -1);
	CHECK_EQ(last, want[2]);
	CHECK_EQ(s.main.head, 2);
	CHECK_EQ(s.main.in_use, 3);
	CHECK_EQ(s.main.ooo, 0);
	tl_slots_recycle_chain(&s, q);
	tl_slots_commit(&s);
	CHECK_EQ(s.main.in_use, 0);
	tl_slots_free(&s, &ring);
	io_uring_queue_exit(&ring);
}

/* ---- recv bundles against the kernel ---- */

#define KB_SIZE 256u
#define KB_COUNT 32u
#define KB_TOTAL (3u << 20)

static uint8_t pattern(uint64_t off) { return (uint8_t)(off * 7 + (off >> 8)); }

static void arm(struct io_uring *ring, int fd)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
	CHECK(sqe != NULL);
	io_uring_prep_recv_multishot(sqe, fd, NULL, 0, 0);
	sqe->flags |= IOSQE_BUFFER_SELECT;
	sqe->buf_group = 5;
	sqe->ioprio |= IORING_RECVSEND_BUNDLE;
	io_uring_sqe_set_data64(sqe, 1);
	CHECK(io_uring_submit(ring) == 1);
}

/* test_bundle_kernel: a writer sends KB_TOTAL patterned bytes in writes of
 * varying size; the reader takes every completion's buffers with
 * tl_bufring_claim, checks their bytes at the stream offset, and gives
 * them back in a scrambled order (some held over to later completions),
 * so the ring's ids are never consecutive. Every byte arrives, in order,
 * bundles of several buffers happen, and every slot comes back. */
static void test_bundle_kernel(void)
{
	struct io_uring ring;
	struct io_uring_params prm;
	struct tl_bufring b;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);
	uint32_t held[KB_COUNT], nheld = 0, maxn = 0, cqes = 0;
	uint64_t got = 0, sent = 0, seed = 12345;
	static uint8_t wbuf[70000];
	int lfd, wfd, rfd, armed = 0;

	memset(&prm, 0, sizeof(prm));
	CHECK_EQ(io_uring_queue_init_params(64, &ring, &prm), 0);
	if (!(prm.features & IORING_FEAT_RECVSEND_BUNDLE)) {
		printf("test_bundle_kernel: kernel without recv bundles, skipped\n");
		io_uring_queue_exit(&ring);
		return;
	}
	CHECK_EQ(tl_bufring_init(&b, &ring, 5, KB_SIZE, KB_COUNT), 0);
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	CHECK(lfd >= 0);
	CHECK(bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0);
	CHECK(listen(lfd, 1) == 0);
	CHECK(getsockname(lfd, (struct sockaddr *)&a, &al) == 0);
	wfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	CHECK(wfd >= 0);
	CHECK(connect(wfd, (struct sockaddr *)&a, sizeof(a)) == 0 || errno == EINPROGRESS);
	rfd = accept(lfd, NULL, NULL);
	CHECK(rfd >= 0);
	while (got < KB_TOTAL) {
		struct io_uring_cqe *cqe;
		/* write what the socket takes, in sizes from 1 byte to 70000 */
		if (sent < KB_TOTAL) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			size_t n = 1 + (size_t)(seed >> 33) % sizeof(wbuf);
			if (n > KB_TOTAL - sent)
				n = KB_TOTAL - sent;
			for (size_t i = 0; i < n; i++)
				wbuf[i] = pattern(sent + i);
			ssize_t w = write(wfd, wbuf, n);
			CHECK(w > 0 || errno == EAGAIN);
			if (w > 0)
				sent += (uint64_t)w;
		}
		if (!armed) {
			arm(&ring, rfd);
			armed = 1;
		}
		struct __kernel_timespec ts = {.tv_nsec = 2000000};
		int r = io_uring_wait_cqe_timeout(&ring, &cqe, &ts);
		if (r == -ETIME)
			goto give_back;
		CHECK_EQ(r, 0);
		cqes++;
		if (cqe->flags & IORING_CQE_F_BUFFER) {
			uint32_t bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT, left = (uint32_t)cqe->res;
			uint32_t n = (left + KB_SIZE - 1) / KB_SIZE;
			CHECK(cqe->res > 0);
			uint32_t p = claim(&b, bid, n);
			if (n > maxn)
				maxn = n;
			for (uint32_t i = 0; i < n; i++) {
				uint32_t id = tl_bufring_bid_at(&b, p + i), k = left < KB_SIZE ? left : KB_SIZE;
				const uint8_t *d = tl_bufring_slot(&b, id);
				for (uint32_t j = 0; j < k; j++)
					if (d[j] != pattern(got + j)) {
						fprintf(stderr, "byte %llu: %u, want %u\n", (unsigned long long)(got + j), d[j],
							pattern(got + j));
						CHECK(0);
					}
				got += k;
				left -= k;
				held[nheld++] = id;
			}
		} else {
			CHECK(cqe->res == -ENOBUFS); /* the ring ran dry while we held slots */
		}
		if (!(cqe->flags & IORING_CQE_F_MORE))
			armed = 0;
		io_uring_cqe_seen(&ring, cqe);
	give_back:
		/* Give back all but a few, last taken first, every third held
		 * over: ids come back far from consecutive. */
		for (uint32_t i = nheld; i-- > 0;) {
			if (nheld <= 3 && got < KB_TOTAL)
				break;
			if (i % 3 == 1 && got < KB_TOTAL)
				continue;
			tl_bufring_recycle(&b, held[i]);
			held[i] = held[--nheld];
		}
		tl_bufring_commit(&b);
	}
	CHECK_EQ(got, KB_TOTAL);
	CHECK_EQ(b.ooo, 0);
	CHECK(maxn > 1); /* bundles happened */
	for (uint32_t i = 0; i < nheld; i++)
		tl_bufring_recycle(&b, held[i]);
	tl_bufring_commit(&b);
	CHECK_EQ(b.in_use, 0);
	CHECK_EQ(b.tail - b.head, KB_COUNT - 0u);
	printf("test_bundle_kernel: %u completions, up to %u buffers each\n", cqes, maxn);
	close(wfd);
	close(rfd);
	close(lfd);
	tl_bufring_free(&b, &ring);
	io_uring_queue_exit(&ring);
}

int main(void)
{
	test_order();
	test_overlap();
	test_wrap();
	test_bundle_kernel();
	printf("test_bufring: %lu checks passed\n", check_passed);
	return 0;
}
