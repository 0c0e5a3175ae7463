/* ring.h - the two single-producer/single-consumer rings shared with Go.
 *
 * Event ring (C loop -> Go pump): fixed 32-byte events; payloads live in a
 * byte arena allocated in event order, so releasing events in order releases
 * their payload memory. The loop publishes the tail once per batch; Go
 * publishes the head once per batch, which releases every payload of the
 * batch at once.
 *
 * Command ring (Go senders -> C loop): variable-length 16-byte-aligned
 * records, payload inline. Go serialises its producers with a mutex, so the
 * ring itself stays SPSC.
 *
 * Head and tail sit on their own 64-byte lines; each side caches the other's
 * index and reloads it only when the cached value says "full" or "empty".
 * Wake-ups happen only when the other side announced it sleeps (flag then
 * recheck on both sides, seq_cst, Dekker style). Go reads and writes these
 * fields with sync/atomic, so layout changes must be mirrored on the Go
 * side of the cgo binding (talaris_linux.go). */
#ifndef TALARIS_RING_H
#define TALARIS_RING_H

#include <stdint.h>

#define TL_LINE 64

/* Event kinds: mirror talaris.EventKind. */
enum {
	TL_EV_OPEN = 1,
	TL_EV_TEXT = 2,
	TL_EV_BINARY = 3,
	TL_EV_PING = 4,
	TL_EV_PONG = 5,
	TL_EV_CLOSE = 6,
	TL_EV_ERROR = 7,
	/* Not final: a connection with a reconnect policy dropped; the loop
	 * re-dials the same slot and generation after a delay. code, err and
	 * aux say why (err 0: the server closed with code); the payload is
	 * the delay in nanoseconds (uint64), the number of the attempt that
	 * follows counted since the last open (uint32), 4 zero bytes (host
	 * order), then the error detail or the close reason. */
	TL_EV_RECONNECTING = 8,
};

/* Error causes carried in tl_event.err and tl_conn_pub.err; errors.go
 * mirrors them by number (cErr*, checked against these values at compile
 * time in talaris_linux.go; TL_E_PROXY in proxy_linux.go) and maps them to the exported error sentinels.
 * aux refines some of them. */
enum {
	TL_E_NONE = 0,
	TL_E_DIAL = 1,          /* aux = errno of connect/socket */
	TL_E_TIMEOUT = 2,       /* handshake timeout */
	TL_E_HTTP = 3,          /* aux = TL_HTTP_ERR_* (negative), code = HTTP status */
	TL_E_PROTOCOL = 4,      /* close 1002 sent */
	TL_E_UTF8 = 5,          /* close 1007 sent */
	TL_E_TOO_BIG = 6,       /* close 1009 sent */
	TL_E_LOST = 7,          /* 1006: EOF or socket error without close frame; aux = errno or 0 */
	TL_E_CLOSE_TIMEOUT = 8, /* close handshake did not finish in time */
	TL_E_TLS = 9,           /* aux = TL_TLS_* cause */
	TL_E_ABORTED = 10,      /* ended by Conn.Abort, or closed by the user before open */
	TL_E_SHUTDOWN = 11,     /* the pool closed */
	TL_E_READ_TIMEOUT = 12, /* nothing received for the dial's read timeout (1006, no handshake) */
	TL_E_PROXY = 13,        /* the proxy handshake failed: aux = TL_PROXY_* | errno << 8, code = HTTP status or SOCKS code */
	/* Causes Go does not tell apart (all errInternal): kept out of the way
	 * of the numbered public causes above, which other changes extend. */
	TL_E_NOMEM = 64,        /* allocation failed in the loop */
	TL_E_INTERNAL = 65,
};

/* Proxy causes in aux's low byte for TL_E_PROXY (the errno of a lost
 * connection above it); proxy_linux.go mirrors them. */
