/* base/evq.h - the producer end of the event ring and its payload arena (the
 * consumer end is Go's pump). One type owns the producer's state; the
 * shared control block (struct tl_evring, ring.h) holds only what Go must
 * see. Every event, data or control, goes through tl_evq_append or, for a
 * payload that stays in its receive slot, tl_evq_append_ref: both write the
 * record with tl_evq_put.
 *
 * The arena is a power-of-two byte ring allocated in event order; each
 * event remembers the arena position after its payload (arena_end[]), so
 * the head Go publishes says exactly how much arena is free again. */
#ifndef TALARIS_EVQ_H
#define TALARIS_EVQ_H

#include <stddef.h>
#include <stdint.h>

#include "ring.h"
#include "talaris.h"

/* tl_evmeta is what an event says besides its payload: whose it is and,
 * for control and final events, code, err, aux and flags. Passed by value
 * as scalars so the per-message path keeps them in registers. */
struct tl_evmeta {
	uint32_t slot, gen;
	uint16_t code;
	uint8_t kind, flags;
	int32_t err, aux;
};

/* A batch longer than this is published before it ends, so Go can start.
 * 4096 rather than 1024: a pump that catches up with a 1024-event batch
 * sleeps before the next one is ready (the loop takes about 50 us per
 * 1024 ws events, longer than the pump's SpinTime), and each sleep costs
 * the loop a futex wake. Measured (docs/notes/2026-12-per-message-cost.md,
 * "Second pass (decode2)"): pump sleeps per 1000 messages 0.42-0.66 ->
 * 0.14-0.36 at 1-64 connections. Only batches this long wait for it: a
 * message at a low rate is published at the end of its completion batch
 * as before. */
#define TL_EVQ_EARLY_PUBLISH 4096

struct tl_evq {
	struct tl_evring *r;     /* shared with Go */
	struct tl_event *events; /* r->ev, r->size - 1: copies kept off the shared lines */
	uint64_t size, mask;
	uint64_t tail;           /* local; Go sees it at tl_evq_publish */
	uint64_t published;      /* tail as last published */
	uint64_t head_cache;     /* Go's head as last read */
	uint64_t *arena_end;     /* per event: arena position after its payload */
	uint8_t *arena;
	uint64_t arena_size;
	uint64_t wpos;           /* monotonic write position */
	uint64_t rpos;           /* monotonic: bytes before this are free */
	struct tl_pool_stats *stats; /* events and batches are counted at publish */
	uint64_t msgs, bytes;    /* data messages and payload bytes appended (tl_evq_count); stored to stats at publish */
	struct tl_stamp *stamps; /* r->stamps: NULL when sampling is off */
	uint32_t *stamp_pend;    /* indices of stamped events awaiting their publish stamp */
	uint32_t npend;          /* at most TL_EVQ_EARLY_PUBLISH: a batch never grows longer */
	/* Per owner (event slot): events and payload bytes appended and not
	 * yet passed by Go's head, exact: counted up in tl_evq_put, down in
	 * tl_evq_refresh as the head passes them. Per slot, not per
	 * connection: a slot's previous connection's events still queue ahead
	 * of everyone until the pump passes them. Loop-private. */
	uint32_t *own_events;
	uint64_t *own_bytes;
	uint32_t owners;         /* entries in own_events/own_bytes (every slot < owners) */
	uint8_t counting;        /* own_* and runs kept (tl_evq_set_counting); else stale and unused */
	/* The pending events as runs of one owner, oldest first (a ring of
	 * size entries: every run holds at least one pending event), so
	 * tl_evq_refresh credits a passed run in one step instead of reading
	 * every record back (measured: that walk was 4-6 % of the loop thread
	 * at 16 ws connections). The oldest run starts at head_cache; its
	 * bytes are what is still pending of it. Loop-private. */
	struct tl_evq_orun *runs;
	uint64_t run_head, run_tail;
};

/* tl_evq_orun is one run of consecutive pending events of one owner. */
struct tl_evq_orun {
	uint64_t end;   /* ring position after the run's last event */
	uint64_t bytes; /* payload bytes of its pending events */
	uint32_t slot;
};

/* tl_evq_own_add counts k more events (bytes payload bytes) of owner
 * slot, appended at the tail (q->tail is still the position of the
 * first of them): the owner's counts and the run log (the last run grows
 * when it is the same owner's). Counting must be on. */
