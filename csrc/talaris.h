/* talaris.h - the C API the Go binding calls. Every call here is a cgo call
 * and none of them is on the per-message path: Go creates a loop, prepares
 * dials and stops the loop through these; messages and commands travel
 * through the rings of ring.h. */
#ifndef TALARIS_H
#define TALARIS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "ring.h"

/* Wait strategies: mirror talaris.WaitStrategy. */
enum {
	TL_WAIT_DEFAULT = 0,
	TL_WAIT_BLOCK = 1,
	TL_WAIT_SPIN = 2,
	TL_WAIT_SPIN_THEN_BLOCK = 3,
	TL_WAIT_ADAPTIVE = 4, /* spin up to spin_ns after publishing, while replies come fast */
};

/* tl_config.tls_record_layer: who opens TLS 1.3 AES-GCM records. */
enum {
	TL_TLSREC_OFF = 0,     /* the library's SSL_read throughout */
	TL_TLSREC_ON = 1,      /* our record layer, our AES-GCM where the CPU runs it */
	TL_TLSREC_LIB_GCM = 2, /* our record layer, the library's AES-GCM */
};

/* tl_config carries Config after Go filled in its defaults. */
struct tl_config {
	uint32_t sq_entries, cq_entries;
	uint32_t ring_flags;      /* IORING_SETUP_* */
	uint32_t sq_thread_idle_ms;
	int32_t sq_thread_cpu;    /* -1: none */
	uint32_t buf_size, buf_count;
	int32_t loop_cpu;         /* -1: not pinned */
	uint32_t loop_wait;       /* TL_WAIT_* */
	uint64_t spin_ns;
	uint32_t event_ring_size;
	uint64_t arena_size;
	uint64_t cmd_ring_size;
	uint32_t max_conns;
	uint64_t max_message;
	uint64_t handshake_timeout_ns;
	uint64_t close_timeout_ns;
	uint64_t max_send_queue;
	uint32_t sample_every;    /* stamp one receive completion in this many; 0: off */
	/* testhook.Knobs.NoRecvBundle (off): open connections' multishot recvs
	 * are bundles (IORING_RECVSEND_BUNDLE: one completion over several
	 * buffers) when the kernel has them (6.10+); 0: one buffer per
	 * completion. */
	uint32_t recv_bundle;
	/* Receive fairness (testhook.Knobs.MaxConnPendingEvents/Bytes): a
	 * connection with this many events, or this many payload bytes,
	 * published and not yet passed by the pump is held (stalled) until the
	 * pump passes some of them, so a flood queues at most this much ahead
	 * of another connection's message. 0: no limit (the decoder). */
	uint32_t conn_max_events;
	/* Config.Tuning.InlineLoop: no loop thread; tl_loop_new sets the ring
	 * up on the calling thread, which alone runs the loop
	 * (tl_loop_inline_run). */
	uint32_t inline_loop;
	uint64_t conn_max_bytes;
	/* Config.Tuning.ReplySpin (TL_WAIT_ADAPTIVE only; 0: off): after Go sends
	 * (tl_cmdring.sent_ns), the loop spins up to this long past the send
	 * for the answer's completion instead of sleeping, while answers
	 * have been coming within it. */
	uint64_t reply_spin_ns;
	/* Config.Tuning.NoTLSRecordLayer and NoOwnGCM (both off): TLS 1.3
	 * AES-GCM connections' records are opened by our own record layer
	 * (transport/tlsrec.h) once the library has read the first application
	 * data, with our AES-GCM (crypto/gcm.h) where the CPU runs it
	 * (TL_TLSREC_ON) or the library's (TL_TLSREC_LIB_GCM); TL_TLSREC_OFF:
	 * SSL_read throughout. */
	uint32_t tls_record_layer;
	/* testhook.Knobs.MinWaitCompletions: the batched wait (min_wait_ns)
	 * waits for this many completions (at least 2). */
	uint32_t min_wait_nr;
	/* Config.Tuning.MinWait (0: off): while a flood streams in, the loop's
	 * wait asks the kernel (IORING_FEAT_MIN_TIMEOUT, 6.12+) to wait up to
	 * this long for min_wait_nr completions before it takes what came
	 * (loop/wait.c, wait_batched). */
	uint64_t min_wait_ns;
	/* Tuning.Prefault: populate the arena and the receive slots at setup
	 * (otherwise their pages fault in the first time data passes them). */
	uint32_t prefault;
	/* Knobs.NoRecvProbe (tests): the loop never polls silent recvs
	 * (loop/probe.c), so a lost recv completion stays lost. */
	uint32_t no_recv_probe;
};

