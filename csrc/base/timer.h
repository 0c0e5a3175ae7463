/* base/timer.h - the clock and timer bookkeeping of a loop (timer.c): arming
 * and clearing a connection's lifecycle deadline and heartbeat, and the
 * loop-wide lower bound the wait sleeps to (see "Timers" in state.h).
 * Arming only: the scan that fires due timers, and what firing does
 * (fail, teardown, ping), is the loop's (loop/tick.c). Calls nothing above it. */
#ifndef TALARIS_TIMER_H
#define TALARIS_TIMER_H

#include <stdint.h>

struct tl_loop;
struct tl_conn;

/* tl_timer_now_ns returns CLOCK_MONOTONIC in nanoseconds. */
uint64_t tl_timer_now_ns(void);

/* tl_timer_at makes sure the timer scan runs at or before the absolute
 * time at (a connection's timer field was just set to at). */
void tl_timer_at(struct tl_loop *l, uint64_t at);

/* tl_timer_set_deadline arms c's lifecycle timer (c->deadline_ns)
 * ns_from_now from now, counting it in l->timed. */
void tl_timer_set_deadline(struct tl_loop *l, struct tl_conn *c, uint64_t ns_from_now);

/* tl_timer_clear_deadline disarms c's lifecycle timer (no-op if unarmed). */
void tl_timer_clear_deadline(struct tl_loop *l, struct tl_conn *c);

/* tl_timer_hb_next returns when c's heartbeat must next be looked at: its
 * read timeout counted from the last receive, or its next ping (an
 * interval after the later of the last receive and the last ping). c must
 * have its dial parameters. */
uint64_t tl_timer_hb_next(const struct tl_conn *c);

/* tl_timer_hb_arm arms c's heartbeat check (c->hb_ns) at the absolute
 * time at, counting it in l->hb_timed. */
void tl_timer_hb_arm(struct tl_loop *l, struct tl_conn *c, uint64_t at);

/* tl_timer_hb_clear disarms c's heartbeat check (no-op if unarmed). */
void tl_timer_hb_clear(struct tl_loop *l, struct tl_conn *c);

/* tl_timer_hb_start arms c's heartbeat as it opens when its dial asks for
 * a ping interval or a read timeout (sockets only): the silence counts
 * from now. */
void tl_timer_hb_start(struct tl_loop *l, struct tl_conn *c);

#endif
