/* ws/frames.c - the streaming frame parser (tl_conn_feed): split headers,
 * payloads across buffer slots, fragmentation and reassembly, interleaved
 * control frames, UTF-8 of text messages, publication into the event ring
 * (in place where the payload lies in a slot, else copied into the arena,
 * a burst of small frames at once) and receive fairness (a connection's
 * share of the ring). The upgrade response before the frames is
 * ws/upgrade.c's, a close frame's meaning ws/close.c's. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ws/internal.h"
#include "base/pub.h"
#include "base/sample.h"
#include "loop/state.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* conn_inplace says whether a whole frame of the current run may be
 * delivered in place: the run is a main-group or plaintext slot
 * (tl_slots_inplace), or the caller's own buffer (TL_CUR_CALLER). */
static inline int conn_inplace(const struct tl_loop *l, const struct tl_conn *c)
{
	return c->cur_q == TL_CUR_CALLER || (c->cur_q >= 0 && tl_slots_inplace(&l->slots, (uint32_t)c->cur_q));
}

/* conn_keep_slot keeps the receive slot the input lies in (c->cur_q, if
 * any) out of the kernel until Go has passed the event just appended (the
 * evq's tail): payloads delivered in place point into it. */
static inline void conn_keep_slot(struct tl_loop *l, const struct tl_conn *c)
{
	if (c->cur_q >= 0)
		l->slots.ref[c->cur_q] = l->evq.tail;
}

/* conn_emit_inplace publishes a data message whose payload stays where it
 * is (conn_inplace: a whole frame inside the current run): no arena copy.
 * A slot is recycled only after Go has passed the event
 * (tl_slots_release); a caller's buffer outlives the events by contract. */
static inline __attribute__((always_inline)) int conn_emit_inplace(struct tl_loop *l, struct tl_conn *c, int kind,
								   const uint8_t *p, size_t n)
{
	struct tl_evmeta m = {.slot = c->slot, .gen = c->gen, .kind = (uint8_t)kind};
	if (tl_evq_append_ref(&l->evq, m, p, n) < 0)
		return -1;
	conn_keep_slot(l, c);
	return 0;
}

/* fair_pressed says whether a connection at its share must keep to it
 * now: another connection is light, or the ring is under pressure
 * (l->fair_press_*, on the head as last read). */
static inline int fair_pressed(const struct tl_loop *l)
{
	const struct tl_evq *q = &l->evq;
	return l->fair_light || q->tail - q->head_cache >= l->fair_press_events ||
	       q->wpos - q->rpos >= l->fair_press_bytes;
}

/* fair_skip_set exempts c, heavy with nobody to protect (fair_pressed
 * false), from the share check (conn_held, feed_burst) until the ring
 * could come under pressure - the pressure bounds from the head as last
 * read: the head only moves on, so that is early, never late - or until
 * tl_loop_fair_tick recounts the light connections: the only ways fair_pressed
 * can turn true (fair_light grows only in that recount, which clears
 * every skip). Without it a flood past its share would take conn_held_slow,
 * and end its burst, per message; a quarter share of events at a time (as
 * before) still cut a 16-connection ws flood's bursts into 64-event
 * pieces, each with a frame through the general parser and this call
 * (docs/ARCHITECTURE.md, "Receive fairness"). */
static inline void fair_skip_set(const struct tl_loop *l, struct tl_conn *c)
{
	c->fair_skip = l->evq.head_cache + l->fair_press_events;
	c->fair_skip_w = l->evq.rpos + l->fair_press_bytes;
}

/* conn_held_slow is conn_held once the cached counts (which only
 * overstate) say c is at its share. Found there exactly, c becomes heavy for
 * this epoch and the next; it is held only while another connection is
 * light - one whose next message would otherwise wait behind c's flood -
 * or while the ring is under pressure (l->fair_press_*: then every
 * connection keeps to its share, floods among themselves too). Floods
 * alone go on at the cost of two compares: their messages wait behind one
 * another whatever the loop does, and holding each at its share only made
 * loop and pump take turns (docs/ARCHITECTURE.md, "Receive fairness").
 * Returns 1 (hold) or 0. */
