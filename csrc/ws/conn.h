/* ws/conn.h - one WebSocket client connection: its state (struct tl_conn),
 * the outcomes ws/ reports (TL_FEED_* results, TL_DO_* requests), and
 * what ws/ exports: the upgrade exchange, the streaming frame parser,
 * the close handshake, failure, and outgoing framing into the
 * connection's buffers. ws/ is the WebSocket state machine: the
 * transports (transport/) feed it bytes, it appends events (base/evq.c),
 * publishes state (base/pub.c) and arms timers (base/timer.c), and it calls nothing
 * above it: what only the loop can do (io_uring operations) it leaves in
 * c->todo for its caller (tl_life_after). */
#ifndef TALARIS_CONN_H
#define TALARIS_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "codec/http.h"
#include "base/slots.h"
#include "codec/utf8.h"
#include "codec/ws.h"

struct tl_loop;
struct tl_tls;
struct tl_tls_dial;

/* Results of tl_conn_feed (and of the transports that feed it). The
 * numeric values are tl_decoder_feed's documented returns. */
enum {
	TL_FEED_OK = 0,     /* all input used (a partial frame is kept) */
	TL_FEED_STALL = -1, /* ring or arena full: offer the rest again later */
	TL_FEED_DEAD = -2,  /* the connection failed or is closing: drop the rest */
};

/* Requests ws/ (and the transports) leave in tl_conn.todo for the loop,
 * which acts on them in tl_life_after once the call returns, in this
 * order: TL_DO_TEARDOWN alone (the others are moot), else the rest. */
enum {
	TL_DO_TEARDOWN = 1 << 0, /* end c: cancel its operations, then the final event */
	TL_DO_REGROUP = 1 << 1,  /* the upgrade completed: move the recv to the main group */
	TL_DO_SHUT_WR = 1 << 2,  /* close handshake complete: end the sending side (tl_tx_shut_wr) */
	TL_DO_FLUSH = 1 << 3,    /* output is waiting: submit it */
};

/* Connection states: mirror talaris.State. */
enum {
	TL_ST_IDLE = 0,
	TL_ST_CONNECTING = 1,
	TL_ST_TLS = 2,
	TL_ST_UPGRADING = 3,
	TL_ST_OPEN = 4,
	TL_ST_CLOSING = 5,
	TL_ST_CLOSED = 6,
};

/* tl_dial is the loop's copy of tl_dial_params. */
struct tl_dial {
	struct sockaddr_storage addr;
	uint32_t addr_len;
	int tls;
	char *host, *path, *headers, *protocols, *server_name, *ca_file, *ca_pem;
	size_t host_len, path_len, headers_len, protocols_len, server_name_len, ca_file_len, ca_pem_len;
	int insecure;
	uint64_t handshake_timeout_ns;
	uint64_t close_timeout_ns;    /* DialOptions.CloseTimeout, else the loop's */
	struct tl_tls_dial *tlsx; /* TLS policy (tls_verify.c), NULL for ws:// */
	struct sockaddr_storage *alt; /* further addresses, tried in order when a connect fails */
	uint32_t nalt, next_alt;      /* next_alt: the next one to try */
	struct sockaddr_storage local; /* bound before connect when local_len != 0 */
	uint32_t local_len;
	uint64_t ping_interval_ns, read_timeout_ns; /* heartbeat; 0: off */
	/* reconnect policy and subscribe messages (see tl_dial_params) */
	int rc_enabled;
	uint32_t rc_max_attempts;
	uint64_t rc_min_ns, rc_max_ns;
	char *subscribe;
	size_t subscribe_len;
	/* proxy (transport/proxy.c): addr and alt are the proxy's addresses */
	int proxy;                    /* TL_PROXY_KIND_*: none, HTTP CONNECT, SOCKS5 */
	char *proxy_req, *proxy_auth; /* CONNECT request, or SOCKS5 CONNECT request and RFC 1929 message */
	size_t proxy_req_len, proxy_auth_len;
};

/* tl_dupn returns a malloced copy of s[0..n) plus a NUL (NULL on no
 * memory): the dial copies' strings. */
