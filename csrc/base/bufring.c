/* base/bufring.c - provided-buffer ring setup. */
#include "base/bufring.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int tl_bufring_init(struct tl_bufring *b, struct io_uring *ring, uint16_t bgid, uint32_t size, uint32_t count)
{
	struct io_uring_buf_reg reg;
	int ret;

	memset(b, 0, sizeof(*b));
	if (count == 0 || count > 32768 || (count & (count - 1)) || size == 0)
		return -EINVAL;
	b->ring_bytes = (size_t)count * sizeof(struct io_uring_buf);
	b->base_bytes = (size_t)count * size;
	/* The ring must be page aligned: mmap gives that. */
	b->br = mmap(NULL, b->ring_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (b->br == MAP_FAILED) {
		b->br = NULL;
		return -errno;
	}
	b->bids = calloc(count, sizeof(*b->bids));
	b->taken = calloc(count, sizeof(*b->taken));
	b->parked = calloc(count, sizeof(*b->parked));
	if (!b->bids || !b->taken || !b->parked) {
		tl_bufring_free(b, NULL);
		return -ENOMEM;
	}
	/* The slots' memory is mapped lazily (the kernel faults a page in
	 * the first time it receives into it); tl_loop_prefault populates it
	 * up front when Tuning.Prefault asks. */
	b->base = mmap(NULL, b->base_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (b->base == MAP_FAILED) {
		int err = errno;
		b->base = NULL;
		tl_bufring_free(b, NULL);
		return -err;
	}
	memset(&reg, 0, sizeof(reg));
	reg.ring_addr = (uint64_t)(uintptr_t)b->br;
	reg.ring_entries = count;
	reg.bgid = bgid;
	ret = io_uring_register_buf_ring(ring, &reg, 0);
	if (ret) {
		tl_bufring_free(b, NULL);
		return ret;
	}
	b->size = size;
	b->count = count;
	b->mask = (uint32_t)io_uring_buf_ring_mask(count);
	b->bgid = bgid;
	io_uring_buf_ring_init(b->br);
	b->in_use = count; /* recycle() below decrements per slot */
	for (uint32_t i = 0; i < count; i++)
		tl_bufring_recycle(b, i);
	tl_bufring_commit(b);
	return 0;
}

void tl_bufring_free(struct tl_bufring *b, struct io_uring *ring)
{
	if (ring && b->br)
		io_uring_unregister_buf_ring(ring, b->bgid);
	if (b->base)
		munmap(b->base, b->base_bytes);
	if (b->br)
		munmap(b->br, b->ring_bytes);
	free(b->bids);
	free(b->taken);
	free(b->parked);
	memset(b, 0, sizeof(*b));
}

uint32_t tl_bufring_claim_slow(struct tl_bufring *b, uint32_t bid, uint32_t *n)
{
	uint32_t p = b->head, k = 0;

	/* The unclaimed position holding bid (each id is in the ring once). */
	while (p != b->tail && (b->taken[p & b->mask] || b->bids[p & b->mask] != bid))
		p++;
	if (p == b->tail) {
		/* Not in the ring as we know it: the kernel broke the order
		 * the ring relies on. Only bid is known to be ours. */
#ifdef TL_DEBUG
		fprintf(stderr, "talaris: buffer %u of group %u completed from no ring position\n", bid, b->bgid);
		abort();
#endif
		b->ooo++;
		b->in_use++;
		*n = 1; /* bid alone: the caller takes its one slot */
		return p;
	}
	/* Unclaimed positions only: a position another claim took is that
	 * completion's buffer, and counting it twice would keep ntaken from
	 * ever returning to 0 (and hand its slot out twice). */
	while (k < *n && p + k != b->tail && !b->taken[(p + k) & b->mask]) {
		b->taken[(p + k) & b->mask] = 1;
		k++;
	}
	if (p != b->head || k != *n)
		b->ooo++;
	*n = k;
	b->ntaken += k;
	b->in_use += k;
	while (b->head != b->tail && b->taken[b->head & b->mask]) {
		b->taken[b->head & b->mask] = 0;
		b->ntaken--;
		b->head++;
	}
	return p;
}

void tl_bufring_unpark(struct tl_bufring *b)
{
	while (b->nparked && b->tail - b->head < b->count)
		tl_bufring_add(b, b->parked[--b->nparked]);
}