static __attribute__((noinline)) int conn_held_slow(struct tl_loop *l, struct tl_conn *c, size_t n)
{
	struct tl_evq *q = &l->evq;
	uint32_t me = l->cfg.conn_max_events;
	uint64_t mb = l->cfg.conn_max_bytes;

	if (c->fair_heavy != l->fair_epoch) {
		/* First time at its share this epoch: exact counts decide. */
		if (!tl_evq_owner_over(q, c->slot, n, me, mb))
			return 0;
		if (c->fair_light && l->fair_light)
			l->fair_light--; /* counted light at the last recount */
		c->fair_light = 0;
		c->fair_heavy = l->fair_epoch;
		if (!fair_pressed(l)) { /* (after c left the light count) */
			fair_skip_set(l, c);
			return 0;
		}
	} else if (!fair_pressed(l)) {
		fair_skip_set(l, c);
		return 0;
	} else if (!tl_evq_owner_over(q, c->slot, n, me, mb)) {
		return 0;
	}
	/* Here fair_pressed(l) held on every branch: pressed and over its share. */
	if (l->shutting_down)
		return 0;
	if (!c->stalled)
		__atomic_store_n(&l->stats->fair_holds, l->stats->fair_holds + 1, __ATOMIC_RELAXED);
	c->fair_held = 1;
	return 1;
}

int tl_conn_fair_still_held(const struct tl_loop *l, const struct tl_conn *c)
{
	if (!c->fair_held || l->shutting_down || !l->evq.counting || !fair_pressed(l))
		return 0;
	return l->evq.own_events[c->slot] > l->cfg.conn_max_events / 2 ||
	       l->evq.own_bytes[c->slot] > l->cfg.conn_max_bytes / 2;
}

/* conn_room is how much c may publish before conn_held_slow has to
 * decide whether it waits: events and payload bytes (UINT64_MAX: no
 * bound), and skip_w, the arena write position its fair skip ends at
 * (UINT64_MAX: none). No bound while counting is off (c is alone: loop/run.c
 * turns it on from two connections with a socket, and nobody's message
 * can wait behind it); up to fair_skip while c is heavy with nobody to
 * protect (fair_skip_set); else what is left of its share on the cached
 * counts (they only overstate; bytes may be 0: a message without payload
 * still fits). Returns 0 when c is at or past its share of events or past
 * its share of bytes (conn_held_slow decides), else 1. conn_held asks it
 * per message, feed_burst once for a burst. */
struct conn_room {
	uint64_t events, bytes, skip_w;
};

static inline __attribute__((always_inline)) int conn_room(const struct tl_loop *l, const struct tl_conn *c,
							     struct conn_room *r)
{
	const struct tl_evq *q = &l->evq;
	uint32_t oe, me = l->cfg.conn_max_events;
	uint64_t ob, mb = l->cfg.conn_max_bytes;

	r->events = r->bytes = r->skip_w = UINT64_MAX;
	if (!q->counting)
		return 1;
	if (q->tail < c->fair_skip && q->wpos < c->fair_skip_w) {
		r->events = c->fair_skip - q->tail;
		r->skip_w = c->fair_skip_w;
		return 1;
	}
	oe = q->own_events[c->slot];
	ob = q->own_bytes[c->slot];
	if (oe >= me || ob > mb)
		return 0;
	r->events = me - oe;
	r->bytes = mb - ob;
	return 1;
}

/* conn_held says whether c must wait before it publishes its next
 * peer-driven event (a data message, a ping or a pong) with an n-byte
 * payload: c already has its share of the event ring pending, appended
 * and not yet passed by the pump (cfg.conn_max_events events, or
 * cfg.conn_max_bytes payload bytes: Knobs.MaxConnPendingEvents/Bytes),
 * and another connection is light or the ring under pressure
 * (conn_held_slow). The caller then stops parsing as for a full ring
 * (TL_FEED_STALL: c goes on the stalled list, its recv is paused once it
 * holds its share of slots), and the loop resumes it (tl_loop_run_stalled,
 * tl_conn_fair_still_held) once the pump has passed at least half of its share.
 * So a flood queues at most that much ahead of a light connection's
 * message, whatever the ring's size.
 * Never while c is the only connection with a socket (a lone flood keeps
 * the whole ring: loop and pump then overlap instead of taking turns),
 * nor while the pool shuts down (events that do not fit are dropped then,
 * see ring_full). Returns 1 (hold) or 0. Inline: two compares per message
 * under the limit (on the cached counts: they only overstate), a third
 * past it while the flood has nobody to protect. */
