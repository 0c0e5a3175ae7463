/* base/slots.c - receive slot tables and the two buffer groups' set-up. */
#include "base/slots.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int tl_slots_alloc(struct tl_slots *s, uint32_t count)
{
	uint32_t npt = tl_slots_pt_count(count), n = count + TL_HS_COUNT + npt, cap = 1;

	memset(s, 0, sizeof(*s));
	while (cap < n)
		cap <<= 1;
	s->next = calloc(n, sizeof(*s->next));
	s->len = calloc(n, sizeof(*s->len));
	s->ref = calloc(n, sizeof(*s->ref));
	s->defer_q = calloc(cap, sizeof(*s->defer_q)); /* holds every slot at once: never overflows */
	s->defer_mask = cap - 1;
	s->pt_first = count + TL_HS_COUNT;
	s->pt_count = npt;
	s->pt_free = calloc(npt, sizeof(*s->pt_free));
	return s->next && s->len && s->ref && s->defer_q && s->pt_free ? 0 : -ENOMEM;
}

int tl_slots_pt_map(struct tl_slots *s)
{
	void *m;

	if (s->pt_mem)
		return 0;
	m = mmap(NULL, (size_t)s->pt_count * TL_PT_SLOT, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (m == MAP_FAILED)
		return -ENOMEM;
	__atomic_store_n(&s->pt_mem, (uint8_t *)m, __ATOMIC_RELAXED); /* tl_slots_origin may read it from Go's thread */
	/* Highest id at the bottom: slots are handed out from pt_first up. */
	for (uint32_t i = 0; i < s->pt_count; i++)
		s->pt_free[i] = s->pt_first + s->pt_count - 1 - i;
	s->pt_nfree = s->pt_count;
	return 0;
}

int tl_slots_register(struct tl_slots *s, struct io_uring *ring, uint32_t size, uint32_t count)
{
	int ret = tl_bufring_init(&s->main, ring, TL_BGID, size, count);
	if (ret == 0)
		ret = tl_bufring_init(&s->hs, ring, TL_HS_BGID, size, TL_HS_COUNT);
	return ret;
}

void tl_slots_free(struct tl_slots *s, struct io_uring *ring)
{
	if (ring) {
		tl_bufring_free(&s->main, ring);
		tl_bufring_free(&s->hs, ring);
	}
	free(s->next);
	free(s->len);
	free(s->ref);
	free(s->defer_q);
	free(s->pt_free);
	if (s->pt_mem)
		munmap(s->pt_mem, (size_t)s->pt_count * TL_PT_SLOT);
	memset(s, 0, sizeof(*s));
}

int tl_slots_origin(const struct tl_slots *s, const uint8_t *p)
{
	const struct tl_bufring *g[2] = {&s->main, &s->hs};
	const uint8_t *pt = __atomic_load_n(&s->pt_mem, __ATOMIC_RELAXED);

	for (int i = 0; i < 2; i++)
		if (g[i]->base && p >= g[i]->base && p < g[i]->base + (size_t)g[i]->count * g[i]->size)
			return TL_SLOTS_RECV;
	if (pt && p >= pt && p < pt + (size_t)s->pt_count * TL_PT_SLOT)
		return TL_SLOTS_PT;
	return 0;
}

void tl_slots_release_deferred(struct tl_slots *s, uint64_t ev_head)
{
	/* Release order is close to event order; one slot still referenced
	 * holds back the ones behind it a little. */
	while (s->defer_head != s->defer_tail) {
		uint32_t q = s->defer_q[s->defer_head & s->defer_mask];
		if (s->ref[q] > ev_head)
			break;
		s->ref[q] = 0;
		tl_slots_recycle(s, q);
		s->defer_head++;
	}
}