static inline __attribute__((always_inline)) void tl_evq_own_add(struct tl_evq *q, uint32_t slot, uint64_t k,
								  uint64_t bytes)
{
	struct tl_evq_orun *r = &q->runs[(q->run_tail - 1) & q->mask];

	q->own_events[slot] += (uint32_t)k;
	q->own_bytes[slot] += bytes;
	if (q->run_tail == q->run_head || r->slot != slot) {
		r = &q->runs[q->run_tail++ & q->mask];
		r->slot = slot;
		r->bytes = 0;
	}
	r->end = q->tail + k;
	r->bytes += bytes;
}

/* tl_evq_init maps an event ring of size events and an arena of arena_size
 * bytes (both powers of two), populated up front, and with stamped set the
 * stamp table (size entries) for sampled messages. owners is the number of
 * event slots (struct tl_evmeta.slot < owners) whose pending events and
 * bytes are counted (tl_evq_owner_over). Returns 0 or -ENOMEM; on failure
 * whatever was mapped is released by tl_evq_free. */
int tl_evq_init(struct tl_evq *q, uint32_t size, uint64_t arena_size, struct tl_pool_stats *stats, int stamped,
		uint32_t owners);

/* tl_evq_free unmaps what tl_evq_init mapped. Safe on a zeroed or partly
 * initialised queue. */
void tl_evq_free(struct tl_evq *q);

/* tl_evq_publish makes every appended event visible to Go with one store
 * of the tail, and wakes the pump if it announced that it sleeps (a futex
 * wake of wake_seq; a write to cons_efd when it sleeps on its doorbell,
 * cons_sleeping 2). Stamped
 * events of the batch get their publish stamp just before the store. */
void tl_evq_publish(struct tl_evq *q);

/* tl_evq_refresh reads Go's head, freeing ring entries and arena bytes.
 * Returns 1 if the head moved, else 0. */
int tl_evq_refresh(struct tl_evq *q);

/* tl_evq_append_slow is tl_evq_append's path when the cached head says the
 * ring or arena is full, or the payload would wrap the arena. Not for
 * direct use. */
int tl_evq_append_slow(struct tl_evq *q, struct tl_evmeta m, const uint8_t *p, size_t n);

/* tl_evq_set_counting turns the per-owner counts on or off. Off (one
 * owner: nobody to share the ring with) costs nothing per event; turning
 * them on reads Go's head and counts the events still pending, so they
 * are exact from then on. */
void tl_evq_set_counting(struct tl_evq *q, int on);

/* tl_evq_owner_over says whether slot's next event, with an n-byte
 * payload, would pass its share of the ring (counting must be on): slot
 * has max_events events pending (appended, not yet passed by Go), or has
 * payload bytes pending and those plus n pass max_bytes (a message of any
 * size fits when none of its owner's bytes are pending). It reads Go's
 * head first (tl_evq_refresh), so the counts are exact; the caller
 * compares the cached counts inline (they only overstate) and calls it at
 * the limit. Returns 1 (hold it back until Go passes some) or 0. */
int tl_evq_owner_over(struct tl_evq *q, uint32_t slot, size_t n, uint32_t max_events, uint64_t max_bytes);

/* tl_evq_head_moved reports (seq_cst, for the sleep handshake) whether Go
 * released events since the last tl_evq_refresh. */
static inline int tl_evq_head_moved(const struct tl_evq *q)
{
	return __atomic_load_n(&q->r->head, __ATOMIC_SEQ_CST) != q->head_cache;
}

/* tl_evq_publish_at_bound publishes a batch that reached
 * TL_EVQ_EARLY_PUBLISH before anything more is appended: the caller of a
 * put counts the message (count_in) and stamps a sample (tl_evq_stamp)
 * after it, and both must be stored before the event is published. */
static inline __attribute__((always_inline)) void tl_evq_publish_at_bound(struct tl_evq *q)
{
	if (__builtin_expect(q->tail - q->published >= TL_EVQ_EARLY_PUBLISH, 0))
		tl_evq_publish(q);
}

/* tl_evq_put writes the event (m, payload p[0..n)) at the tail; the caller
 * checked for room. Records that the payload ends at arena position
 * arena_end. */
