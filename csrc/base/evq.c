/* base/evq.c - the event ring producer's slow paths: publishing a batch, reading
 * Go's head, appending when the arena wraps or looks full. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "base/evq.h"

#include <errno.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define STAT_ADD(s, f, n) __atomic_store_n(&(s)->f, (s)->f + (n), __ATOMIC_RELAXED)

static void *evq_map(size_t n, int populate)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0), -1,
		       0);
	return p == MAP_FAILED ? NULL : p;
}

int tl_evq_init(struct tl_evq *q, uint32_t size, uint64_t arena_size, struct tl_pool_stats *stats, int stamped,
		uint32_t owners)
{
	memset(q, 0, sizeof(*q));
	q->stats = stats;
	q->arena_size = arena_size;
	q->r = evq_map(sizeof(*q->r), 1); /* small and touched at once: populated */
	q->arena_end = calloc(size, sizeof(uint64_t));
	/* The arena is the largest mapping of a pool: mapped lazily, its pages
	 * fault in the first time the ring passes them (tl_loop_prefault
	 * populates it up front when Tuning.Prefault asks). */
	q->arena = evq_map(arena_size, 0);
	q->owners = owners ? owners : 1;
	q->own_events = calloc(q->owners, sizeof(uint32_t));
	q->own_bytes = calloc(q->owners, sizeof(uint64_t));
	q->runs = calloc(size, sizeof(*q->runs)); /* (pages touched only while counting) */
	if (!q->r || !q->arena_end || !q->arena || !q->own_events || !q->own_bytes || !q->runs)
		return -ENOMEM;
	q->r->ev = evq_map(sizeof(struct tl_event) * size, 1);
	if (!q->r->ev)
		return -ENOMEM;
	q->r->size = size;
	q->r->mask = size - 1;
	q->events = q->r->ev;
	q->size = size;
	q->mask = size - 1;
	if (stamped) {
		q->r->stamps = evq_map(sizeof(struct tl_stamp) * size, 1);
		q->stamp_pend = calloc(TL_EVQ_EARLY_PUBLISH, sizeof(uint32_t));
		if (!q->r->stamps || !q->stamp_pend)
			return -ENOMEM;
		q->stamps = q->r->stamps;
	}
	return 0;
}

void tl_evq_free(struct tl_evq *q)
{
	if (q->r) {
		if (q->r->ev)
			munmap(q->r->ev, sizeof(struct tl_event) * q->r->size);
		if (q->r->stamps)
			munmap(q->r->stamps, sizeof(struct tl_stamp) * q->r->size);
		munmap(q->r, sizeof(*q->r));
	}
	if (q->arena)
		munmap(q->arena, q->arena_size);
	free(q->arena_end);
	free(q->stamp_pend);
	free(q->own_events);
	free(q->own_bytes);
	free(q->runs);
	memset(q, 0, sizeof(*q));
}

