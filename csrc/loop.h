/* loop.h - the io_uring loop (loop.c): thread, setup, the wait, CQE
 * dispatch, stalls, re-arms and the sweep, shutdown, and the C API in
 * talaris.h. Includes the headers of every layer below it for the files
 * at the top (cmdq.c, decoder.c) and the C tests, fuzzers and benchmarks.
 * The layers below the loop include state.h, never this header.
 * Internal: Go sees talaris.h and ring.h only. */
#ifndef TALARIS_LOOP_H
#define TALARIS_LOOP_H

#include "cmdq.h"
#include "conn.h"
#include "evq.h"
#include "life.h"
#include "pub.h"
#include "ring.h"
#include "rx.h"
#include "sample.h"
#include "slots.h"
#include "state.h"
#include "talaris.h"
#include "tick.h"
#include "timer.h"
#include "tls.h"
#include "tx.h"
#include "uring.h"

/* tl_loop_new_detached allocates a loop's rings, arena and tables with no
 * thread and no io_uring: the decoder, fuzzers and C benchmarks drive
 * tl_conn_feed on memory connections of it directly (then tl_life_after).
 * Returns NULL on bad sizes or no memory. Free with tl_loop_free. */
struct tl_loop *tl_loop_new_detached(const struct tl_config *cfg);

#endif
