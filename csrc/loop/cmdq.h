/* loop/cmdq.h - the consumer end of the command ring (Go's senders are the
 * producer, serialised by a mutex, so the ring is SPSC). The shared
 * control block (struct tl_cmdring, ring.h) holds what Go must see; this
 * type keeps the consumer's private indices. tl_cmdq_drain, which runs the
 * commands, is declared in loop.h: its handlers act on connections. */
#ifndef TALARIS_CMDQ_H
#define TALARIS_CMDQ_H

#include <stdint.h>

#include "ring.h"

struct tl_cmdq {
	struct tl_cmdring *r;  /* shared with Go */
	uint64_t head;         /* local; published after each drain */
	uint64_t tail_cache;   /* Go's tail as last read */
};

/* tl_cmdq_init maps a command ring of size bytes (a power of two),
 * populated up front. Returns 0 or -ENOMEM (free with tl_cmdq_free). */
int tl_cmdq_init(struct tl_cmdq *q, uint64_t size);

/* tl_cmdq_free unmaps the ring. Safe on a zeroed or partly set-up queue. */
void tl_cmdq_free(struct tl_cmdq *q);

/* tl_cmdq_pending reports whether Go has published commands not yet run.
 * seq_cst: it is the loop's recheck after announcing sleep (Dekker). */
static inline int tl_cmdq_pending(const struct tl_cmdq *q)
{
	return q->head != __atomic_load_n(&q->r->tail, __ATOMIC_SEQ_CST);
}

struct tl_loop;

/* tl_cmdq_drain runs the commands Go published on l's ring, one handler
 * per op (cmdq.c sits above the connection layers and calls the loop's
 * lifecycle functions). Returns 1 if any ran, else 0. */
int tl_cmdq_drain(struct tl_loop *l);

#endif