void tl_evq_publish(struct tl_evq *q)
{
	struct tl_evring *r = q->r;

	if (q->tail == q->published)
		return;
	if (__builtin_expect(q->npend != 0, 0)) {
		/* Sampled messages: one clock read for the batch, stored before
		 * the tail so Go's acquire of the tail sees them. */
		struct timespec ts;
		uint64_t now;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
		for (uint32_t i = 0; i < q->npend; i++)
			q->stamps[q->stamp_pend[i]].publish = now;
		q->npend = 0;
	}
	/* The counts go before the tail: a pump that has consumed this
	 * batch reads them (Pool.Metrics, PoolStats) with the batch in. */
	STAT_ADD(q->stats, events, q->tail - q->published);
	STAT_ADD(q->stats, batches, 1);
	__atomic_store_n(&q->stats->msgs, q->msgs, __ATOMIC_RELAXED);
	__atomic_store_n(&q->stats->bytes, q->bytes, __ATOMIC_RELAXED);
	/* seq_cst, not just release: this store and the load of
	 * cons_sleeping below are the producer half of the Dekker handshake
	 * (the pump stores cons_sleeping, then rechecks the tail). */
	__atomic_store_n(&r->tail, q->tail, __ATOMIC_SEQ_CST);
	q->published = q->tail;
	switch (__atomic_load_n(&r->cons_sleeping, __ATOMIC_SEQ_CST)) {
	case 0:
		break;
	case 2: {
		/* The pump sleeps in epoll on its doorbell (the sockets it
		 * expects a reply on, and this eventfd): evring_linux.go,
		 * sleepBell. Non-blocking, never read: each write is an edge. */
		uint64_t one = 1;
		ssize_t w = write(__atomic_load_n(&r->cons_efd, __ATOMIC_RELAXED), &one, sizeof(one));
		(void)w; /* a full counter (2^64 - 2 writes) would still be readable */
		break;
	}
	default:
		__atomic_fetch_add(&r->wake_seq, 1, __ATOMIC_SEQ_CST);
		syscall(SYS_futex, &r->wake_seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
	}
}

/* own_credit takes the events between head_cache and head (Go passed
 * them) off their owners' counts: a run passed whole in one step; the run
 * the head stops inside by reading its passed records' lengths (each
 * record at most once: the run then starts at head). Every event is
 * credited here before its ring entry can be written again (the producer
 * reuses an entry only after a refresh has seen the head pass it), so the
 * counts stay exact. The records are our own writes (Go only reads
 * them). */
static void own_credit(struct tl_evq *q, uint64_t head)
{
	uint64_t pos = q->head_cache;

	while (pos != head) {
		struct tl_evq_orun *r = &q->runs[q->run_head & q->mask];
		if (r->end <= head) {
			q->own_events[r->slot] -= (uint32_t)(r->end - pos);
			q->own_bytes[r->slot] -= r->bytes;
			pos = r->end;
			q->run_head++;
		} else {
			uint64_t b = 0;
			for (uint64_t i = pos; i != head; i++)
				b += q->events[i & q->mask].len;
			q->own_events[r->slot] -= (uint32_t)(head - pos);
			q->own_bytes[r->slot] -= b;
			r->bytes -= b;
			pos = head;
		}
	}
}

int tl_evq_refresh(struct tl_evq *q)
{
	/* Acquire: Go's reads of the events (and their payloads) before its
	 * release store of head are done before we reuse that memory. */
	uint64_t head = __atomic_load_n(&q->r->head, __ATOMIC_ACQUIRE);

	if (head == q->head_cache)
		return 0;
	if (q->counting)
		own_credit(q, head);
	q->head_cache = head;
	if (head == q->tail)
		q->rpos = q->wpos;
	else
		q->rpos = q->arena_end[(head - 1) & q->mask];
	return 1;
}

void tl_evq_set_counting(struct tl_evq *q, int on)
{
	if (!on || q->counting) {
		q->counting = (uint8_t)!!on;
		return;
	}
	tl_evq_refresh(q); /* (not counting: no walk) */
	memset(q->own_events, 0, q->owners * sizeof(uint32_t));
	memset(q->own_bytes, 0, q->owners * sizeof(uint64_t));
	q->run_head = q->run_tail = 0;
	{
		/* The pending events, counted and logged as if appended now. */
		uint64_t tail = q->tail;
		for (q->tail = q->head_cache; q->tail != tail; q->tail++) {
			const struct tl_event *e = &q->events[q->tail & q->mask];
			tl_evq_own_add(q, e->slot, 1, e->len);
		}
	}
	q->counting = 1;
}

int tl_evq_owner_over(struct tl_evq *q, uint32_t slot, size_t n, uint32_t max_events, uint64_t max_bytes)
{
	tl_evq_refresh(q);
	if (q->own_events[slot] >= max_events)
		return 1;
	/* With none of its payload bytes pending a message larger than
	 * max_bytes still goes (alone). */
	return q->own_bytes[slot] != 0 && q->own_bytes[slot] + n > max_bytes;
}

/* arena_alloc returns n bytes of contiguous, 8-aligned arena (skipping the
 * end of the arena when the payload would wrap), or NULL when Go has not
 * released enough yet. */
static uint8_t *arena_alloc(struct tl_evq *q, size_t n)
{
	uint64_t size = q->arena_size;
	uint64_t need = (n + 7) & ~(uint64_t)7;

	for (int pass = 0; pass < 2; pass++) {
		uint64_t w = q->wpos;
		uint64_t off = w & (size - 1);
		uint64_t skip = (off + need > size) ? size - off : 0;
		if (w + skip + need - q->rpos <= size) {
			q->wpos = w + skip + need;
			return q->arena + ((w + skip) & (size - 1));
		}
		tl_evq_refresh(q);
	}
	return NULL;
}

int tl_evq_append_slow(struct tl_evq *q, struct tl_evmeta m, const uint8_t *p, size_t n)
{
	uint8_t *dst = NULL;

	if (q->tail - q->head_cache >= q->size) {
		tl_evq_refresh(q);
		if (q->tail - q->head_cache >= q->size)
			return -1;
	}
	if (n) {
		dst = arena_alloc(q, n);
		if (!dst)
			return -1;
		memcpy(dst, p, n);
	}
	tl_evq_put(q, m, dst, n, q->wpos);
	return 0;
}

#undef STAT_ADD