static inline char *tl_dupn(const void *s, size_t n)
{
	char *d = malloc(n + 1);
	if (!d)
		return NULL;
	if (n)
		memcpy(d, s, n);
	d[n] = 0;
	return d;
}

/* tl_outbuf is a growable byte buffer of wire bytes waiting for the socket. */
struct tl_outbuf {
	uint8_t *p;
	size_t len, cap;
	uint64_t units;  /* send units (ring.h) of Go's frames in it: retired when it is written */
	size_t replies;  /* bytes of the loop's own replies (pongs, close echo) in it */
};

/* tl_outbuf_reset empties ob once its bytes are gone (written to the
 * socket, or sealed into TLS records) and its units and replies have been
 * accounted elsewhere: len, units and replies become 0. A buffer grown past
 * 1 MiB by a burst gives its memory back (the next reserve grows it again),
 * so one burst does not pin that memory for the connection's life. */
static inline void tl_outbuf_reset(struct tl_outbuf *ob)
{
	ob->len = 0;
	ob->units = 0;
	ob->replies = 0;
	if (ob->cap > (1u << 20)) {
		free(ob->p);
		ob->p = NULL;
		ob->cap = 0;
	}
}

/* tl_sendq is a connection's queue of framed (masked, not yet encrypted)
 * data frames that wait for room in the out buffers: records of a struct
 * tl_sqrec and its frame bytes, 8-byte aligned, consumed from head. Frames
 * go in whole and leave whole, so control frames and a close can always
 * be placed between two of them. Its size is bounded by Go's admission
 * control (Config.MaxSendQueue, plus one larger message on an empty
 * queue). */
struct tl_sendq {
	uint8_t *p;
	size_t head, len, cap; /* records occupy p[head..len) */
};

struct tl_sqrec {
	uint64_t units; /* send units the frame carries (ring.h: bytes, plus TL_UNIT_MSG on a message's last frame) */
	uint32_t len;   /* frame bytes that follow */
	uint8_t fin;    /* the frame ends its message */
	uint8_t close;  /* our close frame, queued behind the data accepted before Close */
	uint8_t pad[2];
};
_Static_assert(sizeof(struct tl_sqrec) == 16, "send queue records stay 8-byte aligned");

/* TL_CLOSE_GRACE_NS is how long a connection whose close frames have
 * crossed (ours written, the server's read, our sending side shut) waits
 * for the server's FIN before it ends anyway, cleanly: a server whose
 * writer keeps going after its close frame never sends one. The first
 * bytes it sends after its close frame end the wait at once. */
#define TL_CLOSE_GRACE_NS 100000000ull

/* TL_TX_CHUNK bounds how far the collecting out buffer is filled from the
 * send queue: a control frame (and a close that cuts the queue) waits
 * behind at most this much (plus one frame) of data already framed for
 * the wire. A close we start waits behind the whole queue instead. */
#define TL_TX_CHUNK (256u << 10)

/* Where a connection under a reconnect policy stands between two
 * attempts (tl_conn.rc; its transitions are tl_life_rc_set's). */
enum tl_rc {
	TL_RC_NONE = 0,     /* in an attempt, or no reconnect under way */
	TL_RC_ANNOUNCE = 1, /* the attempt ended; its EventReconnecting waits for ring room (stall list) */
	TL_RC_BACKOFF = 2,  /* announced; no socket; the deadline starts the next attempt */
};

/* How far a connection's end has gone (tl_conn.dying; its transitions
 * are tl_life_dying_set's). Alive is 0, so a plain test of c->dying
 * says whether teardown started. */
enum tl_dying {
	TL_DYING_NO = 0,       /* alive: no teardown started (a close handshake may run) */
	TL_DYING_TEARDOWN = 1, /* teardown started, no new ops: the socket closes once every op completed */
	TL_DYING_FINAL = 2,    /* socket closed, every op completed; the final event waits for ring room (stall list) */
};

/* Where the end of a connection's sending side stands (tl_conn.shut_wr;
 * its transitions are tl_conn_shut_set's). */
