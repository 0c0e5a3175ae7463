/* bufring.c - provided-buffer ring setup. */
#include "bufring.h"

#include <errno.h>
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
	b->base = mmap(NULL, b->base_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (b->base == MAP_FAILED) {
		b->base = NULL;
		munmap(b->br, b->ring_bytes);
		b->br = NULL;
		return -errno;
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
	memset(b, 0, sizeof(*b));
}
