/* bufring.h - one registered provided-buffer ring: the kernel picks a slot
 * for every multishot recv completion and we hand slots back when their
 * bytes are consumed. liburing 2.3 has no io_uring_setup_buf_ring, so the
 * ring is mmapped and registered by hand. */
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

/* tl_bufring_taken notes that the kernel handed us slot bid. */
static inline void tl_bufring_taken(struct tl_bufring *b) { b->in_use++; }

/* tl_bufring_recycle queues slot bid for the kernel; visible after commit. */
static inline void tl_bufring_recycle(struct tl_bufring *b, uint32_t bid)
{
	io_uring_buf_ring_add(b->br, tl_bufring_slot(b, bid), b->size, (unsigned short)bid, (int)b->mask,
			      (int)b->pending);
	b->pending++;
	b->in_use--;
}

/* tl_bufring_commit publishes recycled slots with one tail store. */
static inline void tl_bufring_commit(struct tl_bufring *b)
{
	if (b->pending) {
		io_uring_buf_ring_advance(b->br, (int)b->pending);
		b->pending = 0;
	}
}

#endif