enum tl_shut {
	TL_SHUT_NONE = 0, /* the sending side is open */
	TL_SHUT_WANT = 1, /* close handshake complete: shutdown(SHUT_WR) once the out buffers drain (tl_tx_flush) */
	TL_SHUT_DONE = 2, /* shutdown(SHUT_WR) done: nothing more is written */
};

/* What a stall left unpublished, to go out before the parser reads on
 * (tl_conn.pending; its transitions are tl_conn_pend_set's). One thing at
 * most: parsing stops at the first publish that finds no room, and
 * resumes only once that is out (tl_conn_feed, tl_conn_flush_pending). */
enum tl_pend {
	TL_PEND_NONE = 0, /* nothing waits */
	TL_PEND_OPEN = 1, /* open, EventOpen not yet published */
	TL_PEND_MSG = 2,  /* msg holds a complete message not yet published */
	TL_PEND_CTRL = 3, /* ctrl holds a complete control frame not yet handled (its event, then any reply) */
};

/* Where a connection's close handshake stands (tl_conn.close_hs; its
 * transitions are tl_conn_close_step's). The values are bits, BOTH being
 * SENT | RCVD, so tl_conn_close_sent and tl_conn_close_rcvd test one. */
enum tl_close {
	TL_CLOSE_NONE = 0, /* no close frame either way */
	TL_CLOSE_SENT = 1, /* our close frame is queued (or out); the peer's has not come */
	TL_CLOSE_RCVD = 2, /* the peer's came and ours is not queued: only a memory connection Go closed stays here */
	TL_CLOSE_BOTH = 3, /* both: the handshake is complete once ours is out */
};

/* What the receive probe (loop/probe.c, which names the kernel behaviour it
 * defends against) knows of a connection's recv: its signs of life, what
 * the last probes found, and what a cancel of it found. The receive side
 * (loop/rx.c) and the completion dispatch keep ticks and the cancel fields. */
struct tl_conn_probe {
	uint32_t ticks;        /* recv arms and completions: the probe's sign of life */
	uint32_t mark;         /* ticks at the last probe */
	uint32_t cancel_ticks; /* ticks when the last cancel of a recv was sent */
	uint8_t suspect;       /* the last probe found the socket ready and this recv silent */
	uint8_t revived;       /* the probe cancelled this recv: a cancel that finds nothing ends it here (rx.c) */
	uint8_t cancel_hit;    /* a cancel found this recv (res 0): its END is due */
	uint8_t stuck;         /* probes in a row that found that END not come */
	uint8_t debug_lose_end; /* TL_DEBUG tests: swallow the recv's next -ECANCELED end, as a kernel that lost it */
};

struct tl_conn {
	uint32_t slot, gen;
	int fd;
	uint8_t state;
	uint8_t is_tls;
	uint8_t rx;           /* TL_RX_*: the receive side, changed only by tl_rx_step (rx.c) */
	uint8_t rx_hs;        /* the recv in the kernel uses the handshake group */
	uint8_t rx_cap;       /* the recv in the kernel carries the bundle cap (sqe->len): its -EINVAL is the kernel refusing the cap */
	uint8_t rx_epoch;     /* recv epoch (0..TL_OPK_EPOCHS-1), in its user_data's op byte (uring.h); kept across reconnects */
	struct tl_conn_probe probe; /* the receive probe's view of this recv (loop/probe.c) */
	uint8_t send_inflight;
	uint8_t cancel_inflight; /* async cancels in the kernel (pause, regroup, teardown) */
	uint8_t connect_inflight;
	uint8_t dying;        /* TL_DYING_*: the teardown, non-zero once started; changed only by tl_life_dying_set (life.c) */
	uint8_t eof;          /* the peer's FIN (or a socket error) arrived */
	uint8_t stalled;      /* input held back for lack of ring/arena/send space */
	uint8_t discard;      /* failed or closed: drop further input */
	uint8_t close_hs;     /* TL_CLOSE_*: the close handshake; changed only by tl_conn_close_step (send.c) */
	uint8_t shut_wr;      /* TL_SHUT_*: the sending side's end; changed only by tl_conn_shut_set (send.c) */
	uint8_t pending;      /* TL_PEND_*: what a stall left unpublished; changed only by tl_conn_pend_set (conn.c) */
	int eof_errno;
	int send_errno;       /* a send failed (peer reset) while open: output is dropped, input drains */