/* TL_PRESEND is how long the loop's reply spin waits, after a publish to
 * an awake pump, for a send answering it (while sends have been coming
 * that soon): a third of the reply spin. */
#define TL_PRESEND(cfg) ((cfg)->reply_spin_ns / 3)

/* tl_pool_stats mirrors testhook.PoolStats and the counters of
 * talaris.Metrics (C writes with relaxed atomics; pump_sleeps is Go's).
 * msgs and bytes are counted loop-locally per message and stored here once
 * per published batch. */
struct tl_pool_stats {
	uint64_t events, batches, cqes, rearms, nobufs, stalls, loop_wakes, pump_sleeps;
	uint64_t reconnects;   /* successful re-opens by reconnect policies: counted in tl_pub_set_state */
	uint64_t msgs, bytes;  /* data messages published and their payload bytes */
	uint64_t wire_bytes;   /* bytes the recvs delivered (TLS records and frame headers included) */
	uint64_t sendq_full;   /* reads held back because a connection's own replies (pongs, close) passed max_send_queue */
	uint64_t fair_holds;   /* connections held at their conn_max_events / conn_max_bytes (also counted in stalls) */
	uint64_t tls_records;  /* TLS application-data records opened by our record layer (transport/tlsrec.h), not SSL_read */
	uint64_t min_waits;    /* the loop's waits that were batched (cfg.min_wait_ns; loop/wait.c, wait_batched) */
	uint64_t tls_records_gcm; /* those of tls_records opened with our AES-GCM (crypto/gcm.h), not the library's */
	uint64_t recv_revived; /* armed recvs the kernel left silent on a ready socket, cancelled and re-armed (loop/probe.c, tl_loop_probe_recvs) */
	uint64_t send_dropped; /* messages accepted for sending that never reached a socket (tl_pub_tx_drop) */
};

struct tl_loop;

/* tl_gcm_selftest_failed (crypto/gcm.h): 1 when the own AES-GCM's power-on
 * self-test failed and the library's AES-GCM opens every record. */
int tl_gcm_selftest_failed(void);

/* tl_gcm_supported (crypto/gcm.h): 1 when this CPU runs the own AES-GCM, its
 * self-test (run by the first call) passed and it outran the library's,
 * else 0. tl_gcm_library_faster: 1 when only the speed race ruled it out. */
int tl_gcm_supported(void);
int tl_gcm_library_faster(void);

/* tl_loop_new creates the io_uring loop and its thread, waiting until the
 * thread has set the ring up. On failure returns NULL with a negative errno
 * in *err and a message in errbuf (errcap bytes). The loop owns every
 * buffer it exposes; tl_loop_free releases them. */
struct tl_loop *tl_loop_new(const struct tl_config *cfg, int *err, char *errbuf, size_t errcap);

/* Accessors for the shared blocks; valid until tl_loop_free. */
struct tl_evring *tl_loop_evring(struct tl_loop *l);
struct tl_cmdring *tl_loop_cmdring(struct tl_loop *l);
struct tl_conn_pub *tl_loop_conns(struct tl_loop *l);
struct tl_pool_stats *tl_loop_stats(struct tl_loop *l);

/* Where a delivered payload lies (tl_loop_payload_origin). */
enum { TL_ORIGIN_OTHER = 0, TL_ORIGIN_ARENA = 1, TL_ORIGIN_SLOT = 2, TL_ORIGIN_PLAINTEXT = 3 };

/* tl_loop_payload_origin says where p lies: the arena (copied), a receive
 * slot or a TLS plaintext slot (delivered in place), else
 * TL_ORIGIN_OTHER. For tests (internal/testhook), never per message:
 * call it from the pump while the event that carries p is unconsumed. */
int tl_loop_payload_origin(const struct tl_loop *l, const void *p);

/* tl_dial_params describes one connection; strings are copied by
 * tl_dial_prepare and need not outlive the call. */
