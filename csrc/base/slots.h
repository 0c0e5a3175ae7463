/* base/slots.h - receive slots: the two provided-buffer groups the kernel
 * receives into, and the per-connection queue of received slots the
 * transports (plain parser and TLS BIO alike) read from.
 *
 * Slot ids: a main-group slot is its buffer id; a handshake-group slot is
 * the main count plus its buffer id. Both groups share the per-slot tables
 * (next, len, ref), so one queue type covers both.
 *
 * A consumed slot goes back to the kernel at once, unless an event Go has
 * not passed yet points into it (a payload delivered in place): then it
 * waits in the deferred queue, in release order, until Go's head passes
 * ref[slot].
 *
 * Plaintext slots (TLS) share the tables: ids from pt_first = main count +
 * TL_HS_COUNT on. SSL_read decrypts into them so whole frames are
 * delivered in place on wss:// as on ws://; they are released the same
 * way (deferred while an event points into them) onto a free stack
 * instead of a buffer ring. Their memory is mapped on first use (the
 * first TLS connection): a pool that only speaks ws:// never pays for it. */
#ifndef TALARIS_SLOTS_H
#define TALARIS_SLOTS_H

#include <liburing.h>
#include <stddef.h>
#include <stdint.h>

#include "base/bufring.h"

/* Buffer groups: the main ring for open connections, and a small ring only
 * connections still handshaking receive into, so busy open connections
 * cannot take every slot a 101 (or a TLS ServerHello) needs. */
#define TL_BGID 7
#define TL_HS_BGID 8
#define TL_HS_COUNT 64

struct tl_slots {
	struct tl_bufring main;  /* group TL_BGID */
	struct tl_bufring hs;    /* group TL_HS_BGID */
	int32_t *next;           /* per slot: next slot in its connection's queue, -1 at the end */
	uint32_t *len;           /* per slot: bytes the kernel wrote */
	uint64_t *ref;           /* per slot: events below this tail position point into it */
	uint32_t *defer_q;       /* consumed slots still referenced, in release order */
	uint32_t defer_head, defer_tail, defer_mask;
	/* plaintext slots: pt_count of TL_PT_SLOT bytes, ids pt_first.. */
	uint8_t *pt_mem;         /* NULL until tl_slots_pt_map */
	uint32_t pt_first, pt_count;
	uint32_t *pt_free;       /* free plaintext slot ids (a stack) */
	uint32_t pt_nfree;
};

/* TL_PT_SLOT is one plaintext slot's size: four full TLS records, so
 * frames straddle two slots (and take the reassembly path) rarely. A slot
 * takes another SSL_read only while a whole record (TL_PT_RECORD) fits. */
#define TL_PT_SLOT (64u << 10)
#define TL_PT_RECORD 16384u

/* tl_slots_pt_count is how many plaintext slots a loop with count receive
 * slots gets: an eighth of them, between 8 and 256 (at most 16 MiB,
 * mapped on first use). When every one is taken (the pump is behind) a TLS
 * connection decrypts into its own buffer and its frames are copied into
 * the arena as before: plaintext slots never make a connection wait. */
static inline uint32_t tl_slots_pt_count(uint32_t count)
{
	uint32_t n = count / 8;
	return n < 8 ? 8 : n > 256 ? 256 : n;
}

/* tl_slots_alloc allocates the per-slot tables for count main slots plus
 * the handshake group and tl_slots_pt_count(count) plaintext slots (their
 * memory is mapped later, tl_slots_pt_map). Returns 0 or -ENOMEM (free
 * with tl_slots_free). */
int tl_slots_alloc(struct tl_slots *s, uint32_t count);

/* tl_slots_register maps both groups (count main slots and TL_HS_COUNT
 * handshake slots of size bytes) and registers them with ring. Returns 0
 * or a negative errno. */
int tl_slots_register(struct tl_slots *s, struct io_uring *ring, uint32_t size, uint32_t count);

/* tl_slots_free unregisters the groups from ring (NULL: never registered)
 * and frees the tables. Safe on a zeroed struct. */
void tl_slots_free(struct tl_slots *s, struct io_uring *ring);