	struct tl_rxq rxq;    /* received slots not yet consumed */
	int32_t cur_q;        /* slot the parser is reading now (payloads may stay in it), -1 if none,
			       * TL_CUR_CALLER for a caller's buffer (tl_decoder_feed) */

	/* upgrade */
	struct tl_dial *dial;
	char key[TL_WS_KEY_LEN + 1];
	char *hs;             /* response head bytes so far (TL_HTTP_MAX_HEAD) */
	size_t hs_len;
	/* A refused upgrade waiting for its body's first bytes (ws/upgrade.c,
	 * refusal_wait): the head is in hs, the failure is reported once the
	 * body is in, at EOF or at the deadline (TL_REFUSAL_BODY_WAIT_NS). */
	uint8_t refusing;
	uint8_t refuse_chunked;
	/* TL_PX_*: the proxy handshake's step (transport/proxy.c, which
	 * gathers each reply in hs); 0: no proxy, or the tunnel stands. The
	 * state stays TL_ST_CONNECTING meanwhile, on a connected socket. */
	uint8_t px;
	uint16_t refuse_status;
	size_t refuse_head_len;
	int64_t refuse_length; /* Content-Length, -1 if none */

	/* frame parser */
	uint8_t hdr[TL_WS_MAX_HDR];
	uint8_t hdr_len;      /* header bytes gathered while a header is split */
	uint8_t in_payload;   /* header done, payload bytes outstanding */
	tl_ws_hdr h;
	uint64_t remaining;   /* payload bytes of the current frame still to come */
	uint8_t msg_op;       /* opcode of the message being reassembled, 0 if none */
	uint8_t *msg;
	size_t msg_len, msg_cap;
	tl_utf8 utf8;
	uint8_t ctrl[125];
	uint8_t ctrl_len;

	/* close */
	uint16_t close_code;  /* the peer's code (1005 if none) */
	uint8_t reason_len;
	uint8_t reason[123];
	int fail_err, fail_aux;
	uint16_t fail_code;
	uint64_t deadline_ns; /* 0: none */

	/* tx: out[cur] collects; out[cur^1] may be in the kernel */
	struct tl_outbuf out[2];
	int cur;
	size_t sent_off;      /* bytes of the in-flight buffer already sent */

	struct tl_tls *tls;

	uint64_t msgs_in, bytes_in; /* mirrored to tl_conn_pub with relaxed stores */

	struct tl_conn *stall_next; /* on loop->stalled while stalled */
	uint8_t on_stall_list;

	/* Sampling (Config.SampleEvery): a sampled completion's stamps wait
	 * here for the next data message this connection publishes. */
	uint64_t smp_cqe;     /* CLOCK_MONOTONIC ns the completion was seen; 0: none pending */
	uint64_t smp_pt;      /* ns its bytes reached the parser (after TLS); 0: not yet */
	/* the response head (and first body bytes) of a refused upgrade, kept
	 * for Go (tl_loop_fail_head) until the slot's next dial */
	char *fail_head;
	size_t fail_head_len;
	/* heartbeat (timer.c arms, tick.c fires): read timeout and pings, checked by the timer
	 * scan, never per message */
	uint64_t hb_ns;       /* next heartbeat check (0: no heartbeat) */
	uint64_t last_rx_ns;  /* loop's cached clock at the last recv completion */
	uint64_t last_ping_ns; /* when the loop last sent a heartbeat ping */