struct tl_dial_params {
	struct sockaddr_storage addr;
	uint32_t addr_len;
	int32_t tls;                     /* 1 for wss:// */
	const char *host; size_t host_len;       /* Host header value */
	const char *path; size_t path_len;
	const char *headers; size_t headers_len; /* "Name: value\r\n" lines */
	const char *protocols; size_t protocols_len;
	const char *server_name; size_t server_name_len; /* SNI and verified name */
	const char *ca_file; size_t ca_file_len;
	const char *ca_pem; size_t ca_pem_len;
	int32_t insecure;
	uint64_t handshake_timeout_ns;
	/* TLS policy (tls_verify.c); Go checks every value first */
	const char *client_cert; size_t client_cert_len; /* PEM, leaf first, chain after */
	const char *client_key; size_t client_key_len;   /* PEM private key */
	uint32_t min_version, max_version;               /* 0x0303/0x0304; 0: default */
	const char *ciphers12; size_t ciphers12_len;     /* TLS 1.2 cipher list (library names) */
	const char *ciphers13; size_t ciphers13_len;     /* TLS 1.3 suites (OpenSSL only) */
	const uint8_t *pins; size_t pins_len;            /* n x SHA-256 of the server's SPKI */
	const char *sess_key; size_t sess_key_len;       /* session cache key; empty: no resumption */
	struct sockaddr_storage local;   /* source address to bind, when local_len != 0 */
	uint32_t local_len;
	uint32_t nalt;                   /* further addresses tried in order when connect fails */
	const struct sockaddr_storage *alt;
	uint64_t ping_interval_ns;       /* 0: no heartbeat pings */
	uint64_t read_timeout_ns;        /* 0: no read timeout */
	/* Reconnect policy (rc_enabled 0: one attempt, ends are final). */
	int32_t rc_enabled;
	uint32_t rc_max_attempts;        /* 0: forever */
	uint64_t rc_min_ns, rc_max_ns;   /* backoff bounds, 0 < min <= max */
	/* Text messages the loop sends after every open, before any user
	 * command: each one a 4-byte host-order length then its bytes. */
	const char *subscribe; size_t subscribe_len;
	uint64_t close_timeout_ns;       /* 0: the loop's close_timeout_ns */
	/* Proxy (DialOptions.Proxy; transport/proxy.c): addr and alt are then
	 * the proxy's addresses, and after TCP connect the loop runs the
	 * proxy's handshake within the handshake timeout, before TLS (still
	 * with server_name) and the upgrade. Go builds every request. */
	int32_t proxy;                   /* TL_PROXY_KIND_* */
	uint32_t proxy_pad;
	const char *proxy_req; size_t proxy_req_len;   /* HTTP: the whole CONNECT request; SOCKS5: its CONNECT request */
	const char *proxy_auth; size_t proxy_auth_len; /* SOCKS5: the RFC 1929 username/password request; empty: no authentication offered */
};

/* Kinds of proxy (tl_dial_params.proxy). */
enum { TL_PROXY_KIND_NONE = 0, TL_PROXY_KIND_HTTP = 1, TL_PROXY_KIND_SOCKS5 = 2 };

/* tl_dial_prepare stores a copy of p for slot, which Go owns (no dial is in
 * flight on it); a following TL_CMD_DIAL starts it. Returns 0, or a
 * negative errno (-ENOMEM, or -EINVAL for a bad slot or address length).
 * On failure nothing is kept. */
int tl_dial_prepare(struct tl_loop *l, uint32_t slot, const struct tl_dial_params *p);

/* TL_FAIL_HEAD_MAX bounds what a refused upgrade keeps of the response:
 * all the head the parser accepts (16 KiB, TL_HTTP_MAX_HEAD) with the body
 * bytes that came with it within that, so Go reads the same Retry-After
 * and headers the loop's reconnect policy read. */
#define TL_FAIL_HEAD_MAX 16384

/* tl_loop_fail_head copies to buf (cap bytes) the start of the response a
 * refused upgrade of connection slot/gen received (head and first body
 * bytes, at most TL_FAIL_HEAD_MAX) and returns the bytes copied: 0 when
 * there is none or the slot now holds another connection. Go calls it
 * only while it owns the ended slot (the loop does not touch it then). */