enum {
	TL_PROXY_STATUS = 1,    /* CONNECT answered with a status other than 2xx (code) */
	TL_PROXY_REPLY = 2,     /* SOCKS5 CONNECT reply other than succeeded (code = REP) */
	TL_PROXY_AUTH = 3,      /* SOCKS5 authentication refused (code = RFC 1929 status, or 255: no method acceptable) */
	TL_PROXY_MALFORMED = 4, /* the reply is not the protocol's */
	TL_PROXY_TOO_LARGE = 5, /* the CONNECT reply head is over TL_PROXY_MAX_HEAD */
	TL_PROXY_TIMEOUT = 6,   /* the handshake deadline passed during the proxy handshake */
	TL_PROXY_LOST = 7,      /* the proxy closed (or reset) the connection before its reply ended */
};

/* TLS causes in aux for TL_E_TLS */
enum {
	TL_TLS_GENERIC = 0,
	TL_TLS_UNKNOWN_CA = 1,
	TL_TLS_HOSTNAME = 2,
	TL_TLS_EXPIRED = 3,
	TL_TLS_ALPN = 4,
	TL_TLS_NOT_TLS = 5,
	TL_TLS_CONFIG = 6, /* CA file unreadable and the like */
	TL_TLS_PIN = 7,    /* the server's public key matches no pin */
};

/* Event flag bits */
#define TL_EVF_FINAL 0x1 /* last event of this connection: the slot is free */
#define TL_EVF_STAMPED 0x2 /* a sampled message: tl_evring.stamps[same index] holds its stamps */

/* tl_event is one record of the event ring (32 bytes). */
struct tl_event {
	const uint8_t *ptr; /* payload in the arena (NULL when len is 0) */
	uint32_t len;   /* payload length */
	uint32_t slot;  /* connection slot */
	uint32_t gen;   /* connection generation */
	uint16_t code;  /* close code (EV_CLOSE/EV_ERROR) or HTTP status */
	uint8_t kind;   /* TL_EV_* */
	uint8_t flags;  /* TL_EVF_* */
	int32_t err;    /* TL_E_* for EV_ERROR */
	int32_t aux;    /* errno or sub-cause */
};

/* tl_stamp holds the stage stamps of one sampled message (Config.SampleEvery),
 * CLOCK_MONOTONIC nanoseconds, 0 = not taken. The stamp table runs parallel
 * to the event ring (same index); only entries whose event carries
 * TL_EVF_STAMPED are written, all of them before the tail store that
 * publishes the event, so Go reads them under the same acquire. */
struct tl_stamp {
	uint64_t cqe;       /* the loop saw the receive completion (or INJECT) */
	uint64_t plaintext; /* the bytes were handed to the frame parser (after TLS for wss) */
	uint64_t publish;   /* just before the tail store that published the event */
	uint64_t wire;      /* kernel receive timestamp: not taken (multishot recv delivers no cmsg) */
};

/* tl_evring is the event ring's control block. */
struct tl_evring {
	uint64_t tail;          /* written by C (release), read by Go (acquire) */
	uint8_t pad0[TL_LINE - 8];
	uint64_t head;          /* written by Go (release), read by C (acquire) */
	uint8_t pad1[TL_LINE - 8];
	uint32_t cons_sleeping; /* Go sets 1 before sleeping on wake_seq, 2 before sleeping on its doorbell */
	uint32_t wake_seq;      /* futex word: C increments and wakes */
	uint32_t loop_wants_space; /* C sets 1 when input is held back for lack of ring/arena */
	int32_t cons_efd;       /* Go's doorbell eventfd (cons_sleeping 2): C writes it instead of the futex */
	uint8_t pad2[TL_LINE - 16];
	uint32_t size;          /* events, a power of two */
	uint32_t mask;
	struct tl_event *ev;
	struct tl_stamp *stamps; /* size entries when sampling is on, else NULL */
	uint8_t pad3[TL_LINE - 24];
};

