/* loop.h - internal structures of the io_uring loop and its connections.
 * Only loop.c, conn.c and tls.c include this; Go sees talaris.h. */
#ifndef TALARIS_LOOP_H
#define TALARIS_LOOP_H

#include <liburing.h>
#include <pthread.h>
#include <stdint.h>

#include "slots.h"
#include "cmdq.h"
#include "evq.h"
#include "http.h"
#include "ring.h"
#include "talaris.h"
#include "utf8.h"
#include "ws.h"

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
};

/* tl_outbuf is a growable byte buffer of wire bytes waiting for the socket. */
struct tl_outbuf {
	uint8_t *p;
	size_t len, cap;
};

struct tl_tls; /* tls.c */

struct tl_conn {
	uint32_t slot, gen;
	int fd;
	uint8_t state;
	uint8_t is_tls;
	uint8_t rx;           /* TL_RX_*: the receive side, changed only by rx_step (loop.c) */
	uint8_t rx_hs;        /* the recv in the kernel uses the handshake group */
	uint8_t send_inflight;
	uint8_t cancel_inflight; /* async cancels in the kernel (pause, regroup, teardown) */
	uint8_t connect_inflight;
	uint8_t dying;        /* teardown started: no new ops */
	uint8_t eof;          /* the peer's FIN (or a socket error) arrived */
	uint8_t stalled;      /* input held back for lack of ring/arena/send space */
	uint8_t discard;      /* failed or closed: drop further input */
	uint8_t close_sent, close_rcvd;
	uint8_t final_pending; /* teardown done, final event not yet published */
	uint8_t open_pending;  /* open, EventOpen not yet published */
	int eof_errno;
	int send_errno;       /* a send failed (peer reset) while open: output is dropped, input drains */

	struct tl_rxq rxq;    /* received slots not yet consumed */
	int32_t cur_q;        /* slot the parser is reading now (payloads may stay in it), -1 if none */

	/* upgrade */
	struct tl_dial *dial;
	char key[TL_WS_KEY_LEN + 1];
	char *hs;             /* response head bytes so far (TL_HTTP_MAX_HEAD) */
	size_t hs_len;

	/* frame parser */
	uint8_t hdr[TL_WS_MAX_HDR];
	uint8_t hdr_len;      /* header bytes gathered while a header is split */
	uint8_t in_payload;   /* header done, payload bytes outstanding */
	tl_ws_hdr h;
	uint64_t remaining;   /* payload bytes of the current frame still to come */
	uint8_t msg_op;       /* opcode of the message being reassembled, 0 if none */
	uint8_t msg_ready;    /* msg holds a complete message not yet published */
	uint8_t *msg;
	size_t msg_len, msg_cap;
	tl_utf8 utf8;
	uint8_t ctrl[125];
	uint8_t ctrl_len;
	uint8_t ctrl_ready;   /* ctrl holds a complete control frame not yet handled */

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
};

struct tl_loop {
	struct tl_config cfg;
	struct io_uring ring;
	int ring_ok;
	struct tl_slots slots;  /* receive buffer groups and slot tables */

	struct tl_evq evq;      /* event ring producer and arena */

	struct tl_cmdq cmdq;    /* command ring consumer */
	int efd;
	uint64_t efd_val;
	int efd_armed;

	struct tl_conn *conns;
	struct tl_conn_pub *pub;
	struct tl_dial **dials; /* prepared by Go, taken by TL_CMD_DIAL */
	uint32_t live;          /* connections not idle */
	uint32_t timed;         /* connections with a deadline */
	uint64_t next_timer_ns;
	struct tl_conn *stalled;
	uint32_t rx_want;       /* connections in TL_RX_WANT */
	int stall_kick;         /* a send completed: stalled conns may go on */
	uint64_t last_sweep_ns; /* last look at parked connections without a wake-up */

	struct tl_pool_stats *stats;

	pthread_t thread;
	int started;
	int shutting_down;
	int stop_done;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int setup_state;        /* 0 pending, 1 ok, <0 -errno */
	char setup_msg[128];
	void *ssl_ctx_default;  /* tls.c: shared context for the system store */
	int stop_req;           /* set by tl_loop_stop (atomic) */
	uint8_t *scratch;       /* conn.c: TLS plaintext framing and mask staging */
	size_t scratch_cap;
	uint8_t rnd[4096];      /* CSPRNG bytes for mask keys, refilled by getrandom */
	uint32_t rnd_off;
};

