/* loop/tick.h - firing due timers (tick.c). */
#ifndef TALARIS_TICK_H
#define TALARIS_TICK_H

#include "loop/state.h"

/* tl_tick_armed says some connection has a timer of any kind armed. */
static inline int tl_tick_armed(const struct tl_loop *l) { return l->timed || l->hb_timed; }

/* tl_tick_run fires every due timer at now (the clock, read by the
 * caller) when the earliest armed one is due (else it only compares
 * l->next_timer_ns with now), and recomputes l->next_timer_ns. Once per
 * loop iteration; a read timeout counts silence up to seen, the clock
 * just before the caller's last look at its completions (at or before
 * now). */
void tl_tick_run(struct tl_loop *l, uint64_t now, uint64_t seen);

#endif