static inline __attribute__((always_inline)) int conn_held(struct tl_loop *l, struct tl_conn *c, size_t n)
{
	struct conn_room r;

	if (__builtin_expect(conn_room(l, c, &r) && n <= r.bytes, 1))
		return 0;
	return conn_held_slow(l, c, n);
}

static int grow_msg(struct tl_conn *c, size_t need)
{
	size_t cap = c->msg_cap ? c->msg_cap : 4096;
	uint8_t *m;
	if (need <= c->msg_cap)
		return 0;
	while (cap < need)
		cap *= 2;
	m = realloc(c->msg, cap);
	if (!m)
		return -1;
	c->msg = m;
	c->msg_cap = cap;
	return 0;
}

/* count_in_n mirrors k delivered messages of bytes payload bytes into the
 * connection's public counters and the pool's (stored to the shared stats
 * once per batch, by the publish: count before it). */
static inline void count_in_n(struct tl_loop *l, struct tl_conn *c, uint64_t k, uint64_t bytes)
{
	struct tl_conn_pub *pub = &l->pub[c->slot];
	c->msgs_in += k;
	c->bytes_in += bytes;
	__atomic_store_n(&pub->msgs_in, c->msgs_in, __ATOMIC_RELAXED);
	__atomic_store_n(&pub->bytes_in, c->bytes_in, __ATOMIC_RELAXED);
	l->evq.msgs += k;
	l->evq.bytes += bytes;
}

/* count_in counts one delivered message (count_in_n) and hands it a
 * pending sample's stamps. */
static inline void count_in(struct tl_loop *l, struct tl_conn *c, size_t n)
{
	count_in_n(l, c, 1, n);
	tl_sample_msg(l, c);
}

/* ring_full says what an event that did not fit means: a stall
 * (back-pressure, the rest waits for the pump) - except once the pool is
 * closing: Go pumps no more (Close drops pending events) and the close
 * handshake behind these messages must still be read, so the event is
 * dropped (-1 then means nothing: callers see 0). Cold path only. */
static int ring_full(const struct tl_loop *l)
{
	return l->shutting_down ? TL_FEED_OK : TL_FEED_STALL;
}

/* publish_data publishes a reassembled message, copied into the arena. */
static inline int publish_data(struct tl_loop *l, struct tl_conn *c, int op, const uint8_t *p, size_t n)
{
	if (conn_held(l, c, n))
		return TL_FEED_STALL; /* over its share of the ring: wait for the pump */
	if (conn_emit(l, c, op == TL_OP_TEXT ? TL_EV_TEXT : TL_EV_BINARY, p, n, 0, 0, 0, 0) < 0)
		return ring_full(l);
	count_in(l, c, n);
	return TL_FEED_OK;
}

/* publish_frame publishes a whole frame found inside the current run: in
 * place when the run is a main-ring receive slot or a TLS plaintext slot
 * (the slot is recycled only after the pump has passed the event), else
 * copied like publish_data. The few handshake-group slots must come back
 * at once, or a flood nobody pumps would keep the next 101 from arriving. */
static inline int publish_frame(struct tl_loop *l, struct tl_conn *c, int op, const uint8_t *p, size_t n)
{
	int kind = op == TL_OP_TEXT ? TL_EV_TEXT : TL_EV_BINARY;
	int r;

	if (conn_held(l, c, n))
		return TL_FEED_STALL; /* over its share of the ring: wait for the pump */
	r = conn_inplace(l, c) ? conn_emit_inplace(l, c, kind, p, n) : conn_emit(l, c, kind, p, n, 0, 0, 0, 0);
	if (r < 0)
		return ring_full(l);
	count_in(l, c, n);
	return TL_FEED_OK;
}

/* text_valid is tl_utf8_valid with the common case inline: a short
 * all-ASCII payload (JSON ticks) is checked with two word loads. */
static inline int text_valid(const uint8_t *p, size_t n)
{
	const uint64_t hi = 0x8080808080808080ull;
	if (n >= 8 && n <= 16) {
		uint64_t a, b;
		__builtin_memcpy(&a, p, 8);
		__builtin_memcpy(&b, p + n - 8, 8);
		if (((a | b) & hi) == 0)
			return 1;
	} else if (n < 8) {
		uint64_t a = 0;
		__builtin_memcpy(&a, p, n);
		if ((a & hi) == 0)
			return 1;
	}
	return tl_utf8_valid(p, n);
}

