/* loop/loop.h - the io_uring loop (setup.c, wait.c, dispatch.c, probe.c,
 * stall.c, run.c, api.c): thread, setup, the wait, CQE dispatch, stalls,
 * re-arms and the sweep, shutdown, and the C API in talaris.h. Includes the headers of every layer below it for the files
 * at the top (cmdq.c, decoder.c) and the C tests, fuzzers and benchmarks.
 * The layers below the loop include loop/state.h, never this header.
 * Internal: Go sees talaris.h and ring.h only. */
#ifndef TALARIS_LOOP_H
#define TALARIS_LOOP_H

#include "loop/cmdq.h"
#include "ws/conn.h"
#include "base/evq.h"
#include "loop/life.h"
#include "base/pub.h"
#include "ring.h"
#include "loop/rx.h"
#include "base/sample.h"
#include "base/slots.h"
#include "loop/state.h"
#include "talaris.h"
#include "loop/tick.h"
#include "base/timer.h"
#include "transport/tls.h"
#include "loop/tx.h"
#include "loop/uring.h"

/* tl_loop_new_detached allocates a loop's rings, arena and tables with no
 * thread and no io_uring: the decoder, fuzzers and C benchmarks drive
 * tl_conn_feed on memory connections of it directly (then tl_life_after).
 * Returns NULL on bad sizes or no memory. Free with tl_loop_free. */
struct tl_loop *tl_loop_new_detached(const struct tl_config *cfg);

#endif