/* tl_slots_pt_map maps the plaintext slots' memory (populated) and fills
 * the free stack, once; later calls return at once. Returns 0 or -ENOMEM
 * (a caller then decrypts into its own buffer). Loop thread only. */
int tl_slots_pt_map(struct tl_slots *s);

/* tl_slots_pt_get takes a free plaintext slot: its id, or -1 when none is
 * free (or none is mapped). */
static inline int32_t tl_slots_pt_get(struct tl_slots *s)
{
	if (s->pt_nfree == 0)
		return -1;
	return (int32_t)s->pt_free[--s->pt_nfree];
}

/* tl_slots_origin says whether p lies in a receive slot (TL_SLOTS_RECV),
 * a plaintext slot (TL_SLOTS_PT) or neither (0): tests only
 * (tl_loop_payload_origin). */
enum { TL_SLOTS_RECV = 1, TL_SLOTS_PT = 2 };
int tl_slots_origin(const struct tl_slots *s, const uint8_t *p);

/* tl_slots_release_deferred recycles deferred slots that no unconsumed
 * event points into any more; ev_head is Go's head, freshly read. */
void tl_slots_release_deferred(struct tl_slots *s, uint64_t ev_head);

/* tl_slots_is_main says whether slot q belongs to the main group: only
 * those may hold payloads delivered in place (the few handshake slots must
 * come back at once, or a flood nobody pumps would keep the next 101 from
 * arriving). */
static inline int tl_slots_is_main(const struct tl_slots *s, uint32_t q) { return q < s->main.count; }

/* tl_slots_is_pt says whether slot q is a plaintext slot. */
static inline int tl_slots_is_pt(const struct tl_slots *s, uint32_t q) { return q >= s->pt_first; }

/* tl_slots_inplace says whether events may point into slot q (payloads
 * delivered in place): main-group and plaintext slots. */
static inline int tl_slots_inplace(const struct tl_slots *s, uint32_t q)
{
	return q < s->main.count || q >= s->pt_first;
}

static inline uint8_t *tl_slots_ptr(const struct tl_slots *s, uint32_t q)
{
	if (q >= s->pt_first)
		return s->pt_mem + (size_t)(q - s->pt_first) * TL_PT_SLOT;
	return q < s->main.count ? tl_bufring_slot(&s->main, q) : tl_bufring_slot(&s->hs, q - s->main.count);
}

/* tl_slots_recycle hands slot q back to its group (visible to the kernel
 * after tl_slots_commit), a plaintext slot to the free stack. */
static inline void tl_slots_recycle(struct tl_slots *s, uint32_t q)
{
	if (q < s->main.count)
		tl_bufring_recycle(&s->main, q);
	else if (q < s->pt_first)
		tl_bufring_recycle(&s->hs, q - s->main.count);
	else
		s->pt_free[s->pt_nfree++] = q; /* at most pt_count: each id is free once */
}

/* tl_slots_release recycles consumed slot q, or defers it while an event
 * beyond ev_head (Go's head as last read) points into it. */
static inline void tl_slots_release(struct tl_slots *s, uint32_t q, uint64_t ev_head)
{
	if (s->ref[q] > ev_head) {
		s->defer_q[s->defer_tail++ & s->defer_mask] = q;
		return;
	}
	s->ref[q] = 0;
	tl_slots_recycle(s, q);
}

static inline int tl_slots_deferred(const struct tl_slots *s) { return s->defer_head != s->defer_tail; }

/* tl_slots_commit publishes every recycled slot to the kernel: one tail
 * store per group. */
static inline void tl_slots_commit(struct tl_slots *s)
{
	tl_bufring_commit(&s->main);
	tl_bufring_commit(&s->hs);
}

/* tl_slots_take takes the buffers a recv completion of the handshake group
 * (hs) or the main group handed us: first buffer bid, res bytes. A bundle
 * (IORING_RECVSEND_BUNDLE) fills ceil(res / size) buffers in ring order,
 * each full but the last; a plain recv one (and a completion with res <= 0,
 * which the kernel does not send with a buffer, is counted as one). Their
 * slot ids are linked through next[] in order (-1 after the last), len[]
 * set; returns the first, *last the last and *n how many. Every id is read
 * before anything is recycled (tl_bufring_claim). */