size_t tl_loop_fail_head(struct tl_loop *l, uint32_t slot, uint32_t gen, char *buf, size_t cap);

/* tl_loop_stop asks the thread to close every connection and exit, and
 * joins it. Events already published stay readable until tl_loop_free.
 * An inline loop (cfg.inline_loop) has no thread: on the thread that
 * created it, tl_loop_stop runs the close handshakes itself (bounded by
 * close_timeout); on any other thread it wakes the loop, waits until no
 * thread runs it (a tl_loop_inline_run returns within TL_INLINE_CAP_NS, or
 * finishes the shutdown first) and marks it dead: the sockets are then
 * closed by tl_loop_free without their close handshakes. */
void tl_loop_stop(struct tl_loop *l);

/* Results of tl_loop_inline_run. */
enum {
	TL_INLINE_IDLE = 0,      /* no event published (nonblocking, once, or the wait's cap) */
	TL_INLINE_EVENTS = 1,    /* events were published: the caller drains the event ring */
	TL_INLINE_STOPPED = 2,   /* the loop has stopped (every connection ended) */
};
/* Modes of tl_loop_inline_run. */
enum {
	TL_INLINE_BLOCK = 0,     /* iterate until events are published, waiting in the kernel */
	TL_INLINE_NOWAIT = 1,    /* one iteration that never waits */
	TL_INLINE_ONCE = 2,      /* one iteration that may wait (at most TL_INLINE_CAP_NS) */
};
/* The longest one wait of an inline loop: its caller looks at Go's state
 * (Pool.Close, a Dial's context) at least this often. */
#define TL_INLINE_CAP_NS 100000000ull

/* tl_loop_inline_run runs iterations of an inline loop on the calling
 * thread, which must be the one that created it (tl_loop_new), in mode
 * (TL_INLINE_*). After a stop request it runs the shutdown to its end
 * before it returns TL_INLINE_STOPPED. Returns TL_INLINE_*, -EPERM on
 * another thread or for a threaded loop, -ESHUTDOWN once the loop stopped
 * or was marked dead (tl_loop_stop). Never call it from itself. */
int tl_loop_inline_run(struct tl_loop *l, int mode);

/* tl_loop_inline_owner returns 1 when l is an inline loop created on the
 * calling thread, else 0. */
int tl_loop_inline_owner(const struct tl_loop *l);

/* tl_loop_free releases a stopped loop and everything it exposed. */
void tl_loop_free(struct tl_loop *l);

/* tl_decoder_new makes a synchronous decoder: the loop's frame parser,
 * event ring and arena with no thread, socket or io_uring, fed by the
 * caller with tl_decoder_feed. Returns NULL on bad sizes or no memory. */
struct tl_loop *tl_decoder_new(uint64_t max_message, uint32_t ring_size, uint64_t arena_size);

/* tl_decoder_feed parses server bytes p[0..n) into the event ring and
 * returns 0 (all used), -1 (ring or arena full: consume events, advance the
 * ring head, call again with the rest) or -2 (the stream failed; the final
 * event says why). *used counts bytes consumed. Whole data frames are
 * delivered in place: their events point into p, so p must stay valid
 * (and, from Go, pinned) until the caller has consumed every event this
 * call appended; nothing else of p is retained. */
int tl_decoder_feed(struct tl_loop *l, const uint8_t *p, size_t n, size_t *used);

/* tl_decoder_free releases a decoder. */
void tl_decoder_free(struct tl_loop *l);

/* tl_tls_backend names the linked TLS library: "boringssl" or "openssl". */
const char *tl_tls_backend(void);