/* Command ops */
enum {
	TL_CMD_PAD = 0,      /* skip to the end of the ring */
	TL_CMD_DIAL = 1,     /* start slot/gen with the params from tl_dial_prepare */
	TL_CMD_SEND = 2,     /* flags: opcode in bits 0-3, TL_CMDF_FIN, TL_CMDF_CONT */
	/* Send units: Go admits a SEND, PING or PONG against MaxSendQueue by
	 * its units (a SEND: its payload length; a PING or PONG: payload
	 * length + TL_CTRL_UNITS), and the loop adds the same units to
	 * tl_conn_pub.tx_done once the frame's bytes are written (or dropped). */
	TL_CMD_PING = 3,
	TL_CMD_PONG = 4,
	TL_CMD_CLOSE = 5,    /* code + reason payload */
	/* 6 was a shutdown command; tl_loop_stop does that. Not reused. */
	TL_CMD_INJECT = 7,   /* feed payload to a memory connection as if the server sent it */
	TL_CMD_ABORT = 8,    /* end slot/gen at once: no close handshake, queued output dropped */
	/* The rest of a direct send (tl_conn_pub.tx_own) the socket did not
	 * take: wire bytes (framed, masked), code = the ownership epoch Go
	 * held; the payload is a uint64 of send units (host order: the rest's
	 * bytes plus TL_UNIT_MSG per message it ends), then the bytes. The
	 * loop writes them before anything else
	 * of that connection, or drops them (retiring the units) when the
	 * epoch is over. */
	TL_CMD_DIRECT = 9,
};
#define TL_CTRL_UNITS 14     /* a control frame's header counted as send units */
/* A message's units also carry one TL_UNIT_MSG (on the record that ends
 * it; a ping or pong on its record), so accepted - tx_done counts queued
 * messages above bit 40 and queued payload bytes below it: sums of units
 * stay exact as long as fewer than 2^40 bytes are queued, which
 * MaxSendQueue keeps far away. */
#define TL_UNIT_MSG (1ull << 40)
#define TL_UNIT_BYTES (TL_UNIT_MSG - 1)
#define TL_CMDF_MEMORY 0x1 /* with TL_CMD_DIAL: a socketless connection fed by TL_CMD_INJECT */
#define TL_CMDF_IF_DIALING 0x2 /* with TL_CMD_CLOSE: abort only a connection not yet open (Dial's context ended) */
#define TL_CMDF_FIN 0x10
#define TL_CMDF_CONT 0x20 /* continuation of a message started by an earlier record */
/* With TL_CMD_SEND: more records of the same batch follow (Conn.SendBatch),
 * so the loop collects them and flushes once, at the record without it. */
#define TL_CMDF_MORE 0x40

/* tl_cmd is the 16-byte record header; len payload bytes follow, padded to
 * 16. */
struct tl_cmd {
	uint32_t len;
	uint8_t op;
	uint8_t flags;
	uint16_t code;
	uint32_t slot;
	uint32_t gen;
};

#define TL_CMD_ALIGN 16

/* tl_cmdring is the command ring's control block. */
struct tl_cmdring {
	uint64_t tail;          /* written by Go (release) */
	uint8_t pad0[TL_LINE - 8];
	uint64_t head;          /* written by C (release) */
	uint8_t pad1[TL_LINE - 8];
	uint32_t loop_sleeping; /* C sets 1 before blocking; Go writes the eventfd when set */
	int32_t efd;            /* eventfd the loop has a read armed on */
	/* Go stores CLOCK_MONOTONIC ns of its latest accepted send here
	 * (relaxed: only the loop's reply spin reads it, as a hint), when
	 * tl_config.reply_spin_ns is set. */
	uint64_t sent_ns;
	uint8_t pad2[TL_LINE - 16];
	uint64_t size;          /* bytes, a power of two */
	uint8_t *buf;
	uint32_t space_seq;     /* futex word: C bumps it (and wakes) after a drain while prod_waiting */
	uint32_t prod_waiting;  /* Go sets 1 before sleeping on space_seq for ring room */
	uint8_t pad3[TL_LINE - 24];
};

/* tl_conn_pub is what Go may read of a connection at any time (C writes
 * with atomic stores). Go waits on state with a futex during Dial. */