static inline __attribute__((always_inline)) void tl_evq_put(struct tl_evq *q, struct tl_evmeta m,
							     const uint8_t *p, size_t n, uint64_t arena_end)
{
	uint64_t tail, idx;
	struct tl_event ev;

	tl_evq_publish_at_bound(q);
	tail = q->tail;
	idx = tail & q->mask;
	/* Built in a local and stored once; plain stores: Go reads the record
	 * only after the release store of the tail in tl_evq_publish, which
	 * orders these before it. */
	ev.ptr = p;
	ev.len = (uint32_t)n;
	ev.slot = m.slot;
	ev.gen = m.gen;
	ev.code = m.code;
	ev.kind = m.kind;
	ev.flags = m.flags;
	ev.err = m.err;
	ev.aux = m.aux;
	q->events[idx] = ev;
	q->arena_end[idx] = arena_end;
	if (q->counting)
		tl_evq_own_add(q, m.slot, 1, n);
	q->tail = tail + 1;
}

/* tl_evq_stamp marks the event appended last as sampled and writes its
 * stamps (cqe, plaintext; the publish stamp follows in tl_evq_publish).
 * The caller checked that q->stamps is set. Cold: sampled messages only. */
static inline void tl_evq_stamp(struct tl_evq *q, uint64_t cqe, uint64_t plaintext)
{
	uint32_t idx = (uint32_t)((q->tail - 1) & q->mask);
	struct tl_stamp *s = &q->stamps[idx];

	q->events[idx].flags |= TL_EVF_STAMPED;
	s->cqe = cqe;
	s->plaintext = plaintext;
	s->publish = 0;
	s->wire = 0;
	if (q->npend < TL_EVQ_EARLY_PUBLISH)
		q->stamp_pend[q->npend++] = idx;
}

/* tl_copy_small copies n bytes; short payloads (the common market-data
 * case) avoid a libc call with overlapping word moves. */
static inline void tl_copy_small(uint8_t *d, const uint8_t *s, size_t n)
{
	if (n >= 8 && n <= 16) {
		uint64_t a, b;
		__builtin_memcpy(&a, s, 8);
		__builtin_memcpy(&b, s + n - 8, 8);
		__builtin_memcpy(d, &a, 8);
		__builtin_memcpy(d + n - 8, &b, 8);
	} else if (n >= 4 && n < 8) {
		uint32_t a, b;
		__builtin_memcpy(&a, s, 4);
		__builtin_memcpy(&b, s + n - 4, 4);
		__builtin_memcpy(d, &a, 4);
		__builtin_memcpy(d + n - 4, &b, 4);
	} else if (n) {
		__builtin_memcpy(d, s, n);
	}
}

/* tl_evq_append appends an event with a copy of p[0..n) in the arena as
 * its payload. Returns 0, or -1 when the ring or arena is full (nothing
 * was written). The common case (room without wrapping) is inline: it is
 * the per-message path. */
static inline __attribute__((always_inline)) int tl_evq_append(struct tl_evq *q, struct tl_evmeta m,
								const uint8_t *p, size_t n)
{
	/* Locals: the stores below may alias q's fields as far as the compiler
	 * knows, so read everything once. */
	uint64_t need = (n + 7) & ~(uint64_t)7;
	uint64_t w = q->wpos, asize = q->arena_size, off = w & (asize - 1);
	uint8_t *dst;

	if (__builtin_expect(q->tail - q->head_cache >= q->size || off + need > asize || w + need - q->rpos > asize,
			     0))
		return tl_evq_append_slow(q, m, p, n);
	dst = q->arena + off;
	q->wpos = w + need;
	tl_copy_small(dst, p, n);
	tl_evq_put(q, m, dst, n, w + need);
	return 0;
}

/* tl_evq_run appends a run of data events of one owner with the queue's
 * hot fields held in locals (registers: a payload copy through a byte
 * pointer would otherwise make the compiler reload every field after
 * each store), and commits them with one update of the queue (tail,
 * arena, owner counts, early publish) at tl_evq_run_end. For the parser's
 * burst of small whole frames (ws/frames.c, feed_burst): per event it costs the
 * record, its arena_end and, in copy mode, the payload copy. Nothing
 * appended is visible to the rest of the queue until tl_evq_run_end, so
 * nothing else may append to q in between. */
struct tl_evq_run {
	struct tl_event *events;
	uint64_t *arena_end;
	uint64_t mask;
	uint64_t tail;  /* index of the next event */
	uint64_t end;   /* tail may not reach this (ring room, early publish, caller's cap) */
	uint8_t *arena; /* copy mode only (NULL: payloads stay where they are) */
	uint64_t amask;
	uint64_t w;     /* arena write position (monotonic) */
	uint64_t wend;  /* w may not pass this (contiguous room before the wrap, or Go's head) */
	uint64_t bytes; /* payload bytes appended */
	uint32_t slot, gen;
};