/* hold_text_bad validates the have payload bytes of a held text frame at
 * pl that earlier holds of it have not checked (c->rx_held_ok, zeroed by
 * the transport when it offers a run that does not start with the frame
 * it held). Returns 1 when they are not valid UTF-8. Cold: only frames cut
 * by the end of what is decrypted so far. */
static int hold_text_bad(struct tl_conn *c, const uint8_t *pl, size_t have)
{
	if (c->rx_held_ok == 0)
		tl_utf8_reset(&c->utf8); /* free: no fragmented message is under way */
	if (have <= c->rx_held_ok)
		return 0;
	if (tl_utf8_feed(&c->utf8, pl + c->rx_held_ok, have - c->rx_held_ok) < 0)
		return 1;
	c->rx_held_ok = have;
	return 0;
}

/* parse_hdr decodes the header at hp; the common server frame (no RSV, a
 * data opcode, unmasked, length < 126 or in the 16-bit form) is handled
 * inline: wss feeds of 126 B to 64 KiB messages (JSON books, 256 B ticks)
 * take the 16-bit form, and a call into tl_ws_parse_hdr per frame showed
 * in the loop thread's profile. Everything else (control frames, the
 * 64-bit form, errors, a header cut short) goes to tl_ws_parse_hdr,
 * which gives the same answer for these inputs (fuzz_ws_hdr, test_ws). */
static inline int parse_hdr(const uint8_t *hp, size_t avail, tl_ws_hdr *h)
{
	if (avail >= 2) {
		unsigned b0 = hp[0], b1 = hp[1], op = b0 & 0x0f;
		if ((b0 & 0x70) == 0 && b1 <= 126 && (op == TL_OP_TEXT || op == TL_OP_BINARY || op == TL_OP_CONT)) {
			int hl = 2;
			uint64_t len = b1;
			if (b1 == 126) {
				if (avail < 4)
					return tl_ws_parse_hdr(hp, avail, h);
				len = (uint64_t)hp[2] << 8 | hp[3];
				hl = 4;
			}
			h->fin = (uint8_t)(b0 >> 7);
			h->rsv = 0;
			h->opcode = (uint8_t)op;
			h->masked = 0;
			h->len = len;
			return hl;
		}
	}
	return tl_ws_parse_hdr(hp, avail, h);
}

/* handle_ctrl acts on a complete control frame in c->ctrl. The event goes
 * first: if it cannot be published, nothing is sent and the frame is
 * retried. */
static int handle_ctrl(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_conn_pub *pub = &l->pub[c->slot];
	switch (c->h.opcode) {
	case TL_OP_PING:
		if (conn_held(l, c, c->ctrl_len) ||
		    (conn_emit(l, c, TL_EV_PING, c->ctrl, c->ctrl_len, 0, 0, 0, 0) < 0 && ring_full(l)))
			return TL_FEED_STALL;
		__atomic_store_n(&pub->pings_in, pub->pings_in + 1, __ATOMIC_RELAXED);
		/* Also while our close frame waits behind queued data: the
		 * pong goes ahead of it (RFC 6455 allows it), so a server's
		 * heartbeat does not drop a connection that is still draining. */
		if (!tl_conn_close_sent(c) || c->close_queued)
			send_reply(l, c, TL_OP_PONG, c->ctrl, c->ctrl_len);
		break;
	case TL_OP_PONG:
		if (conn_held(l, c, c->ctrl_len) ||
		    (conn_emit(l, c, TL_EV_PONG, c->ctrl, c->ctrl_len, 0, 0, 0, 0) < 0 && ring_full(l)))
			return TL_FEED_STALL;
		__atomic_store_n(&pub->pongs_in, pub->pongs_in + 1, __ATOMIC_RELAXED);
		break;
	case TL_OP_CLOSE:
		tl_conn_pend_set(c, TL_PEND_NONE);
		return tl_conn_close_frame(l, c);
	}
	tl_conn_pend_set(c, TL_PEND_NONE);
	return TL_FEED_OK;
}

/* begin_frame checks a parsed header against the message state. */
static int begin_frame(struct tl_loop *l, struct tl_conn *c)
{
	const tl_ws_hdr *h = &c->h;
	if (h->opcode >= 0x8)
		return TL_FEED_OK; /* control frames are valid anywhere */
	if (h->opcode == TL_OP_CONT && !c->msg_op)
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "continuation frame without a message");
	if (h->opcode != TL_OP_CONT && c->msg_op)
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "new message inside a fragmented message");
	if (h->len > l->cfg.max_message || c->msg_len + h->len > l->cfg.max_message)
		return fail_proto(l, c, TL_E_TOO_BIG, 1009, "message exceeds the maximum message size");
	return TL_FEED_OK;
}