struct tl_conn_pub {
	uint32_t state;   /* talaris.State values */
	uint32_t gen;
	int32_t err;      /* TL_E_* once failed */
	int32_t aux;
	uint32_t code;    /* close code or HTTP status */
	uint32_t opened;  /* 1 once the upgrade completed (stays 1 after close) */
	uint64_t msgs_in, bytes_in, msgs_out, bytes_out;
	uint64_t pings_in, pongs_in, wire_in, wire_out;
	char detail[88];  /* NUL-terminated human detail of err, e.g. TLS reason */
	char proto[64];   /* agreed subprotocol, NUL-terminated */
	uint32_t resumed; /* 1: the TLS handshake resumed a cached session */
	uint32_t pad_;
	/* Send back-pressure (Go's admission control, SendContext): */
	uint64_t tx_done;    /* send units (see TL_CMD_SEND) retired: written to the socket or dropped */
	uint32_t tx_seq;     /* futex word: bumped when tx_done advances or the state changes */
	uint32_t tx_waiters; /* Go goroutines sleeping on tx_seq; C wakes only when not 0 */
	uint32_t gap;     /* 1 from a reconnecting drop until the next open: Send* refuse */
	uint32_t dial_claim; /* TL_CLAIM_*: who decided a Dial's fate first (tl_pub_claim_open) */
	uint64_t reconnects; /* successful re-opens of this handle */
	/* Direct sends (loop/tx.c, direct_linux.go): who may write this plain connection's
	 * socket, and the socket Go writes while it holds it. */
	uint32_t tx_own;  /* TL_OWN_* state | TL_OWN_WANT | epoch << TL_OWN_EPOCH_SHIFT */
	int32_t tx_fd;    /* the socket; valid while tx_own is FREE or GO */
	/* Send units retired without reaching the socket (a close timeout,
	 * an abort, a drop, a server's close): part of tx_done. */
	uint64_t tx_dropped;
};

/* dial_claim values. Go resets the word to NONE with the block. An inline
 * loop's Dial from another goroutine whose context ended cannot wait for
 * the loop (nobody may be running it): it CASes NONE -> ABANDONED and
 * returns; the loop CASes NONE -> LOOP before it publishes an open
 * (tl_pub_claim_open). Whoever wins decides: an abandoned connection is
 * aborted instead of opening (its caller never had the Conn), a claimed
 * one is returned by Dial. */
#define TL_CLAIM_NONE 0u
#define TL_CLAIM_ABANDONED 1u
#define TL_CLAIM_LOOP 2u

/* tx_own states (bits 0-1). The loop owns a connection's socket output
 * (TL_OWN_LOOP, also the zero value Go resets the block to) until it has
 * nothing left to write on an open plain connection, then stores
 * TL_OWN_FREE; a Go sender may CAS FREE -> GO, write the socket itself
 * and store FREE again, or, when the socket did not take the whole frame,
 * store HANDOFF and send the rest as TL_CMD_DIRECT. The loop never writes
 * or closes the socket while Go holds it: it sets TL_OWN_WANT, and Go
 * hands it over (LOOP) instead of freeing it and wakes the loop. */
#define TL_OWN_LOOP 0u
#define TL_OWN_FREE 1u
#define TL_OWN_GO 2u
#define TL_OWN_HANDOFF 3u
#define TL_OWN_STATE 3u
#define TL_OWN_WANT 4u
#define TL_OWN_EPOCH_SHIFT 8 /* bumped by the loop each time it takes the socket back for good */

/* Layouts Go reads and writes through cgo and sync/atomic: a field moved
 * here without the Go side moving too would be read as garbage, so the
 * build fails instead (x86-64/arm64 LP64). */
