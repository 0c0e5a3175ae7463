/* slots.c - receive slot tables and the two buffer groups' set-up. */
#include "slots.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int tl_slots_alloc(struct tl_slots *s, uint32_t count)
{
	uint32_t n = count + TL_HS_COUNT, cap = 1;

	memset(s, 0, sizeof(*s));
	while (cap < n)
		cap <<= 1;
	s->next = calloc(n, sizeof(*s->next));
	s->len = calloc(n, sizeof(*s->len));
	s->ref = calloc(n, sizeof(*s->ref));
	s->defer_q = calloc(cap, sizeof(*s->defer_q)); /* holds every slot at once: never overflows */
	s->defer_mask = cap - 1;
	return s->next && s->len && s->ref && s->defer_q ? 0 : -ENOMEM;
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
	memset(s, 0, sizeof(*s));
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