	/* send queue (frames waiting for out-buffer room) and accounting */
	struct tl_sendq sq;
	uint64_t tx_done;     /* send units retired; mirrored to tl_conn_pub.tx_done */
	uint8_t tx_msg_open;  /* a data message has frames in the out buffers but not its last */
	uint8_t close_queued; /* our close frame waits in the send queue behind data accepted before it */
	uint8_t late_rx;      /* bytes came after the server's close frame (the close grace ends at once) */
	/* reconnect (life.c): these survive the reset between attempts */
	uint8_t was_open;      /* this attempt reached TL_ST_OPEN */
	uint8_t rc_stop;       /* Close (or Abort) asked: no more attempts */
	uint8_t rc;            /* TL_RC_*: between attempts; changed only by tl_life_rc_set (life.c) */
	uint32_t rc_attempts;  /* attempts since the last open (the first dial counts) */
	uint64_t opens;        /* successful opens of this handle */
	int64_t retry_after;   /* seconds from a refused upgrade's Retry-After, -1 if none */
	uint64_t rc_delay_ns;  /* the wait EventReconnecting announced */
	/* layering: ws/'s requests to the loop, and wss output that waits
	 * for the TLS transport */
	uint8_t todo;          /* TL_DO_*: acted on (and cleared) by tl_life_after */
	struct tl_outbuf tx_pt; /* wss: framed plaintext, encrypted into out[cur] by tl_tls_seal */
	/* receive fairness (conn_held in ws/frames.c): stalled because it had its
	 * share of the event ring pending, not because the ring was full */
	uint8_t fair_held;
	/* the loop's fair_epoch when c was last found at its share (0:
	 * never): c is heavy in that epoch and the next, else light */
	uint32_t fair_heavy;
	uint8_t fair_light;   /* counted in the loop's fair_light at its last recount */
	/* heavy, nobody to protect: no share check while the ring's tail is
	 * below fair_skip and the arena's write position below fair_skip_w
	 * (where the ring would come under pressure, conn_held_slow), or
	 * until tl_loop_fair_tick recounts the light connections (it clears both) */
	uint64_t fair_skip, fair_skip_w;
	/* Set by a transport that can keep its run contiguous (TLS
	 * plaintext slots) for one tl_conn_feed: a whole data frame of at most
	 * this many bytes (header included) that is not all in the run yet is
	 * left unconsumed, with its header, to be offered again with more
	 * bytes after it, so it is delivered in place rather than reassembled.
	 * 0: off. */
	size_t rx_hold;
	size_t rx_held_ok;  /* payload bytes of the held text frame already validated */
	/* direct sends (tx.c, tl_conn_pub.tx_own): output or the socket's
	 * close waits for a Go sender to hand the socket back */
	uint8_t tx_defer;
};

/* tl_conn_ending says c is ending: teardown started, or requested
 * (TL_DO_TEARDOWN) and not yet acted on. Input and output stop here. */
static inline int tl_conn_ending(const struct tl_conn *c) { return c->dying || (c->todo & TL_DO_TEARDOWN); }

/* tl_conn_unconnected says c has no connected socket yet: its connect is
 * in flight (or a reconnect waits out its backoff). Nothing is read or
 * written then; a proxy handshake (c->px) runs in TL_ST_CONNECTING on a
 * connected socket. */
static inline int tl_conn_unconnected(const struct tl_conn *c) { return c->state == TL_ST_CONNECTING && !c->px; }

/* tl_conn_close_step records ev, TL_CLOSE_SENT (our close frame is
 * queued) or TL_CLOSE_RCVD (the peer's close frame came, or Go closed a
 * memory connection), in c's close handshake (c->close_hs), the one place
 * it changes. The transitions: NONE -> SENT or RCVD, SENT or RCVD -> BOTH
 * (the other one), and a repeat changes nothing; nothing goes back but
 * tl_conn_reset. */
void tl_conn_close_step(struct tl_conn *c, enum tl_close ev);

/* tl_conn_pend_set moves c's unpublished leftover (c->pending) to to, the
 * one place it changes. The transitions: NONE -> OPEN (no room for
 * EventOpen; a retry that finds none stays), NONE -> MSG (no room for a
 * complete message), NONE -> CTRL (a complete control frame, held until
 * handled), OPEN, MSG or CTRL -> NONE (published or handled; or dropped:
 * a failure drops MSG and CTRL, an abort everything, the end's trim MSG).
 * TL_DEBUG builds abort when a leftover would replace another. */
void tl_conn_pend_set(struct tl_conn *c, uint8_t to);