/* loop.c */
/* tl_loop_new_detached allocates a loop's rings, arena and tables with no
 * thread and no io_uring: fuzzers and C benchmarks drive tl_conn_feed on
 * memory connections of it directly. Free with tl_loop_free. */
struct tl_loop *tl_loop_new_detached(const struct tl_config *cfg);
/* tl_loop_open_memory opens slot as a socketless connection (state open). */
void tl_loop_open_memory(struct tl_loop *l, uint32_t slot, uint32_t gen);
/* tl_loop_dial starts connection slot/gen from its prepared parameters. */
void tl_loop_dial(struct tl_loop *l, uint32_t slot, uint32_t gen);
/* cmdq.c: tl_cmdq_drain runs Go's commands; returns 1 if any ran. */
int tl_cmdq_drain(struct tl_loop *l);
uint64_t tl_loop_now_ns(void);
struct io_uring_sqe *tl_loop_sqe(struct tl_loop *l);
void tl_loop_set_state(struct tl_loop *l, struct tl_conn *c, int st);
void tl_loop_stall(struct tl_loop *l, struct tl_conn *c);
void tl_loop_flush(struct tl_loop *l, struct tl_conn *c);
void tl_loop_fail(struct tl_loop *l, struct tl_conn *c, int err, int aux, uint16_t code, const char *detail);
void tl_loop_teardown(struct tl_loop *l, struct tl_conn *c);
void tl_loop_regroup(struct tl_loop *l, struct tl_conn *c);
void tl_loop_set_deadline(struct tl_loop *l, struct tl_conn *c, uint64_t ns_from_now);
void tl_loop_detail(struct tl_loop *l, struct tl_conn *c, const char *msg);

/* tl_loop_emit appends one event for c: kind, payload p[0..n) copied into the
 * arena, and for control and final events code, err, aux and flags.
 * Returns 0, or -1 when the ring or arena is full (nothing was written).
 * Inline so the per-message path (constant kind, zero code) folds down to
 * tl_evq_append's fast path. */
static inline __attribute__((always_inline)) int tl_loop_emit(struct tl_loop *l, struct tl_conn *c, int kind,
							  const uint8_t *p, size_t n, uint16_t code, int err, int aux,
							  int flags)
{
	struct tl_evmeta m = {.slot = c->slot, .gen = c->gen, .code = code, .kind = (uint8_t)kind,
			      .flags = (uint8_t)flags, .err = err, .aux = aux};
	return tl_evq_append(&l->evq, m, p, n);
}

/* tl_loop_emit_inplace publishes a data message whose payload stays where it is,
 * in the slot c->cur_q (a whole frame inside one slot): no arena copy. The
 * slot is recycled only after Go has passed the event (tl_slots_release). */
static inline __attribute__((always_inline)) int tl_loop_emit_inplace(struct tl_loop *l, struct tl_conn *c, int kind,
								  const uint8_t *p, size_t n)
{
	struct tl_evmeta m = {.slot = c->slot, .gen = c->gen, .kind = (uint8_t)kind};
	if (tl_evq_append_ref(&l->evq, m, p, n) < 0)
		return -1;
	l->slots.ref[c->cur_q] = l->evq.tail;
	return 0;
}

/* conn.c */
int tl_conn_start_upgrade(struct tl_loop *l, struct tl_conn *c);
void tl_conn_drive(struct tl_loop *l, struct tl_conn *c);
int tl_conn_feed(struct tl_loop *l, struct tl_conn *c, const uint8_t *p, size_t n, size_t *used);
int tl_conn_send_frame(struct tl_loop *l, struct tl_conn *c, int opcode, int fin, const uint8_t *p, size_t n);
int tl_conn_send_close(struct tl_loop *l, struct tl_conn *c, uint16_t code, const uint8_t *reason, size_t rlen);
int tl_conn_out_append(struct tl_conn *c, const uint8_t *p, size_t n);
uint8_t *tl_conn_out_reserve(struct tl_conn *c, size_t n);
void tl_conn_reset(struct tl_conn *c);

/* tls.c */
int tl_tls_start(struct tl_loop *l, struct tl_conn *c);
int tl_tls_drive(struct tl_loop *l, struct tl_conn *c);
int tl_tls_write(struct tl_loop *l, struct tl_conn *c, const uint8_t *p, size_t n);
void tl_tls_free(struct tl_conn *c);
void tl_tls_global_free(struct tl_loop *l);

#endif