static int hdr_error(struct tl_loop *l, struct tl_conn *c, int r)
{
	switch (r) {
	case TL_WS_ERR_RSV:
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "reserved bits set");
	case TL_WS_ERR_OPCODE:
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "reserved opcode");
	case TL_WS_ERR_MASKED:
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "masked frame from the server");
	case TL_WS_ERR_CTRL_FRAG:
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "fragmented control frame");
	case TL_WS_ERR_CTRL_LEN:
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "control frame longer than 125 bytes");
	case TL_WS_ERR_LEN64:
		/* RFC 6455 5.2: the top bit "MUST be 0", so this is a malformed
		 * header (1002, as ws.Parser says), not an over-long message. */
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "frame length has the top bit set");
	}
	return fail_proto(l, c, TL_E_PROTOCOL, 1002, "bad frame header");
}

static int frame_done(struct tl_loop *l, struct tl_conn *c)
{
	if (c->h.opcode >= 0x8) {
		tl_conn_pend_set(c, TL_PEND_CTRL);
		return handle_ctrl(l, c);
	}
	if (!c->h.fin)
		return TL_FEED_OK;
	if (c->msg_op == TL_OP_TEXT && !tl_utf8_complete(&c->utf8))
		return fail_proto(l, c, TL_E_UTF8, 1007, "text message ends inside a UTF-8 sequence");
	tl_conn_pend_set(c, TL_PEND_MSG);
	if (publish_data(l, c, c->msg_op, c->msg, c->msg_len) < 0)
		return TL_FEED_STALL;
	tl_conn_pend_set(c, TL_PEND_NONE);
	c->msg_op = 0;
	c->msg_len = 0;
	return TL_FEED_OK;
}

/* flush_pending publishes what a stall left half done: the open event, a
 * reassembled message, a control frame (and its reply). */
static int flush_pending(struct tl_loop *l, struct tl_conn *c)
{
	if (c->pending == TL_PEND_OPEN && tl_conn_publish_open(l, c) < 0)
		return TL_FEED_STALL;
	if (c->pending == TL_PEND_MSG) {
		if (publish_data(l, c, c->msg_op, c->msg, c->msg_len) < 0)
			return TL_FEED_STALL;
		tl_conn_pend_set(c, TL_PEND_NONE);
		c->msg_op = 0;
		c->msg_len = 0;
	}
	if (c->pending == TL_PEND_CTRL)
		return handle_ctrl(l, c);
	return TL_FEED_OK;
}

int tl_conn_flush_pending(struct tl_loop *l, struct tl_conn *c)
{
	if (c->discard) /* as tl_conn_feed: nothing counts after a failure or close */
		return TL_FEED_OK;
	return flush_pending(l, c);
}

/* burst_frames appends the whole small data frames at p[off..n) to run r
 * (copy: into the arena, else in place) up to the first frame that is
 * anything else or does not fit (see feed_burst), and returns the offset
 * after the last one appended. copy is a constant at each call (inlined),
 * so each mode gets its own loop. */
static inline __attribute__((always_inline)) size_t burst_frames(struct tl_evq_run *r, const uint8_t *p, size_t n,
								  size_t off, uint64_t maxmsg, uint64_t max_bytes,
								  int copy)
{
	while (n - off >= 2) {
		unsigned b0 = p[off], b1 = p[off + 1];
		size_t hl = 2, len = b1;
		const uint8_t *pl;

		/* FIN, no RSV, text or binary; unmasked with a 7- or 16-bit
		 * length (b1 <= 126: the mask bit is clear). */
		if ((b0 != 0x81 && b0 != 0x82) || b1 > 126)
			break;
		if (b1 == 126) {
			if (n - off < 4)
				break;
			len = (size_t)p[off + 2] << 8 | p[off + 3];
			hl = 4;
		}
		if (len > n - off - hl || len > maxmsg || r->bytes + len > max_bytes)
			break;
		pl = p + off + hl;
		if (b0 == 0x81 && !text_valid(pl, len))
			break; /* tl_conn_feed fails it (1007) */
		if (tl_evq_run_add(r, b0 == 0x81 ? TL_EV_TEXT : TL_EV_BINARY, pl, len, copy) < 0)
			break;
		off += hl + len;
	}
	return off;
}