/* Layouts Go fills in or reads (see ring.h for the rings). */
_Static_assert(sizeof(struct tl_config) == 168, "tl_config size");
TL_LAYOUT(tl_config, sq_entries, 0);
TL_LAYOUT(tl_config, ring_flags, 8);
TL_LAYOUT(tl_config, sq_thread_cpu, 16);
TL_LAYOUT(tl_config, buf_size, 20);
TL_LAYOUT(tl_config, loop_cpu, 28);
TL_LAYOUT(tl_config, loop_wait, 32);
TL_LAYOUT(tl_config, spin_ns, 40);
TL_LAYOUT(tl_config, event_ring_size, 48);
TL_LAYOUT(tl_config, arena_size, 56);
TL_LAYOUT(tl_config, cmd_ring_size, 64);
TL_LAYOUT(tl_config, max_conns, 72);
TL_LAYOUT(tl_config, max_message, 80);
TL_LAYOUT(tl_config, handshake_timeout_ns, 88);
TL_LAYOUT(tl_config, close_timeout_ns, 96);
TL_LAYOUT(tl_config, max_send_queue, 104);
TL_LAYOUT(tl_config, sample_every, 112);
TL_LAYOUT(tl_config, conn_max_events, 120);
TL_LAYOUT(tl_config, conn_max_bytes, 128);
TL_LAYOUT(tl_config, reply_spin_ns, 136);
TL_LAYOUT(tl_config, tls_record_layer, 144);
TL_LAYOUT(tl_config, min_wait_nr, 148);
TL_LAYOUT(tl_config, min_wait_ns, 152);
TL_LAYOUT(tl_config, prefault, 160);
_Static_assert(sizeof(struct tl_pool_stats) == 152, "tl_pool_stats size");
TL_LAYOUT(tl_pool_stats, send_dropped, 144);
TL_LAYOUT(tl_pool_stats, events, 0);
TL_LAYOUT(tl_pool_stats, pump_sleeps, 56);
TL_LAYOUT(tl_pool_stats, reconnects, 64);
TL_LAYOUT(tl_pool_stats, msgs, 72);
TL_LAYOUT(tl_pool_stats, sendq_full, 96);
TL_LAYOUT(tl_pool_stats, fair_holds, 104);
TL_LAYOUT(tl_pool_stats, tls_records, 112);
TL_LAYOUT(tl_pool_stats, min_waits, 120);
TL_LAYOUT(tl_pool_stats, tls_records_gcm, 128);
TL_LAYOUT(tl_pool_stats, recv_revived, 136);
TL_LAYOUT(tl_dial_params, addr, 0);
TL_LAYOUT(tl_dial_params, addr_len, 128);
TL_LAYOUT(tl_dial_params, tls, 132);
TL_LAYOUT(tl_dial_params, host, 136);
TL_LAYOUT(tl_dial_params, path, 152);
TL_LAYOUT(tl_dial_params, headers, 168);
TL_LAYOUT(tl_dial_params, protocols, 184);
TL_LAYOUT(tl_dial_params, server_name, 200);
TL_LAYOUT(tl_dial_params, ca_file, 216);
TL_LAYOUT(tl_dial_params, ca_pem, 232);
TL_LAYOUT(tl_dial_params, insecure, 248);
TL_LAYOUT(tl_dial_params, handshake_timeout_ns, 256);
TL_LAYOUT(tl_dial_params, client_cert, 264);
TL_LAYOUT(tl_dial_params, client_key, 280);
TL_LAYOUT(tl_dial_params, min_version, 296);
TL_LAYOUT(tl_dial_params, ciphers12, 304);
TL_LAYOUT(tl_dial_params, ciphers13, 320);
TL_LAYOUT(tl_dial_params, pins, 336);
TL_LAYOUT(tl_dial_params, sess_key, 352);
TL_LAYOUT(tl_dial_params, local, 368);
TL_LAYOUT(tl_dial_params, local_len, 496);
TL_LAYOUT(tl_dial_params, nalt, 500);
TL_LAYOUT(tl_dial_params, alt, 504);
TL_LAYOUT(tl_dial_params, ping_interval_ns, 512);
TL_LAYOUT(tl_dial_params, read_timeout_ns, 520);
TL_LAYOUT(tl_dial_params, rc_enabled, 528);
TL_LAYOUT(tl_dial_params, rc_max_attempts, 532);
TL_LAYOUT(tl_dial_params, rc_min_ns, 536);
TL_LAYOUT(tl_dial_params, rc_max_ns, 544);
TL_LAYOUT(tl_dial_params, subscribe, 552);
TL_LAYOUT(tl_dial_params, close_timeout_ns, 568);
TL_LAYOUT(tl_dial_params, proxy, 576);
TL_LAYOUT(tl_dial_params, proxy_req, 584);
TL_LAYOUT(tl_dial_params, proxy_auth, 600);
_Static_assert(sizeof(struct tl_dial_params) == 616, "tl_dial_params size");

#endif