/* tl_evq_run_begin starts a run of at most max_events events of owner
 * (slot, gen); copy says payloads are copied into the arena (else they
 * stay where the caller keeps them, as tl_evq_append_ref). The run stops
 * short of the ring's free room as last read and of the early-publish
 * bound (see TL_EVQ_EARLY_PUBLISH), and in copy mode of the arena's
 * contiguous room: the caller appends the rest through tl_evq_append,
 * which handles the wrap and rereads Go's head. */
static inline __attribute__((always_inline)) void tl_evq_run_begin(struct tl_evq *q, struct tl_evq_run *r,
								   uint32_t slot, uint32_t gen, int copy,
								   uint64_t max_events)
{
	uint64_t room, pub;

	tl_evq_publish_at_bound(q); /* a put left the batch at its bound */
	room = q->size - (q->tail - q->head_cache);
	pub = TL_EVQ_EARLY_PUBLISH - (q->tail - q->published);

	if (room > pub)
		room = pub;
	if (room > max_events)
		room = max_events;
	r->events = q->events;
	r->arena_end = q->arena_end;
	r->mask = q->mask;
	r->tail = q->tail;
	r->end = q->tail + room;
	r->w = q->wpos;
	r->wend = q->wpos;
	r->arena = NULL;
	r->amask = q->arena_size - 1;
	r->bytes = 0;
	r->slot = slot;
	r->gen = gen;
	if (copy) {
		uint64_t off = q->wpos & r->amask, free = q->arena_size - (q->wpos - q->rpos);
		r->arena = q->arena;
		r->wend = q->wpos + (q->arena_size - off < free ? q->arena_size - off : free);
	}
}

/* tl_evq_run_add appends a data event (kind TL_EV_TEXT or TL_EV_BINARY,
 * payload p[0..n)) to the run; copy must say what tl_evq_run_begin was
 * told (a constant at the call: the other mode's code folds away).
 * Returns 0, or -1 when the run is out of room (nothing written). */
static inline __attribute__((always_inline)) int tl_evq_run_add(struct tl_evq_run *r, uint8_t kind, const uint8_t *p,
								 size_t n, int copy)
{
	uint64_t idx = r->tail & r->mask;
	struct tl_event ev;

	if (r->tail == r->end)
		return -1;
	if (copy) {
		uint64_t need = (n + 7) & ~(uint64_t)7;
		uint8_t *dst;
		if (need > r->wend - r->w)
			return -1;
		dst = r->arena + (r->w & r->amask);
		tl_copy_small(dst, p, n);
		p = dst;
		r->w += need;
	}
	ev.ptr = p;
	ev.len = (uint32_t)n;
	ev.slot = r->slot;
	ev.gen = r->gen;
	ev.code = 0;
	ev.kind = kind;
	ev.flags = 0;
	ev.err = 0;
	ev.aux = 0;
	r->events[idx] = ev;
	r->arena_end[idx] = r->w;
	r->tail++;
	r->bytes += n;
	return 0;
}

/* tl_evq_run_end commits the run's events to q (they are published with
 * the next tl_evq_publish, or now when the batch reached
 * TL_EVQ_EARLY_PUBLISH: count them in q->msgs and q->bytes before). The
 * caller calls it only for a run that appended events. */
static inline __attribute__((always_inline)) void tl_evq_run_end(struct tl_evq *q, struct tl_evq_run *r)
{
	uint64_t k = r->tail - q->tail;

	if (q->counting)
		tl_evq_own_add(q, r->slot, k, r->bytes);
	q->tail = r->tail;
	q->wpos = r->w;
	if (__builtin_expect(q->tail - q->published >= TL_EVQ_EARLY_PUBLISH, 0))
		tl_evq_publish(q);
}

/* tl_evq_append_ref appends an event whose payload p[0..n) stays where it
 * is (a receive slot the caller keeps out of the kernel until Go has
 * passed the event: see tl_slots_release). Returns 0, or -1 when the ring
 * is full. */
static inline __attribute__((always_inline)) int tl_evq_append_ref(struct tl_evq *q, struct tl_evmeta m,
								    const uint8_t *p, size_t n)
{
	if (__builtin_expect(q->tail - q->head_cache >= q->size, 0)) {
		tl_evq_refresh(q);
		if (q->tail - q->head_cache >= q->size)
			return -1;
	}
	tl_evq_put(q, m, p, n, q->wpos);
	return 0;
}

#endif