/* feed_burst publishes the whole small data frames at p[off..n) one after
 * another in one pass, the common shape of a feed (many short
 * unfragmented messages per receive): each header is decoded from two
 * (or four) bytes, and the event queue, the counters and the slot's
 * reference are updated once for the burst (tl_evq_run) instead of per
 * message. It stops at the first frame that is anything else - a control
 * frame, a fragment, a 64-bit length, RSV or mask bits, a frame not all
 * in the run, over max_message, invalid UTF-8 in a text frame - and at
 * the end of the room it computed up front (ring, arena, the connection's
 * share of the ring: conn_held), leaving that frame to the general parser
 * in tl_conn_feed, which handles (or fails) it exactly as before. The
 * caller checked that no frame or message is under way, no header is
 * split and no sample is pending. Returns the new offset. */
static inline __attribute__((always_inline)) size_t feed_burst(struct tl_loop *l, struct tl_conn *c,
								const uint8_t *p, size_t n, size_t off)
{
	struct tl_evq *q = &l->evq;
	struct tl_evq_run r;
	struct conn_room room;
	uint64_t maxmsg = l->cfg.max_message;
	int inplace = conn_inplace(l, c);

	/* conn_held's test, for the whole burst: the message that would pass
	 * the share goes through conn_held itself (a share with no byte left
	 * too: the burst is for payloads). */
	if (!conn_room(l, c, &room) || room.bytes == 0)
		return off;
	tl_evq_run_begin(q, &r, c->slot, c->gen, !inplace, room.events);
	if (r.wend > room.skip_w)
		r.wend = room.skip_w; /* copy mode: a skip ends where the arena would come under pressure */
	/* Two copies of the loop, each with its mode a constant: the in-place
	 * one (receive slots, the Decoder's buffer) carries no arena state. */
	off = inplace ? burst_frames(&r, p, n, off, maxmsg, room.bytes, 0)
		      : burst_frames(&r, p, n, off, maxmsg, room.bytes, 1);
	if (r.tail != q->tail) {
		/* Counted before tl_evq_run_end: an early publish there stores
		 * the pool's counters with the tail. */
		count_in_n(l, c, r.tail - q->tail, r.bytes);
		tl_evq_run_end(q, &r);
		if (inplace)
			conn_keep_slot(l, c);
	}
	return off;
}

/* tl_conn_feed consumes input bytes p[0..n); *used says how many. Returns
 * TL_FEED_OK (all used, or a partial frame was kept), TL_FEED_STALL (the rest
 * must be offered again when Go has released space) or TL_FEED_DEAD (the
 * connection failed or is closing: the rest does not matter). */
