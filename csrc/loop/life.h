/* loop/life.h - a connection's lifecycle in the loop (life.c). */
#ifndef TALARIS_LIFE_H
#define TALARIS_LIFE_H

#include <stdint.h>
#include <sys/socket.h>

#include "loop/state.h"

/* tl_life_dial starts connection slot/gen from the parameters
 * tl_dial_prepare stored: socket, then an asynchronous connect. Failures
 * end the connection with an error event. */
void tl_life_dial(struct tl_loop *l, uint32_t slot, uint32_t gen);

/* tl_life_dial_start makes one attempt of c with c->dial (the first
 * dial, and each reconnect): handshake deadline, then tl_life_start_connect
 * to the first address. */
void tl_life_dial_start(struct tl_loop *l, struct tl_conn *c);

/* tl_life_start_connect opens a socket for addr (bound to the dial's local
 * address, if any) and submits its asynchronous connect. Returns 0, or -1
 * after failing c. */
int tl_life_start_connect(struct tl_loop *l, struct tl_conn *c, const struct sockaddr_storage *addr);

/* tl_life_open_memory opens slot as a socketless connection (state open,
 * EventOpen queued): fed with TL_CMD_INJECT or tl_decoder_feed. */
void tl_life_open_memory(struct tl_loop *l, uint32_t slot, uint32_t gen);

/* tl_life_drive runs c's transport (tl_plain_drive or tl_tls_drive) over
 * its queued input and acts on the outcome: the transport's requests
 * (tl_life_after), a stall, the end of input once all of it is parsed
 * (tl_conn_on_eof), then a flush of the replies. No-op when c is dying. */
void tl_life_drive(struct tl_loop *l, struct tl_conn *c);

/* tl_life_session_start starts c's session once its socket is connected
 * (and any proxy's tunnel stands): TLS for wss, else the upgrade request.
 * Returns 0, or -1 after failing c; the caller runs tl_life_after. */
int tl_life_session_start(struct tl_loop *l, struct tl_conn *c);

/* tl_life_after acts on the requests (TL_DO_*, ws/conn.h) a call into ws/,
 * the transports or tx.c left in c->todo, and clears them: teardown alone,
 * else regroup, end of the sending side, flush (and again for what a
 * failed flush requested). Every caller of those layers above them calls
 * it before it looks at c again. */
void tl_life_after(struct tl_loop *l, struct tl_conn *c);

/* tl_life_flush is tl_tx_flush followed by tl_life_after when the flush
 * failed c. */
void tl_life_flush(struct tl_loop *l, struct tl_conn *c);

/* tl_life_stall marks c stalled (input held back for lack of ring, arena
 * or send space) and puts it on l->stalled, resumed when space returns. */
void tl_life_stall(struct tl_loop *l, struct tl_conn *c);

/* tl_life_fail is tl_conn_fail followed by tl_life_after: it records why
 * c failed (the first cause wins) and starts its end, a close frame with
 * code when open (0: none), then teardown after the peer answers or a
 * timeout. detail is copied. */
void tl_life_fail(struct tl_loop *l, struct tl_conn *c, int err, int aux, uint16_t code, const char *detail);

/* tl_life_teardown cancels c's operations; the socket is closed and the
 * final event published once they have all completed
 * (tl_life_maybe_finish). Idempotent. */
void tl_life_teardown(struct tl_loop *l, struct tl_conn *c);

/* tl_life_abort ends c at once (Conn.Abort): queued output dropped, the
 * socket shut down both ways, then teardown; the final event is
 * EventError with TL_E_ABORTED. No-op when c is already dying. */
void tl_life_abort(struct tl_loop *l, struct tl_conn *c);

/* tl_life_maybe_finish closes a dying c's socket once no operation of it
 * is in flight, then publishes its final event or starts its reconnect
 * wait. Called after every completion of a dying connection. */
void tl_life_maybe_finish(struct tl_loop *l, struct tl_conn *c);

/* tl_life_finish publishes c's final event (EventClose or EventError);
 * when the ring is full c waits on the stall list (TL_DYING_FINAL) unless
 * the pool is closing (then the event is dropped). Once it is out the
 * slot is Go's again. */
void tl_life_finish(struct tl_loop *l, struct tl_conn *c);

/* tl_life_end_or_reconnect ends c (tl_life_finish) or, under a reconnect
 * policy, publishes EventReconnecting and arms the backoff. c's socket is
 * closed and no operation of it is in flight. */
void tl_life_end_or_reconnect(struct tl_loop *l, struct tl_conn *c);

/* tl_life_dying_set moves c's teardown state (tl_conn.dying) to to, the
 * one place it changes. The transitions: NO -> TEARDOWN (tl_life_teardown),
 * TEARDOWN -> FINAL (the ring had no room for the final event; FINAL ->
 * FINAL: still none), TEARDOWN or FINAL -> NO (the final event is out, or
 * dropped while the pool closes: the slot is Go's again; or the next
 * reconnect attempt starts). TL_DEBUG builds abort on a second TEARDOWN or
 * a FINAL without one. */
void tl_life_dying_set(struct tl_conn *c, uint8_t to);

/* tl_life_rc_set moves c's reconnect state (tl_conn.rc) to to, the one
 * place it changes, and keeps l->rc_waits (the connections in
 * TL_RC_BACKOFF) with it. The transitions: NONE -> ANNOUNCE (the ring had
 * no room for EventReconnecting), NONE or ANNOUNCE -> BACKOFF (announced),
 * BACKOFF -> NONE (the deadline starts the next attempt, or the connection
 * ends while it waits), ANNOUNCE -> NONE (no reconnect after all: the
 * final event follows). */
void tl_life_rc_set(struct tl_loop *l, struct tl_conn *c, uint8_t to);

/* tl_life_stop_reconnect ends c's reconnect policy: its next end is
 * final (Conn.Close, and an abort, call it before ending c). */
void tl_life_stop_reconnect(struct tl_conn *c);

/* tl_life_free_dial frees a dial copy and everything it owns (NULL
 * allowed). */
void tl_life_free_dial(struct tl_dial *d);

/* tl_life_emit appends one event for c: kind, payload p[0..n) copied into
 * the arena, and for control and final events code, err, aux and flags.
 * Returns 0, or -1 when the ring or arena is full (nothing was written).
 * The lifecycle's own events (open of a memory connection, reconnecting,
 * final); ws/ appends its events to the evq directly. */
static inline int tl_life_emit(struct tl_loop *l, struct tl_conn *c, int kind, const uint8_t *p, size_t n,
			       uint16_t code, int err, int aux, int flags)
{
	struct tl_evmeta m = {.slot = c->slot, .gen = c->gen, .code = code, .kind = (uint8_t)kind,
			      .flags = (uint8_t)flags, .err = err, .aux = aux};
	return tl_evq_append(&l->evq, m, p, n);
}

#endif