/* tl_conn_shut_set moves c's sending side's end (c->shut_wr) to to, the
 * one place it changes; the caller does the shutdown(SHUT_WR) DONE
 * records. The transitions: NONE -> WANT (the close handshake is
 * complete: tl_tx_shut_wr), WANT -> DONE (every queued byte left:
 * tl_tx_flush), NONE -> DONE (the peer's close_notify is answered at
 * once, with no send in flight: transport/tls_read.c); nothing goes back
 * but tl_conn_reset (TL_DEBUG builds abort on any other). */
void tl_conn_shut_set(struct tl_conn *c, uint8_t to);

/* tl_conn_close_sent says c's close frame is queued (or out): no data,
 * ping or pong may follow it. */
static inline int tl_conn_close_sent(const struct tl_conn *c) { return (c->close_hs & TL_CLOSE_SENT) != 0; }

/* tl_conn_close_rcvd says the peer's close frame came (or Go closed c, a
 * memory connection): the end is a clean EventClose. */
static inline int tl_conn_close_rcvd(const struct tl_conn *c) { return (c->close_hs & TL_CLOSE_RCVD) != 0; }

/* tl_conn_watch_notify says c's input, though discarded (the peer's close
 * frame came), must still reach the TLS layer: the server's close_notify
 * may come in a later segment than its close frame, and on a server that
 * then waits for us rather than closing TCP it is the only end of the
 * stream we will see (without it, the close timeout). The plaintext is
 * still dropped (tl_conn_feed). */
static inline int tl_conn_watch_notify(const struct tl_conn *c)
{
	return c->is_tls && tl_conn_close_rcvd(c) && !c->eof && !tl_conn_ending(c);
}

/* tl_conn_wbuf is the buffer c's frames are written to: the collecting
 * out buffer (wire bytes) for ws://, the plaintext buffer tl_tls_seal
 * encrypts from for wss://. */
static inline struct tl_outbuf *tl_conn_wbuf(struct tl_conn *c) { return c->is_tls ? &c->tx_pt : &c->out[c->cur]; }

/* tl_conn_collecting is how many bytes c has collected for its next send
 * (framed plaintext still to encrypt included). */
static inline size_t tl_conn_collecting(const struct tl_conn *c) { return c->out[c->cur].len + c->tx_pt.len; }

/* tl_conn_send_subscribe queues c's subscribe messages (text frames, in
 * order) after the upgrade completed, before any user command can run.
 * Returns 0, or -1 after failing c. */
int tl_conn_send_subscribe(struct tl_loop *l, struct tl_conn *c);

/* tl_conn_shared is ws/'s state shared by every connection of a loop
 * (the loop thread is its only user). */
struct tl_conn_shared {
	uint8_t rnd[4096];      /* CSPRNG bytes for mask keys, refilled by getrandom */
	uint32_t rnd_off;
};

/* tl_conn_reset clears c for a new dial on its slot, keeping the message
 * and out buffers' allocations for reuse (tl_conn_free_bufs frees them);
 * the previous connection's fail_head is freed. */
void tl_conn_reset(struct tl_conn *c);

/* tl_conn_reset_keep is tl_conn_reset between two attempts of one
 * reconnecting handle: generation, dial parameters, counters and the
 * reconnect bookkeeping survive. */
void tl_conn_reset_keep(struct tl_conn *c);

/* TL_MSG_KEEP is the largest reassembly buffer a slot keeps once its
 * connection ended: a peer's one big fragmented message must not pin that
 * much memory per slot for the Pool's life. A live connection keeps its
 * buffer (at most MaxMessageSize): freeing it after each big message
 * would allocate per message. */
#define TL_MSG_KEEP (1u << 20)

/* tl_conn_trim drops the message c's end cut, if any, and gives back its
 * reassembly buffer when it is larger than TL_MSG_KEEP (a payload is
 * copied into the arena at publish, so no event points into it). Called
 * once c ended (tl_life_maybe_finish), before its final event or
 * reconnect. */
void tl_conn_trim(struct tl_conn *c);

/* tl_conn_free_bufs frees the allocations tl_conn_reset keeps (message,
 * out, plaintext and send queue buffers, fail_head): the loop is going. */
void tl_conn_free_bufs(struct tl_conn *c);