static inline uint32_t tl_slots_take(struct tl_slots *s, int hs, uint32_t bid, int32_t res, uint32_t *last,
				     uint32_t *n)
{
	struct tl_bufring *g = hs ? &s->hs : &s->main;
	uint32_t base = hs ? s->main.count : 0, left = res > 0 ? (uint32_t)res : 0;
	uint32_t cnt = left > g->size ? (left + g->size - 1) / g->size : 1;
	uint32_t pos = tl_bufring_claim(g, bid, &cnt), prev = 0;

	/* cnt >= 1: a claim whose bid is in no position is bid alone
	 * (never expected: tl_bufring_claim_slow). */
	for (uint32_t i = 0; i < cnt; i++) {
		uint32_t q = base + (i ? tl_bufring_bid_at(g, pos + i) : bid);
		s->len[q] = left < g->size ? left : g->size;
		left -= s->len[q];
		s->next[q] = -1;
		if (i)
			s->next[prev] = (int32_t)q;
		prev = q;
	}
	*last = prev;
	*n = cnt;
	return base + bid;
}

/* tl_slots_recycle_chain recycles the slots linked from first (a
 * tl_slots_take chain nobody will read). */
static inline void tl_slots_recycle_chain(struct tl_slots *s, uint32_t first)
{
	for (int32_t q = (int32_t)first; q >= 0;) {
		int32_t nx = s->next[q];
		tl_slots_recycle(s, (uint32_t)q);
		q = nx;
	}
}

/* tl_rxq is one connection's received, not yet consumed slots, in arrival
 * order: a list through tl_slots.next, and how far the head slot is read. */
struct tl_rxq {
	int32_t head, tail; /* slot ids, -1 when empty */
	uint32_t off;       /* bytes of the head slot already consumed */
	uint32_t count;     /* slots in the queue */
};

static inline void tl_rxq_init(struct tl_rxq *q)
{
	q->head = q->tail = -1;
	q->off = 0;
	q->count = 0;
}

static inline int tl_rxq_empty(const struct tl_rxq *q) { return q->head < 0; }

/* tl_rxq_push_chain appends the n slots linked from first to last (a
 * tl_slots_take chain: next[] and len[] set) to q. */
static inline void tl_rxq_push_chain(struct tl_slots *s, struct tl_rxq *q, uint32_t first, uint32_t last, uint32_t n)
{
	if (q->tail >= 0)
		s->next[q->tail] = (int32_t)first;
	else
		q->head = (int32_t)first;
	q->tail = (int32_t)last;
	q->count += n;
}

/* tl_rxq_peek points *p at the unread bytes of q's head slot and *n at
 * their count. Returns the head slot id, or -1 when q is empty. */
static inline int32_t tl_rxq_peek(const struct tl_slots *s, const struct tl_rxq *q, const uint8_t **p, size_t *n)
{
	int32_t h = q->head;
	if (h < 0)
		return -1;
	*p = tl_slots_ptr(s, (uint32_t)h) + q->off;
	*n = s->len[h] - q->off;
	return h;
}

/* tl_rxq_consume marks n bytes of q's head slot read (n at most what
 * tl_rxq_peek reported). A slot read to its end leaves the queue and is
 * released (tl_slots_release with ev_head). */
static inline void tl_rxq_consume(struct tl_slots *s, struct tl_rxq *q, size_t n, uint64_t ev_head)
{
	uint32_t h = (uint32_t)q->head;

	q->off += (uint32_t)n;
	if (q->off < s->len[h])
		return;
	q->head = s->next[h];
	if (q->head < 0)
		q->tail = -1;
	q->off = 0;
	q->count--;
	tl_slots_release(s, h, ev_head);
}

/* tl_rxq_drain releases every slot of q unread (the connection ends). */
static inline void tl_rxq_drain(struct tl_slots *s, struct tl_rxq *q, uint64_t ev_head)
{
	while (q->head >= 0) {
		uint32_t h = (uint32_t)q->head;
		q->head = s->next[h];
		tl_slots_release(s, h, ev_head); /* the head slot may hold in-place payloads */
	}
	tl_rxq_init(q);
}

#endif