int tl_conn_feed(struct tl_loop *l, struct tl_conn *c, const uint8_t *p, size_t n, size_t *used)
{
	size_t off = 0;
	int r;

	*used = 0;
	if (c->discard) {
		*used = n;
		if (n)
			tl_conn_late_input(c); /* (only after the server's close frame) */
		return TL_FEED_OK;
	}
	if (c->state == TL_ST_UPGRADING) {
		r = tl_conn_upgrade_feed(l, c, p, n, &off);
		*used = off;
		if (r != TL_FEED_OK || c->state != TL_ST_OPEN)
			return r;
	}
	r = flush_pending(l, c);
	if (r != TL_FEED_OK) {
		*used = off;
		return r;
	}
	while (off < n) {
		if (!c->in_payload) {
			const uint8_t *hp;
			size_t avail;
			int hl;

			if (c->hdr_len == 0 && !c->msg_op && !c->smp_cqe) {
				off = feed_burst(l, c, p, n, off);
				if (off == n)
					break;
			}
			if (c->hdr_len == 0) {
				hp = p + off;
				avail = n - off;
			} else {
				/* Complete a split header in c->hdr. */
				size_t take = TL_WS_MAX_HDR - c->hdr_len;
				if (take > n - off)
					take = n - off;
				memcpy(c->hdr + c->hdr_len, p + off, take);
				hp = c->hdr;
				avail = c->hdr_len + take;
			}
			hl = parse_hdr(hp, avail, &c->h);
			if (hl == TL_WS_NEED_MORE) {
				if (c->hdr_len == 0 && c->rx_hold) {
					*used = off; /* the transport offers it again, whole */
					c->rx_held_ok = 0; /* a new frame: none of it checked */
					return TL_FEED_OK;
				}
				if (c->hdr_len == 0) {
					memcpy(c->hdr, p + off, n - off);
					c->hdr_len = (uint8_t)(n - off);
				} else {
					c->hdr_len = (uint8_t)avail;
				}
				off = n;
				break;
			}
			if (hl < 0) {
				*used = n;
				return hdr_error(l, c, hl);
			}
			if (begin_frame(l, c) < 0) {
				*used = n;
				return TL_FEED_DEAD;
			}
			if (c->hdr_len == 0) {
				/* Fast path: a whole unfragmented data frame in this run
				 * goes straight from the slot to the arena. */
				if (c->h.fin && (c->h.opcode == TL_OP_TEXT || c->h.opcode == TL_OP_BINARY) &&
				    n - off - (size_t)hl >= c->h.len) {
					const uint8_t *pl = p + off + hl;
					if (c->h.opcode == TL_OP_TEXT && !text_valid(pl, c->h.len)) {
						*used = n;
						return fail_proto(l, c, TL_E_UTF8, 1007, "invalid UTF-8 in a text message");
					}
					if (publish_frame(l, c, c->h.opcode, pl, c->h.len) < 0) {
						*used = off;
						return TL_FEED_STALL;
					}
					off += (size_t)hl + c->h.len;
					continue;
				}
				if (c->h.fin && (c->h.opcode == TL_OP_TEXT || c->h.opcode == TL_OP_BINARY) &&
				    (uint64_t)hl + c->h.len <= c->rx_hold) {
					/* Held (see rx_hold; begin_frame is idempotent). A
					 * text frame's bytes so far are validated now, not
					 * when it is whole: bad UTF-8 fails fast, as in the
					 * reassembly path. A frame held further into the run
					 * than its start is not the one re-offered (a re-offer
					 * starts with the held frame): none of it is checked
					 * yet, whatever an earlier hold in this run left in
					 * rx_held_ok (fuzz_conn's one-byte comparison found a
					 * held frame's bad bytes skipped that way; likewise a
					 * header cut short above). */
					if (off != 0)
						c->rx_held_ok = 0;
					if (c->h.opcode == TL_OP_TEXT && hold_text_bad(c, p + off + hl, n - off - (size_t)hl)) {
						*used = n;
						return fail_proto(l, c, TL_E_UTF8, 1007, "invalid UTF-8 in a text message");
					}
					*used = off;
					return TL_FEED_OK;
				}
				off += (size_t)hl;
			} else {
				off += (size_t)hl - c->hdr_len;
				c->hdr_len = 0;
			}
			c->in_payload = 1;
			c->remaining = c->h.len;
			if (c->h.opcode >= 0x8) {
				c->ctrl_len = 0;
			} else if (c->h.opcode != TL_OP_CONT) {
				c->msg_op = c->h.opcode;
				c->msg_len = 0;
				tl_utf8_reset(&c->utf8);
			}
		}
		/* payload bytes */
		{
			size_t k = n - off;
			if (k > c->remaining)
				k = (size_t)c->remaining;
			if (c->h.opcode >= 0x8) {
				memcpy(c->ctrl + c->ctrl_len, p + off, k);
				c->ctrl_len = (uint8_t)(c->ctrl_len + k);
			} else if (k) {
				if (grow_msg(c, c->msg_len + k) < 0) {
					*used = n;
					tl_conn_fail(l, c, TL_E_NOMEM, ENOMEM, 1011, "out of memory reassembling a message");
					return TL_FEED_DEAD;
				}
				memcpy(c->msg + c->msg_len, p + off, k);
				if (c->msg_op == TL_OP_TEXT && tl_utf8_feed(&c->utf8, p + off, k) < 0) {
					*used = n;
					return fail_proto(l, c, TL_E_UTF8, 1007, "invalid UTF-8 in a text message");
				}
				c->msg_len += k;
			}
			off += k;
			c->remaining -= k;
			if (c->remaining == 0) {
				c->in_payload = 0;
				r = frame_done(l, c);
				if (r != TL_FEED_OK) {
					*used = r == TL_FEED_STALL ? off : n;
					return r;
				}
			}
		}
	}
	*used = off;
	return TL_FEED_OK;
}