/* tl_conn_fail records why c failed (the first cause wins; detail is
 * copied to its public detail) and starts its end: when c is open (and
 * code is not 0 or 1006, and the peer can still read) a close frame with
 * code, state CLOSING, TL_DO_FLUSH and a short deadline for the peer's
 * answer; otherwise TL_DO_TEARDOWN. Input is discarded from here. */
void tl_conn_fail(struct tl_loop *l, struct tl_conn *c, int err, int aux, uint16_t code, const char *detail);

/* TL_REFUSAL_BODY_MAX is how much of a refused upgrade's body is waited
 * for (HandshakeError.Body keeps as much), TL_REFUSAL_BODY_WAIT_NS how long
 * at most after the head: a refusal reaches Go at once when its body came
 * with the head, else when the body is in, at EOF or after this wait. */
#define TL_REFUSAL_BODY_MAX 1024
#define TL_REFUSAL_BODY_WAIT_NS 200000000ull

/* tl_conn_refusal_end reports the refused upgrade c waits on the body of
 * (c->refusing): EventError with the response's status and the head and
 * body bytes that came (tl_loop_fail_head). */
void tl_conn_refusal_end(struct tl_loop *l, struct tl_conn *c);

/* tl_conn_on_eof decides what the transport's end of input (c->eof, all
 * queued input parsed) means: a clean end after a close handshake or an
 * earlier failure (TL_DO_TEARDOWN), else a failure (lost connection). */
void tl_conn_on_eof(struct tl_loop *l, struct tl_conn *c);

/* tl_conn_start_upgrade writes the HTTP upgrade request (to
 * tl_conn_wbuf: TLS encrypts it when c is wss) and prepares to read the
 * response. Returns 0, or -1 after failing c. */
int tl_conn_start_upgrade(struct tl_loop *l, struct tl_conn *c);

/* TL_CUR_CALLER as c->cur_q says the run is the caller's own buffer and
 * stays valid until the consumer has passed every event appended during
 * the feed (the decoder, testhook.Decoder: Go consumes them all before
 * Decode returns). Whole data frames are then delivered in place,
 * pointing into it, as from a receive slot but with no slot reference to
 * keep. */
#define TL_CUR_CALLER (-2)

/* tl_conn_feed parses server bytes p[0..n) (upgrade response, then frames)
 * and publishes events; *used says how many bytes it took. Returns a
 * TL_FEED_* code; TL_FEED_OK means every byte was used, except that with
 * c->rx_hold set a partial frame may be left at the end (see rx_hold). p
 * is not retained unless an event points into the slot c->cur_q (or into
 * p itself when c->cur_q is TL_CUR_CALLER). */
int tl_conn_feed(struct tl_loop *l, struct tl_conn *c, const uint8_t *p, size_t n, size_t *used);

/* tl_conn_flush_pending retries what c's last feed could not publish (the
 * open event, a whole message, a control frame) without new input. Returns
 * a TL_FEED_* code. */
int tl_conn_flush_pending(struct tl_loop *l, struct tl_conn *c);

/* tl_conn_fair_still_held says whether c, held at its share of the event
 * ring (fair_held), must stay held: while it still has more than half of
 * its share pending (so each resume parses a good batch rather than a few
 * events per head movement) and another connection is light or the ring
 * under pressure (as when it was held). The caller refreshed Go's head.
 * Never while shutting down or once c is the only connection left with a
 * socket (counting is off then). Returns 1 (stay) or 0 (resume). */
int tl_conn_fair_still_held(const struct tl_loop *l, const struct tl_conn *c);

/* tl_conn_feed_stash offers a memory connection's stashed input (what
 * tl_conn_inject could not feed yet) to the parser; consumed (or dropped)
 * bytes retire their units. Returns TL_FEED_OK or TL_FEED_STALL. */
int tl_conn_feed_stash(struct tl_loop *l, struct tl_conn *c);

/* tl_conn_send_frame frames, masks and queues one frame in tl_conn_wbuf
 * (a wss frame is encrypted when the loop flushes). Returns 0, or -1
 * after failing c (no memory). */
int tl_conn_send_frame(struct tl_loop *l, struct tl_conn *c, int opcode, int fin, const uint8_t *p, size_t n);