#define TL_LAYOUT(t, f, off) _Static_assert(__builtin_offsetof(struct t, f) == (off), #t "." #f " moved")
_Static_assert(sizeof(struct tl_event) == 32, "tl_event must stay 32 bytes");
TL_LAYOUT(tl_event, ptr, 0);
TL_LAYOUT(tl_event, len, 8);
TL_LAYOUT(tl_event, slot, 12);
TL_LAYOUT(tl_event, gen, 16);
TL_LAYOUT(tl_event, code, 20);
TL_LAYOUT(tl_event, kind, 22);
TL_LAYOUT(tl_event, flags, 23);
TL_LAYOUT(tl_event, err, 24);
TL_LAYOUT(tl_event, aux, 28);
TL_LAYOUT(tl_evring, tail, 0);
TL_LAYOUT(tl_evring, head, TL_LINE);
TL_LAYOUT(tl_evring, cons_sleeping, 2 * TL_LINE);
TL_LAYOUT(tl_evring, wake_seq, 2 * TL_LINE + 4);
TL_LAYOUT(tl_evring, loop_wants_space, 2 * TL_LINE + 8);
TL_LAYOUT(tl_evring, cons_efd, 2 * TL_LINE + 12);
TL_LAYOUT(tl_evring, size, 3 * TL_LINE);
TL_LAYOUT(tl_evring, mask, 3 * TL_LINE + 4);
TL_LAYOUT(tl_evring, ev, 3 * TL_LINE + 8);
TL_LAYOUT(tl_evring, stamps, 3 * TL_LINE + 16);
_Static_assert(sizeof(struct tl_stamp) == 32, "tl_stamp size");
TL_LAYOUT(tl_stamp, cqe, 0);
TL_LAYOUT(tl_stamp, plaintext, 8);
TL_LAYOUT(tl_stamp, publish, 16);
TL_LAYOUT(tl_stamp, wire, 24);
_Static_assert(sizeof(struct tl_evring) == 4 * TL_LINE, "tl_evring is four cache lines");
_Static_assert(sizeof(struct tl_cmd) == TL_CMD_ALIGN, "the command header is one 16-byte unit");
TL_LAYOUT(tl_cmd, len, 0);
TL_LAYOUT(tl_cmd, op, 4);
TL_LAYOUT(tl_cmd, flags, 5);
TL_LAYOUT(tl_cmd, code, 6);
TL_LAYOUT(tl_cmd, slot, 8);
TL_LAYOUT(tl_cmd, gen, 12);
TL_LAYOUT(tl_cmdring, tail, 0);
TL_LAYOUT(tl_cmdring, head, TL_LINE);
TL_LAYOUT(tl_cmdring, loop_sleeping, 2 * TL_LINE);
TL_LAYOUT(tl_cmdring, efd, 2 * TL_LINE + 4);
TL_LAYOUT(tl_cmdring, sent_ns, 2 * TL_LINE + 8);
TL_LAYOUT(tl_cmdring, size, 3 * TL_LINE);
TL_LAYOUT(tl_cmdring, buf, 3 * TL_LINE + 8);
TL_LAYOUT(tl_cmdring, space_seq, 3 * TL_LINE + 16);
TL_LAYOUT(tl_cmdring, prod_waiting, 3 * TL_LINE + 20);
_Static_assert(sizeof(struct tl_cmdring) == 4 * TL_LINE, "tl_cmdring is four cache lines");
TL_LAYOUT(tl_conn_pub, state, 0);
TL_LAYOUT(tl_conn_pub, gen, 4);
TL_LAYOUT(tl_conn_pub, err, 8);
TL_LAYOUT(tl_conn_pub, aux, 12);
TL_LAYOUT(tl_conn_pub, code, 16);
TL_LAYOUT(tl_conn_pub, opened, 20);
TL_LAYOUT(tl_conn_pub, msgs_in, 24);
TL_LAYOUT(tl_conn_pub, wire_out, 80);
TL_LAYOUT(tl_conn_pub, detail, 88);
TL_LAYOUT(tl_conn_pub, proto, 176);
TL_LAYOUT(tl_conn_pub, resumed, 240);
TL_LAYOUT(tl_conn_pub, tx_done, 248);
TL_LAYOUT(tl_conn_pub, tx_seq, 256);
TL_LAYOUT(tl_conn_pub, tx_waiters, 260);
TL_LAYOUT(tl_conn_pub, gap, 264);
TL_LAYOUT(tl_conn_pub, dial_claim, 268);
TL_LAYOUT(tl_conn_pub, reconnects, 272);
TL_LAYOUT(tl_conn_pub, tx_own, 280);
TL_LAYOUT(tl_conn_pub, tx_fd, 284);
TL_LAYOUT(tl_conn_pub, tx_dropped, 288);
_Static_assert(sizeof(struct tl_conn_pub) == 296, "tl_conn_pub size");

#endif
