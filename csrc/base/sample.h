/* base/sample.h - stage stamps of sampled completions (Config.SampleEvery):
 * inlines over the connection's sample fields and the event queue's stamp
 * table. Called by the loop (a completion), the transports (bytes reach
 * the parser) and ws/frames.c (a message is published); calls only
 * base/evq.h and base/timer.h. */
#ifndef TALARIS_SAMPLE_H
#define TALARIS_SAMPLE_H

#include "loop/state.h"
#include "base/timer.h"

/* ---- sampling (Config.SampleEvery): stage stamps of one completion in N ----
 *
 * A sampled completion (a recv CQE with data, or an INJECT) stamps the
 * connection (c->smp_cqe); the bytes reaching the parser stamp it again
 * (c->smp_pt: after SSL_read for wss); the next data message the
 * connection publishes carries both in the stamp table and is flagged
 * TL_EVF_STAMPED; tl_evq_publish adds the publish stamp. With sampling off
 * the cost is one predictable branch per completion (tl_sample_rx),
 * per parser run (tl_sample_pt) and per message (tl_sample_msg),
 * each on a field already in cache. */

/* tl_sample_rx counts one receive completion of c and stamps it when
 * it is the one in cfg.sample_every to sample (and c has no stamp
 * pending). immediate says the parser takes these bytes as they are, right
 * after this call (plain transport, nothing queued before them, not
 * stalled): then "plaintext ready" is the same instant and costs no second
 * clock read. */
static inline void tl_sample_rx(struct tl_loop *l, struct tl_conn *c, int immediate)
{
	if (__builtin_expect(l->cfg.sample_every != 0, 0) && --l->sample_left == 0) {
		l->sample_left = l->cfg.sample_every;
		if (!c->smp_cqe) {
			c->smp_cqe = tl_timer_now_ns();
			c->smp_pt = immediate ? c->smp_cqe : 0;
		}
	}
}

/* tl_sample_pt stamps "plaintext ready" for c's pending sample: the
 * parser is about to read bytes (plain: straight from the slot; wss: just
 * decrypted). */
static inline void tl_sample_pt(struct tl_conn *c)
{
	if (__builtin_expect(c->smp_cqe != 0, 0) && !c->smp_pt)
		c->smp_pt = tl_timer_now_ns();
}

/* tl_sample_msg attaches c's pending sample to the data event just
 * appended for c. Called for every data message. */
static inline void tl_sample_msg(struct tl_loop *l, struct tl_conn *c)
{
	if (__builtin_expect(c->smp_cqe != 0, 0)) {
		uint64_t pt = c->smp_pt ? c->smp_pt : tl_timer_now_ns();
		if (l->evq.stamps)
			tl_evq_stamp(&l->evq, c->smp_cqe, pt);
		c->smp_cqe = 0;
		c->smp_pt = 0;
	}
}

/* tl_sample_end drops c's pending sample when the parser has used up
 * the input without a message to carry it (a control frame, the upgrade
 * response, a partial frame): a later message must not inherit an old
 * completion's stamp. Not called when c stalls: its message is still to
 * come and the wait is part of its latency. */
static inline void tl_sample_end(struct tl_conn *c)
{
	if (__builtin_expect(c->smp_cqe != 0, 0))
		c->smp_cqe = 0;
}

#endif