/* tl_conn_send_data queues one data frame from Go (opcode TL_OP_TEXT,
 * TL_OP_BINARY or TL_OP_CONT) carrying units send units: straight into
 * the collecting out buffer when c is open, the send queue is empty and
 * that buffer holds less than TL_TX_CHUNK, else at the send queue's tail
 * (before the upgrade completes: it goes out once c is open). The units
 * are retired once the frame is written (at once on a memory connection).
 * Returns 0, or -1 after failing c. */
int tl_conn_send_data(struct tl_loop *l, struct tl_conn *c, int opcode, int fin, const uint8_t *p, size_t n,
		      uint64_t units);

/* tl_conn_tx_refill moves whole frames from the send queue into
 * tl_conn_wbuf while c collects less than TL_TX_CHUNK (nothing before c
 * is open). Returns 0, or -1 after failing c (no memory). */
int tl_conn_tx_refill(struct tl_loop *l, struct tl_conn *c);

/* tl_conn_tx_cut prepares c's output for a close frame: the frames of a
 * message already started on the wire are moved to the out buffer (so
 * the message is finished and fragments never interleave), every other
 * queued frame is dropped and its units retired. */
void tl_conn_tx_cut(struct tl_loop *l, struct tl_conn *c);

/* tl_conn_tx_drop_all drops every byte c still has to send (both out
 * buffers unless a send is in flight, the plaintext buffer and the send
 * queue), retiring their units: the socket refused a send, nobody will
 * read them. */
void tl_conn_tx_drop_all(struct tl_loop *l, struct tl_conn *c);

/* tl_conn_inject feeds p[0..n) to memory connection c as if its server
 * had sent it. What the parser cannot take yet (event ring or arena full)
 * is kept, in order, in c's send queue (a memory connection never sends);
 * tl_conn_feed_stash feeds it when room returns. Parsed (or dropped)
 * bytes retire their units, like sent frames. Returns TL_FEED_OK,
 * TL_FEED_STALL (the caller stalls c) or TL_FEED_DEAD (c failed: no
 * memory). */
int tl_conn_inject(struct tl_loop *l, struct tl_conn *c, const uint8_t *p, size_t n);

/* tl_conn_replies reports the bytes of the loop's own replies waiting in
 * c's buffers (the receive side stops reading past max_send_queue). */
static inline size_t tl_conn_replies(const struct tl_conn *c)
{
	return c->out[0].replies + c->out[1].replies + c->tx_pt.replies;
}

/* tl_conn_send_close queues c's close frame once (later calls do
 * nothing): code and up to 123 reason bytes; code 0 or 1005 sends an empty
 * close. Returns as tl_conn_send_frame. */
int tl_conn_send_close(struct tl_loop *l, struct tl_conn *c, uint16_t code, const uint8_t *reason, size_t rlen);

/* tl_conn_close_after_queue is a close we start (Conn.Close, Pool.Close):
 * the close frame goes after every data frame accepted before it, at the
 * send queue's tail when frames wait there (c->close_queued), else
 * straight into the collecting buffer. Returns as tl_conn_send_frame. */
int tl_conn_close_after_queue(struct tl_loop *l, struct tl_conn *c, uint16_t code, const uint8_t *reason,
			      size_t rlen);

/* tl_conn_late_input notes bytes from the server after its close frame:
 * once our sending side is shut, c ends (TL_DO_TEARDOWN, a clean end),
 * else it ends as soon as it is (loop/tx.c). */
void tl_conn_late_input(struct tl_conn *c);

/* tl_conn_close_timeout is c's close timeout: its dial's, else the loop's. */
uint64_t tl_conn_close_timeout(const struct tl_loop *l, const struct tl_conn *c);

/* tl_outbuf_reserve grows ob by n bytes and returns where they go, or
 * NULL on no memory. */
uint8_t *tl_outbuf_reserve(struct tl_outbuf *ob, size_t n);

/* tl_conn_out_append copies wire bytes p[0..n) to c's collecting out
 * buffer (the TLS BIO's ciphertext). Returns 0 or -1 on no memory. */
int tl_conn_out_append(struct tl_conn *c, const uint8_t *p, size_t n);

#endif
