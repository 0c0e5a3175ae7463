/* loop.h - the io_uring loop (loop.c): user_data encoding, the
 * receive-side states, and the functions loop.c exports to the layers
 * above it (cmdq.c, decoder.c, talaris.h's C API) and to the C tests,
 * fuzzers and benchmarks. The loop's state (struct tl_loop) is in state.h;
 * the layers below the loop (conn.c, plain.c, tls.c, pub.c, timer.c)
 * include state.h, not this header, so they cannot call up into loop.c.
 * Internal: Go sees talaris.h and ring.h only. */
#ifndef TALARIS_LOOP_H
#define TALARIS_LOOP_H

#include <liburing.h>
#include <pthread.h>
#include <stdint.h>

#include "cmdq.h"
#include "conn.h"
#include "evq.h"
#include "pub.h"
#include "ring.h"
#include "sample.h"
#include "slots.h"
#include "state.h"
#include "talaris.h"
#include "timer.h"
#include "tls.h"

/* user_data layout: op (8 bits) | gen (32 bits) | slot (24 bits). The
 * generation makes a late completion for a reused slot harmless. */
enum {
	TL_OPK_CONNECT = 1, /* 0 is no op: a CQE carrying it is ignored */
	TL_OPK_RECV = 2,
	TL_OPK_SEND = 3,
	TL_OPK_CANCEL = 4,
	TL_OPK_EFD = 5,
	TL_OPK_RECV_HS = 7, /* a recv on the handshake buffer group */
};

#define TL_SLOT_BITS 24
#define TL_MAX_SLOTS (1u << TL_SLOT_BITS)

static inline uint64_t tl_ud(unsigned op, uint32_t gen, uint32_t slot)
{
	return ((uint64_t)op << 56) | ((uint64_t)gen << TL_SLOT_BITS) | (slot & (TL_MAX_SLOTS - 1));
}
static inline unsigned tl_ud_op(uint64_t ud) { return (unsigned)(ud >> 56); }
static inline uint32_t tl_ud_gen(uint64_t ud) { return (uint32_t)(ud >> TL_SLOT_BITS); }
static inline uint32_t tl_ud_slot(uint64_t ud) { return (uint32_t)(ud & (TL_MAX_SLOTS - 1)); }

/* Receive side of a connection (tl_conn.rx); transitions in rx_step. */
enum {
	TL_RX_OFF = 0,  /* no recv, none wanted: not connected, ended (eof), memory, or dying */
	TL_RX_ARMED,    /* a multishot recv is in the kernel */
	TL_RX_WANT,     /* ended (-ENOBUFS, with data, regrouped, no SQE): re-arm when a slot is free */
	TL_RX_PAUSING,  /* in the kernel, cancel sent: stalled holding its share of slots */
	TL_RX_REARMING, /* in the kernel, cancel sent to switch groups (or a pause resumed early) */
	TL_RX_PAUSED,   /* ended by a pause; re-armed when the connection resumes */
};

/* Inputs of rx_step. */
enum { RX_ARM, RX_END, RX_PAUSE, RX_RESUME, RX_REGROUP, RX_TICK, RX_TEARDOWN };



/* loop.c */

/* tl_loop_new_detached allocates a loop's rings, arena and tables with no
 * thread and no io_uring: the decoder, fuzzers and C benchmarks drive
 * tl_conn_feed on memory connections of it directly (then tl_loop_after).
 * Returns NULL on bad sizes or no memory. Free with tl_loop_free. */
struct tl_loop *tl_loop_new_detached(const struct tl_config *cfg);

/* tl_loop_open_memory opens slot as a socketless connection (state open,
 * EventOpen queued): fed with TL_CMD_INJECT or tl_decoder_feed. */
void tl_loop_open_memory(struct tl_loop *l, uint32_t slot, uint32_t gen);

/* tl_loop_dial starts connection slot/gen from the parameters
 * tl_dial_prepare stored: socket, then an asynchronous connect. Failures
 * end the connection with an error event. */
void tl_loop_dial(struct tl_loop *l, uint32_t slot, uint32_t gen);

/* tl_loop_stop_reconnect ends c's reconnect policy: its next end is
 * final (Conn.Close, and an abort, call it before ending c). */
void tl_loop_stop_reconnect(struct tl_conn *c);

/* tl_loop_sqe returns a free submission entry, submitting what is queued
 * when the SQ is full; NULL if there is still none. */
struct io_uring_sqe *tl_loop_sqe(struct tl_loop *l);

/* tl_loop_stall marks c stalled (input held back for lack of ring, arena
 * or send space) and puts it on the list resumed when space returns. */
void tl_loop_stall(struct tl_loop *l, struct tl_conn *c);

/* tl_loop_flush submits c's collected output unless a send is in flight
 * (one send per connection at a time keeps bytes in order): the send
 * queue tops up the collecting out buffer, a wss connection's framed
 * plaintext is encrypted into it (tl_tls_seal), then it goes to the
 * kernel. Acts on what those calls leave in c->todo. */
void tl_loop_flush(struct tl_loop *l, struct tl_conn *c);

/* tl_loop_after acts on the requests (TL_DO_*, conn.h) a call into conn.c,
 * plain.c or tls.c left in c->todo, and clears them: teardown, else
 * regroup, end of the sending side, flush. Every caller of those layers
 * calls it before it looks at c again. */
void tl_loop_after(struct tl_loop *l, struct tl_conn *c);

/* tl_loop_fail is tl_conn_fail followed by tl_loop_after: it records why
 * c failed (the first cause wins) and starts its end, a close frame with
 * code when open (0: none), then teardown after the peer answers or a
 * timeout. detail is copied. */
void tl_loop_fail(struct tl_loop *l, struct tl_conn *c, int err, int aux, uint16_t code, const char *detail);

/* tl_loop_teardown cancels c's operations; the socket is closed and the
 * final event published once they have all completed. Idempotent. */
void tl_loop_teardown(struct tl_loop *l, struct tl_conn *c);

/* tl_loop_abort ends c at once (Conn.Abort): queued output dropped, the
 * socket shut down both ways, then teardown; the final event is
 * EventError with TL_E_ABORTED. No-op when c is already dying. */
void tl_loop_abort(struct tl_loop *l, struct tl_conn *c);

/* tl_loop_shut_wr ends c's sending side once its close handshake is
 * complete: TLS close_notify after the last frame, then shutdown(SHUT_WR)
 * when every queued byte has left (tl_loop_flush). The peer sees the end
 * at once and closes its side; the close timeout bounds the wait for
 * that. Once per connection; no-op for memory or dying connections. */
void tl_loop_shut_wr(struct tl_loop *l, struct tl_conn *c);

/* tl_loop_emit appends one event for c: kind, payload p[0..n) copied into
 * the arena, and for control and final events code, err, aux and flags.
 * Returns 0, or -1 when the ring or arena is full (nothing was written).
 * The loop's own events (open of a memory connection, reconnecting,
 * final); conn.c appends its events to the evq directly. */
static inline int tl_loop_emit(struct tl_loop *l, struct tl_conn *c, int kind, const uint8_t *p, size_t n,
			       uint16_t code, int err, int aux, int flags)
{
	struct tl_evmeta m = {.slot = c->slot, .gen = c->gen, .code = code, .kind = (uint8_t)kind,
			      .flags = (uint8_t)flags, .err = err, .aux = aux};
	return tl_evq_append(&l->evq, m, p, n);
}

#endif
