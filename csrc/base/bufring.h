/* base/bufring.h - one registered provided-buffer ring: the kernel picks a slot
 * for every multishot recv completion and we hand slots back when their
 * bytes are consumed. liburing 2.3 has no io_uring_setup_buf_ring, so the
 * ring is mmapped and registered by hand.
 *
 * Consumption order. The kernel takes buffers from the ring's head, in
 * ring order. A recv bundle (IORING_RECVSEND_BUNDLE) completion names only
 * its first buffer id; the others are the ring entries after it, whose ids
 * are not consecutive (slots come back out of order). So the ring keeps a
 * copy of the id it added at every position (bids[]) and the position of
 * the first buffer no completion has handed us yet (head): a completion
 * claims the n positions from there (tl_bufring_claim). Completions carry
 * their buffers in ring order (the kernel commits a recv's buffers and
 * posts its completion before the next recv selects any), and a claim that
 * does not start at head is still exact (tl_bufring_claim_slow): its
 * positions are marked taken and head skips them later; a recycle that
 * would overwrite a position not yet claimed waits in parked[] instead. */
#ifndef TALARIS_BUFRING_H
#define TALARIS_BUFRING_H

#include <liburing.h>
#include <stdint.h>

struct tl_bufring {
	struct io_uring_buf_ring *br; /* shared with the kernel */
	uint8_t *base;                /* count * size bytes of slots */
	uint32_t size, count, mask;
	uint16_t bgid;
	uint32_t pending;             /* slots added since the last commit */
	uint32_t in_use;              /* slots held by us (not in the kernel) */
	size_t ring_bytes, base_bytes;
	/* Consumption order (above): positions count up (the kernel's are
	 * their low 16 bits); a position's ring entry is pos & mask. */
	uint16_t *bids;               /* per entry: the id added there last */
	uint8_t *taken;               /* per entry: claimed out of order (head has not passed it) */
	uint32_t tail;                /* positions added (committed or pending) */
	uint32_t head;                /* first position not yet claimed */
	uint32_t ntaken;              /* positions marked in taken[] */
	uint32_t *parked;             /* recycled ids waiting for a free entry (out-of-order claims only) */
	uint32_t nparked;
	uint32_t ooo;                 /* claims that did not start at head (never expected; tests read it) */
};

/* tl_bufring_init maps count slots of size bytes (count a power of two <=
 * 32768) and registers them as group bgid with ring. Returns 0 or a
 * negative errno; on failure nothing stays mapped. */
int tl_bufring_init(struct tl_bufring *b, struct io_uring *ring, uint16_t bgid, uint32_t size, uint32_t count);

/* tl_bufring_free unregisters (if ring is not NULL) and unmaps. */
void tl_bufring_free(struct tl_bufring *b, struct io_uring *ring);

static inline uint8_t *tl_bufring_slot(const struct tl_bufring *b, uint32_t bid)
{
	return b->base + (size_t)bid * b->size;
}

/* tl_bufring_claim_slow is tl_bufring_claim off its fast path: a claim
 * that does not start at head, or one after such a claim (never expected,
 * see above). Marks the claimed positions taken, moves head past the taken
 * ones and returns bid's position, *n cut to the positions claimed: the
 * claim ends at the ring's tail or at a position an earlier claim took (a
 * completion can name neither; what it says beyond is lost, counted in
 * ooo). When bid is in no unclaimed position, *n = 1: bid alone is known
 * to be ours (counted in use and in ooo), and the position returned (the
 * tail) holds none of the claim, so the caller reads no id from it. *n is
 * never 0 for a claim of at least one buffer. */
uint32_t tl_bufring_claim_slow(struct tl_bufring *b, uint32_t bid, uint32_t *n);

/* tl_bufring_claim notes that a completion handed us *n buffers, bid first
 * and the others the *n - 1 ring entries after it, and returns bid's
 * position (positions are 32-bit counters that wrap: every value is one).
 * *n is left as it is, or cut by tl_bufring_claim_slow (to 1, bid alone,
 * when bid is in no position: the caller then reads no id at pos). The
 * caller reads the ids (tl_bufring_bid_at(pos + i), i >= 1) before
 * it recycles any buffer: a recycle may reuse the entries of claimed
 * positions. */
static inline uint32_t tl_bufring_claim(struct tl_bufring *b, uint32_t bid, uint32_t *n)
{
	uint32_t p = b->head;

	if (__builtin_expect(b->bids[p & b->mask] == bid && b->tail - p >= *n && !b->ntaken, 1)) {
		b->head = p + *n;
		b->in_use += *n;
		return p;
	}
	return tl_bufring_claim_slow(b, bid, n);
}

static inline uint32_t tl_bufring_bid_at(const struct tl_bufring *b, uint32_t pos) { return b->bids[pos & b->mask]; }

/* tl_bufring_add writes bid at position tail (the caller checked that its
 * entry holds no unclaimed position); visible after commit. */
static inline void tl_bufring_add(struct tl_bufring *b, uint32_t bid)
{
	io_uring_buf_ring_add(b->br, tl_bufring_slot(b, bid), b->size, (unsigned short)bid, (int)b->mask,
			      (int)b->pending);
	b->bids[b->tail & b->mask] = (uint16_t)bid;
	b->tail++;
	b->pending++;
	b->in_use--;
}

/* tl_bufring_recycle queues slot bid for the kernel; visible after commit. */
static inline void tl_bufring_recycle(struct tl_bufring *b, uint32_t bid)
{
	/* Entry tail & mask is free while head is less than a ring behind:
	 * always, unless an out-of-order claim holds head back. Then the id
	 * waits (still counted in use) until tl_bufring_commit. */
	if (__builtin_expect(b->tail - b->head >= b->count, 0)) {
		b->parked[b->nparked++] = bid; /* at most count: each id is parked once */
		return;
	}
	tl_bufring_add(b, bid);
}

/* tl_bufring_unpark adds parked ids whose entries are free now. */
void tl_bufring_unpark(struct tl_bufring *b);

/* tl_bufring_commit publishes recycled slots with one tail store. */
static inline void tl_bufring_commit(struct tl_bufring *b)
{
	if (__builtin_expect(b->nparked != 0, 0))
		tl_bufring_unpark(b);
	if (b->pending) {
		io_uring_buf_ring_advance(b->br, (int)b->pending);
		b->pending = 0;
	}
}

#endif
