/* transport/tls.c - the TLS (wss://) transport. Ciphertext arrives in provided-buffer
 * slots and is read by a custom BIO straight from the connection's slot
 * queue (no BIO_s_mem copy; a slot goes back to the kernel as soon as the
 * library has taken its bytes); SSL_read decrypts into a plaintext slot
 * (slots.h) the parser (conn.c) reads in place, so whole frames are
 * delivered without a copy into the arena, as on ws://.
 * Outgoing frames are framed by conn.c into the connection's plaintext
 * buffer (tx_pt); tl_tls_seal, called by the loop's flush, encrypts them
 * into the out buffer, which leaves through the loop's send. Calls conn.c
 * and the layers below it, never loop.c. One code path for BoringSSL and
 * OpenSSL 3; OPENSSL_IS_BORINGSSL guards the few differences. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "base/pub.h"
#include "base/sample.h"
#include "loop/state.h"
#include "transport/tls.h"
#include "transport/tls_verify.h"
#include "transport/tlsrec.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define TL_TLS_PT_CAP 16384 /* one record's worth of plaintext: the fallback buffer */
/* The largest frame (header included) kept whole in a plaintext slot while
 * its bytes arrive: a held frame's start moves to the front of a fresh
 * slot, where a record still fits after it. */
#define TL_PT_HOLD (TL_PT_SLOT - TL_PT_RECORD)
#define TL_SYSTEM_CA_FILE "/etc/ssl/certs/ca-certificates.crt"
#define TL_SYSTEM_CA_DIR "/etc/ssl/certs"

struct tl_tls {
	SSL *ssl;
	SSL_CTX *own_ctx; /* set when the dial brought its own roots or skips verification */
	struct tl_loop *l;
	struct tl_conn *c;
	uint8_t *pt;      /* own plaintext buffer: used when no plaintext slot is free */
	size_t pt_off, pt_len; /* plaintext run: parsed up to pt_off, decrypted up to pt_len */
	int32_t pq;       /* plaintext slot holding the run (events may point into it), -1: pt */
	uint8_t held;     /* the parser left a partial frame at pt_off for more bytes (rx_hold) */
	uint8_t unhold;   /* no slot to grow it in: the next feed takes it without holding */
	uint8_t reoffer;  /* the next feed starts with the frame held last (tl_conn.rx_held_ok holds) */
	int handshake_done;
	int saw_data;     /* first ciphertext byte checked for "is this TLS at all" */
	int consumed;     /* the library took ciphertext (or rec_read queued our KeyUpdate) since the last flush check */
	int shutdown_sent; /* our close_notify is queued */
	/* Our own record layer (tlsrec.h). rec_want: the config allows it
	 * (TL_TLSREC_ON or TL_TLSREC_LIB_GCM: whose AES-GCM opens) and
	 * the keylog callback keeps the server's secret; rec_track: the
	 * handshake is done, the suite fits, and rec follows every record the
	 * library reads through the slot BIO (tl_tlsrec_shadow, into scratch)
	 * until it hands over; rec_on: tl_tlsrec_open reads every record from
	 * then on; rec_end: it reported close_notify or an error, nothing
	 * more is read. */
	uint8_t rec_want, rec_track, rec_on, rec_end;
	uint8_t *scratch;
	struct tl_tlsrec rec;
};

const char *tl_tls_backend(void)
{
#ifdef OPENSSL_IS_BORINGSSL
	return "boringssl";
#else
	return "openssl";
#endif
}

/* err_clear empties the library's error queue when it holds anything.
 * The per-completion paths (SSL_read ending in WANT_READ, the empty
 * SSL_write after each batch of records) almost always find it empty, and
 * ERR_clear_error resets every entry of the queue whatever it holds: 80 to
 * 150 ns with BoringSSL, 150 to 250 ns with OpenSSL 3 on this machine,
 * against 11 to 30 ns for ERR_peek_error (measured 2026-12-01, 5M calls). */
static inline void err_clear(void)
{
	if (ERR_peek_error() != 0)
		ERR_clear_error();
}

/* ---- the slot BIO ---- */

static void rec_stop(struct tl_tls *t);

static int slot_bio_read(BIO *b, char *out, int outl)
{
	struct tl_tls *t = BIO_get_data(b);
	struct tl_loop *l = t->l;
	struct tl_conn *c = t->c;
	int got = 0;

	BIO_clear_retry_flags(b);
	while (got < outl) {
		const uint8_t *p;
		size_t n;
		if (tl_rxq_peek(&l->slots, &c->rxq, &p, &n) < 0)
			break;
		if (n > (size_t)(outl - got))
			n = (size_t)(outl - got);
		memcpy(out + got, p, n);
		if (t->rec_track && tl_tlsrec_shadow(&t->rec, p, n, t->scratch) < 0)
			rec_stop(t); /* the library reports what it makes of it */
		got += (int)n;
		/* Ciphertext is copied out, so the slot goes back at once. */
		tl_rxq_consume(&l->slots, &c->rxq, n, l->evq.head_cache);
	}
	if (got > 0) {
		t->consumed = 1;
		return got;
	}
	if (c->eof)
		return 0; /* transport EOF */
	BIO_set_retry_read(b);
	return -1;
}

static int slot_bio_write(BIO *b, const char *in, int inl)
{
	struct tl_tls *t = BIO_get_data(b);
	BIO_clear_retry_flags(b);
	if (tl_conn_out_append(t->c, (const uint8_t *)in, (size_t)inl) < 0)
		return -1;
	return inl;
}

static long slot_bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	(void)b;
	(void)num;
	(void)ptr;
	switch (cmd) {
	case BIO_CTRL_FLUSH:
		return 1;
	default:
		return 0;
	}
}

static int slot_bio_create(BIO *b)
{
	BIO_set_init(b, 1);
	return 1;
}

static BIO_METHOD *slot_method;
static pthread_once_t slot_method_once = PTHREAD_ONCE_INIT;

static void make_slot_method(void)
{
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "talaris slot");
	if (!m)
		return;
	BIO_meth_set_read(m, slot_bio_read);
	BIO_meth_set_write(m, slot_bio_write);
	BIO_meth_set_ctrl(m, slot_bio_ctrl);
	BIO_meth_set_create(m, slot_bio_create);
	slot_method = m;
}

/* ---- contexts ---- */

/* keylog_cb keeps the server's application traffic secret for our record
 * layer (tlsrec.h): the keylog callback is the one C API both libraries
 * have for it (this BoringSSL exports SSL_get_traffic_secrets only as
 * C++). The other secrets of the line stream are not kept. */
static void keylog_cb(const SSL *ssl, const char *line)
{
	BIO *b = SSL_get_rbio(ssl);
	struct tl_tls *t = b ? BIO_get_data(b) : NULL;
	if (t && t->rec_want && !t->handshake_done)
		tl_tlsrec_keylog(&t->rec, line);
}

static SSL_CTX *new_ctx(void)
{
	static const uint8_t alpn[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	if (!ctx)
		return NULL;
	SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	/* Returns 0 on success in both libraries. */
	if (SSL_CTX_set_alpn_protos(ctx, alpn, sizeof(alpn)) != 0) {
		SSL_CTX_free(ctx);
		return NULL;
	}
	tl_tlsv_ctx_setup(ctx);
	SSL_CTX_set_keylog_callback(ctx, keylog_cb);
#ifdef OPENSSL_IS_BORINGSSL
	{
		/* BoringSSL's default verify list with Ed25519 added, which it
		 * leaves out by default and OpenSSL offers: one verdict on both
		 * backends for a server with an Ed25519 certificate. Returns 1 on
		 * success. */
		static const uint16_t prefs[] = {
			SSL_SIGN_ECDSA_SECP256R1_SHA256, SSL_SIGN_RSA_PSS_RSAE_SHA256, SSL_SIGN_RSA_PKCS1_SHA256,
			SSL_SIGN_ECDSA_SECP384R1_SHA384, SSL_SIGN_RSA_PSS_RSAE_SHA384, SSL_SIGN_RSA_PKCS1_SHA384,
			SSL_SIGN_RSA_PSS_RSAE_SHA512,    SSL_SIGN_RSA_PKCS1_SHA512,    SSL_SIGN_ED25519,
			SSL_SIGN_RSA_PKCS1_SHA1,
		};
		if (SSL_CTX_set_verify_algorithm_prefs(ctx, prefs, sizeof(prefs) / sizeof(prefs[0])) != 1) {
			SSL_CTX_free(ctx);
			return NULL;
		}
	}
#endif
#ifndef OPENSSL_IS_BORINGSSL
	/* Refuse TLS 1.2 renegotiation like BoringSSL does by default
	 * (ssl_renegotiate_never): a HelloRequest is answered with a
	 * no_renegotiation alert instead of a new handshake mid-stream. */
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
#endif
	return ctx;
}

static int add_pem_roots(SSL_CTX *ctx, const char *pem, size_t len)
{
	X509_STORE *store = SSL_CTX_get_cert_store(ctx);
	BIO *b = BIO_new_mem_buf(pem, (int)len);
	int added = 0;
	X509 *x;

	if (!b)
		return -1;
	while ((x = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL) {
		if (X509_STORE_add_cert(store, x) == 1)
			added++;
		X509_free(x);
	}
	ERR_clear_error(); /* the loop ends on a "no start line" error */
	BIO_free(b);
	return added > 0 ? 0 : -1;
}

/* send_alert_now hands the alert the library just queued (unknown_ca,
 * no_renegotiation, ...) to the socket at once, so the server learns why
 * we leave: teardown shuts the socket down without waiting for a send.
 * Failure path only; skipped when a send is in flight (order matters). */
static void send_alert_now(struct tl_conn *c)
{
	struct tl_outbuf *ob = &c->out[c->cur];
	if (c->fd < 0 || c->send_inflight || ob->len == 0)
		return;
	if (send(c->fd, ob->p, ob->len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
		/* nothing to do: we are leaving anyway */
	}
	ob->len = 0;
}

static void tls_fail(struct tl_loop *l, struct tl_conn *c, int cause, const char *what)
{
	char buf[88];
	unsigned long e = ERR_peek_last_error();
	if (e && !what) {
		ERR_error_string_n(e, buf, sizeof(buf));
		what = buf;
	}
	ERR_clear_error();
	send_alert_now(c);
	tl_conn_fail(l, c, TL_E_TLS, cause, c->state == TL_ST_OPEN ? 1006 : 0, what ? what : "TLS failure");
}

/* ---- received plaintext runs (rxp_*) ---- */

/* rxp_drop gives up t's plaintext slot: back to the free stack, or deferred
 * while an event Go has not passed points into it (tl_slots_release). */
static void rxp_drop(struct tl_loop *l, struct tl_tls *t)
{
	if (t->pq < 0)
		return;
	tl_slots_release(&l->slots, (uint32_t)t->pq, l->evq.head_cache);
	t->pq = -1;
}

/* rxp_take takes a free plaintext slot, first releasing the deferred ones
 * Go has passed when none is free; maps them on first use. Returns its
 * id, or -1. */
static int32_t rxp_take(struct tl_loop *l)
{
	struct tl_slots *s = &l->slots;
	int32_t q;

	if (tl_slots_pt_map(s) < 0)
		return -1;
	q = tl_slots_pt_get(s);
	if (q < 0 && tl_slots_deferred(s)) {
		tl_evq_refresh(&l->evq);
		tl_slots_release_deferred(s, l->evq.head_cache);
		q = tl_slots_pt_get(s);
	}
	return q;
}

/* rxp_base returns the start of t's plaintext run's buffer. */
static inline uint8_t *rxp_base(struct tl_loop *l, const struct tl_tls *t)
{
	return t->pq >= 0 ? tl_slots_ptr(&l->slots, (uint32_t)t->pq) : t->pt;
}

/* rxp_room picks where the next SSL_read decrypts to, once the run is
 * parsed to its end (pt_off == pt_len), and returns how many bytes fit
 * there (at rxp_base + pt_len). The current plaintext slot goes on while a
 * whole record fits; else it is dropped and a free one taken (after
 * releasing the deferred slots Go has passed). With none free - the pump
 * is behind, or their memory could not be mapped - the connection
 * decrypts into its own buffer and its frames are copied into the arena
 * as before: it never waits for a plaintext slot, the ring and arena stay
 * the only back-pressure. */
static size_t rxp_room(struct tl_loop *l, struct tl_tls *t)
{
	int32_t q;

	if (t->pq >= 0) {
		if (TL_PT_SLOT - t->pt_len >= TL_PT_RECORD)
			return TL_PT_SLOT - t->pt_len;
		rxp_drop(l, t);
	}
	t->pt_off = t->pt_len = 0;
	q = rxp_take(l);
	if (q < 0)
		return TL_TLS_PT_CAP;
	t->pq = q;
	return TL_PT_SLOT;
}

/* rxp_move_held moves a held partial frame (pt_off..pt_len, at most
 * TL_PT_HOLD bytes) to the front of a free plaintext slot, where a whole
 * record fits after it, and gives up the old slot: one copy of less than
 * a frame, where reassembly would copy the whole frame twice. Returns 0,
 * or -1 when no slot is free. */
static int rxp_move_held(struct tl_loop *l, struct tl_tls *t)
{
	int32_t q = rxp_take(l);
	size_t n = t->pt_len - t->pt_off;

	if (q < 0)
		return -1;
	memcpy(tl_slots_ptr(&l->slots, (uint32_t)q), rxp_base(l, t) + t->pt_off, n);
	rxp_drop(l, t);
	t->pq = q;
	t->pt_off = 0;
	t->pt_len = n;
	return 0;
}

int tl_tls_start(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_dial *d = c->dial;
	struct tl_tls *t;
	SSL_CTX *ctx;
	BIO *bio;
	unsigned char ipbuf[16];
	int is_ip;

	pthread_once(&slot_method_once, make_slot_method);
	if (!slot_method) {
		tls_fail(l, c, TL_TLS_GENERIC, "cannot create the slot BIO method");
		return -1;
	}
	t = calloc(1, sizeof(*t));
	if (!t || !(t->pt = malloc(TL_TLS_PT_CAP))) {
		free(t);
		tl_conn_fail(l, c, TL_E_NOMEM, ENOMEM, 0, "out of memory starting TLS");
		return -1;
	}
	t->l = l;
	t->c = c;
	t->pq = -1;
	t->rec_want = (uint8_t)l->cfg.tls_record_layer; /* TL_TLSREC_* */
	c->tls = t;
	if (d->ca_file_len || d->ca_pem_len || d->insecure) {
		ctx = t->own_ctx = new_ctx();
		if (!ctx) {
			tls_fail(l, c, TL_TLS_GENERIC, NULL);
			return -1;
		}
		if (d->insecure) {
			SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
		} else if (d->ca_file_len && SSL_CTX_load_verify_locations(ctx, d->ca_file, NULL) != 1) {
			tls_fail(l, c, TL_TLS_CONFIG, "cannot load RootCAFile");
			return -1;
		} else if (d->ca_pem_len && add_pem_roots(ctx, d->ca_pem, d->ca_pem_len) < 0) {
			tls_fail(l, c, TL_TLS_CONFIG, "RootCAPEM holds no certificate");
			return -1;
		}
	} else {
		if (!l->ts.ctx_default) {
			ctx = new_ctx();
			if (!ctx) {
				tls_fail(l, c, TL_TLS_GENERIC, NULL);
				return -1;
			}
			/* The system store explicitly: Android's BoringSSL build has no
			 * useful default paths. */
			if (SSL_CTX_load_verify_locations(ctx, TL_SYSTEM_CA_FILE, TL_SYSTEM_CA_DIR) != 1)
				ERR_clear_error(); /* no system store: every verify fails with unknown CA */
			l->ts.ctx_default = ctx;
		}
		ctx = l->ts.ctx_default;
	}
	t->ssl = SSL_new(ctx);
	bio = BIO_new(slot_method);
	if (!t->ssl || !bio) {
		BIO_free(bio);
		tls_fail(l, c, TL_TLS_GENERIC, NULL);
		return -1;
	}
	BIO_set_data(bio, t);
	SSL_set_bio(t->ssl, bio, bio); /* one BIO both ways; SSL owns it */
	SSL_set_connect_state(t->ssl);
	is_ip = inet_pton(AF_INET, d->server_name, ipbuf) == 1 || inet_pton(AF_INET6, d->server_name, ipbuf) == 1;
	if (!is_ip && d->server_name_len)
		SSL_set_tlsext_host_name(t->ssl, d->server_name);
	if (!d->insecure && d->server_name_len) {
		X509_VERIFY_PARAM *param = SSL_get0_param(t->ssl);
		int ok;
		X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
		if (is_ip)
			ok = X509_VERIFY_PARAM_set1_ip_asc(param, d->server_name);
		else
			ok = X509_VERIFY_PARAM_set1_host(param, d->server_name, d->server_name_len);
		if (ok != 1) {
			tls_fail(l, c, TL_TLS_CONFIG, "cannot set the name to verify");
			return -1;
		}
	}
	{
		int cause;
		const char *what;
		if (tl_tlsv_conn_setup(l, c, t->ssl, &cause, &what) < 0) {
			tls_fail(l, c, cause, what);
			return -1;
		}
	}
	return tl_tls_drive(l, c) == TL_FEED_DEAD ? -1 : 0;
}

/* key_update_queued says whether a KeyUpdate of ours waits in the library
 * for the next write. OpenSSL 3 refuses SSL_key_update (and SSL_shutdown)
 * while one does: the queued one puts the connection back "in init" until
 * a write sends it. BoringSSL has no getter, and needs none: a second
 * SSL_key_update while one is pending adds nothing and succeeds. */
static int key_update_queued(SSL *ssl)
{
#ifdef OPENSSL_IS_BORINGSSL
	(void)ssl;
	return 0;
#else
	return SSL_get_key_update_type(ssl) != SSL_KEY_UPDATE_NONE;
#endif
}

void tl_tls_close_notify(struct tl_conn *c)
{
	struct tl_tls *t = c->tls;
	if (!t || !t->handshake_done || t->shutdown_sent)
		return;
	/* The frames framed before it (the close frame) go first. */
	if (tl_tls_seal(t->l, c) < 0)
		return;
	t->shutdown_sent = 1;
	/* Our KeyUpdate, queued for a burst of the server's requests, goes
	 * first (the empty write sends it): OpenSSL would not shut down with
	 * it pending. */
	if (key_update_queued(t->ssl))
		SSL_write(t->ssl, "", 0);
	/* Writes close_notify through the slot BIO into the out buffer; 0
	 * (the peer's is still to come) is the expected result. */
	SSL_shutdown(t->ssl);
	ERR_clear_error();
}

void tl_tls_free(struct tl_conn *c)
{
	struct tl_tls *t = c->tls;
	if (!t)
		return;
	rxp_drop(t->l, t);
	rec_stop(t);
	tl_tlsv_conn_free(t->l, c, t->ssl);
	SSL_free(t->ssl);
	SSL_CTX_free(t->own_ctx);
	free(t->pt);
	free(t);
	c->tls = NULL;
}

void tl_tls_shared_free(struct tl_tls_shared *ts)
{
	SSL_CTX_free(ts->ctx_default); /* NULL is fine */
	ts->ctx_default = NULL;
	tl_tlsv_shared_free(ts);
}

/* pt_drop empties c's plaintext buffer, retiring the send units of its
 * frames (they will never be written). */
static void pt_drop(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_outbuf *pt = &c->tx_pt;
	uint64_t units = pt->units;

	pt->len = 0;
	pt->units = 0;
	pt->replies = 0;
	tl_pub_tx_retire(l, c, units);
}

int tl_tls_seal(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_tls *t = c->tls;
	struct tl_outbuf *pt = &c->tx_pt, *ob;
	const uint8_t *p = pt->p;
	size_t n = pt->len;

	if (!n)
		return 0;
	if (!t || !t->handshake_done) {
		/* Not reached: frames are framed only once c is open (after the
		 * handshake). Nothing could encrypt them: drop, not send. */
		pt_drop(l, c);
		return 0;
	}
	while (n > 0) {
		int chunk = n > (1u << 30) ? (1 << 30) : (int)n;
		int w = SSL_write(t->ssl, p, chunk);
		if (w <= 0) {
			tls_fail(l, c, TL_TLS_GENERIC, NULL);
			pt_drop(l, c);
			return -1;
		}
		p += w;
		n -= (size_t)w;
	}
	ob = &c->out[c->cur]; /* where the BIO appended the records */
	ob->units += pt->units;
	ob->replies += pt->replies;
	tl_outbuf_reset(pt);
	return 0;
}

/* alpn_failure walks the error queue (the last entry is often a generic
 * wrapper such as BoringSSL's PARSE_TLSEXT) for an ALPN cause: the server
 * refused http/1.1 (no_application_protocol alert) or selected a protocol
 * we never offered. */
static int alpn_failure(void)
{
	int found = 0;
#ifdef OPENSSL_IS_BORINGSSL
	unsigned long e;
	while ((e = ERR_get_error()) != 0) {
		int r = ERR_GET_REASON(e);
		if (r == SSL_R_TLSV1_ALERT_NO_APPLICATION_PROTOCOL || r == SSL_R_NO_APPLICATION_PROTOCOL ||
		    r == SSL_R_INVALID_ALPN_PROTOCOL)
			found = 1;
	}
#else
	const char *func = NULL;
	unsigned long e;
	while ((e = ERR_get_error_all(NULL, NULL, &func, NULL, NULL)) != 0) {
		int r = ERR_GET_REASON(e);
		if (r == SSL_R_TLSV1_ALERT_NO_APPLICATION_PROTOCOL || r == SSL_R_NO_APPLICATION_PROTOCOL)
			found = 1;
		/* An unoffered selection is a BAD_EXTENSION raised by the ALPN
		 * extension parser; only the function name says which one. */
		if (func && strstr(func, "alpn"))
			found = 1;
	}
#endif
	return found;
}

/* classify turns a failed handshake into the cause users act on. It may
 * empty the error queue: *what is set to the message to report (into buf
 * when it comes from the queue). */
static int tls_classify(struct tl_tls *t, const char **what, char *buf, size_t cap)
{
	long vr = SSL_get_verify_result(t->ssl);
	unsigned long e = ERR_peek_last_error();
	int reason = ERR_GET_REASON(e);

	/* X509_V_ERR_INVALID_CALL: no chain was verified (the handshake failed
	 * before the certificate, an ALPN alert say): the error queue decides. */
	switch (vr) {
	case X509_V_OK:
	case X509_V_ERR_INVALID_CALL:
		break;
	case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
	case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
	case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
	case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
	case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
		*what = X509_verify_cert_error_string(vr);
		return TL_TLS_UNKNOWN_CA;
	case X509_V_ERR_HOSTNAME_MISMATCH:
	case X509_V_ERR_IP_ADDRESS_MISMATCH:
		*what = X509_verify_cert_error_string(vr);
		return TL_TLS_HOSTNAME;
	case X509_V_ERR_CERT_HAS_EXPIRED:
	case X509_V_ERR_CERT_NOT_YET_VALID:
		*what = X509_verify_cert_error_string(vr);
		return TL_TLS_EXPIRED;
	default:
		*what = X509_verify_cert_error_string(vr);
		return TL_TLS_GENERIC;
	}
	if (reason == SSL_R_WRONG_VERSION_NUMBER) {
		*what = "server did not answer with TLS";
		return TL_TLS_NOT_TLS;
	}
	if (e)
		ERR_error_string_n(e, buf, cap);
	if (alpn_failure()) {
		*what = "server refused ALPN http/1.1 or selected another protocol";
		return TL_TLS_ALPN;
	}
	*what = e ? buf : NULL;
	return TL_TLS_GENERIC;
}

/* looks_like_tls checks the first byte the server sent: a TLS server
 * answers with a handshake (22) or alert (21) record; anything else (an
 * HTTP 400 from a plain server, say) means no TLS at all. */
static int looks_like_tls(struct tl_loop *l, struct tl_conn *c, char *peek, size_t cap)
{
	const uint8_t *p;
	size_t n, k = 0;

	tl_rxq_peek(&l->slots, &c->rxq, &p, &n);
	if (p[0] == 22 || p[0] == 21)
		return 1;
	for (size_t i = 0; i < n && k + 1 < cap && p[i] != '\r' && p[i] != '\n'; i++)
		peek[k++] = (p[i] >= 0x20 && p[i] < 0x7f) ? (char)p[i] : '.';
	peek[k] = 0;
	return 0;
}

/* rec_scratch_free wipes and frees the shadow's scratch buffer: it held
 * the plaintext of the records the library read before the hand-over. */
static void rec_scratch_free(struct tl_tls *t)
{
	if (t->scratch)
		OPENSSL_cleanse(t->scratch, TL_REC_SCRATCH);
	free(t->scratch);
	t->scratch = NULL;
}

/* rec_stop keeps the connection on SSL_read for good: the secret and
 * keys are wiped. */
static void rec_stop(struct tl_tls *t)
{
	t->rec_track = 0;
	tl_tlsrec_free(&t->rec);
	rec_scratch_free(t);
}

/* rec_setup decides, once the handshake is done, whether our record
 * layer may take the connection over: TLS 1.3 with an AES-GCM suite, the
 * server's secret captured, and nothing of the server's stream buffered
 * in the library (SSL_has_pending; neither library reads ahead in TLS, so
 * the server's Finished was the last record it read and the next byte in
 * the slots starts the first record under the application keys).
 * Anything else (TLS 1.2, ChaCha20) stays on SSL_read, the secret wiped.
 * The library keeps reading until its first application data (rec_try):
 * the NewSessionTickets servers send first go to it, so session
 * resumption works as before; meanwhile rec follows each record it reads
 * (tl_tlsrec_shadow), so it knows the sequence number and any KeyUpdate. */
static void rec_setup(struct tl_tls *t)
{
	const SSL_CIPHER *ci = SSL_get_current_cipher(t->ssl);
	uint16_t id = ci ? SSL_CIPHER_get_protocol_id(ci) : 0;

	t->rec.lib_gcm = t->rec_want == TL_TLSREC_LIB_GCM;
	t->rec_track = t->rec_want && SSL_version(t->ssl) == TLS1_3_VERSION && !SSL_has_pending(t->ssl) &&
		       (t->scratch = malloc(TL_REC_SCRATCH)) != NULL && tl_tlsrec_start(&t->rec, id, 0) == 0;
	t->rec_want = 0;
	if (!t->rec_track)
		rec_stop(t);
}

/* rec_try hands the connection to our record layer after SSL_read
 * returned application data, once the library stands between two
 * records: rec, which followed every byte it read, is at a record
 * boundary, and the library holds nothing (SSL_has_pending). BoringSSL's
 * own sequence number (SSL_get_read_sequence) must agree with rec's;
 * OpenSSL 3 has no such call. Not at a boundary yet: tried again after
 * the next SSL_read. */
static void rec_try(struct tl_tls *t)
{
	if (!tl_tlsrec_boundary(&t->rec) || SSL_has_pending(t->ssl))
		return;
#ifdef OPENSSL_IS_BORINGSSL
	if (SSL_get_read_sequence(t->ssl) != t->rec.seq) {
		rec_stop(t);
		return;
	}
#endif
	t->rec_track = 0;
	t->rec_on = 1;
	rec_scratch_free(t);
}

static int handshake(struct tl_loop *l, struct tl_conn *c, struct tl_tls *t)
{
	const unsigned char *sel = NULL;
	unsigned int sel_len = 0;
	int r;

	if (!t->saw_data && !tl_rxq_empty(&c->rxq)) {
		char peek[48], msg[88];
		t->saw_data = 1;
		if (!looks_like_tls(l, c, peek, sizeof(peek))) {
			snprintf(msg, sizeof(msg), "server answered in plain text: %s", peek);
			tl_conn_fail(l, c, TL_E_TLS, TL_TLS_NOT_TLS, 0, msg);
			return -2;
		}
	}
	r = SSL_do_handshake(t->ssl);
	if (r != 1) {
		int e = SSL_get_error(t->ssl, r);
		const char *what = NULL;
		char ebuf[88];
		int cause;
		if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
			err_clear();
			return 0;
		}
		if (c->eof && ERR_peek_last_error() == 0) {
			tl_conn_fail(l, c, TL_E_LOST, c->eof_errno, 0, "connection closed during the TLS handshake");
			return -2;
		}
		cause = tls_classify(t, &what, ebuf, sizeof(ebuf));
		tls_fail(l, c, cause, what);
		return -2;
	}
	SSL_get0_alpn_selected(t->ssl, &sel, &sel_len);
	if (sel_len && (sel_len != 8 || memcmp(sel, "http/1.1", 8) != 0)) {
		tls_fail(l, c, TL_TLS_ALPN, "server selected an ALPN protocol other than http/1.1");
		return -2;
	}
	{
		int cause;
		const char *what;
		if (tl_tlsv_handshake_done(l, c, t->ssl, &cause, &what) < 0) {
			tls_fail(l, c, cause, what);
			return -2;
		}
	}
	t->handshake_done = 1;
	rec_setup(t);
	if (tl_conn_start_upgrade(l, c) < 0)
		return -2;
	return 1;
}

/* peer_closed handles the server's close_notify: the TLS stream ended
 * cleanly. What that means for the WebSocket is decided like a TCP EOF.
 * Answer with ours and our FIN now (the teardown that follows closes the
 * socket without waiting for a send). */
static void peer_closed(struct tl_conn *c)
{
	c->eof = 1;
	if (!c->shut_wr && !(c->todo & TL_DO_SHUT_WR) && c->fd >= 0) {
		tl_tls_close_notify(c);
		send_alert_now(c);
		if (!c->send_inflight) {
			shutdown(c->fd, SHUT_WR);
			c->shut_wr = 2;
		}
	}
}

/* rec_read opens the next record with our record layer into the plaintext
 * run (rxp_room picks the buffer, as for SSL_read; while a record is half
 * opened its buffer stays put, so rxp_room is not asked). Returns 1 (go
 * on: data appended or a record without data handled), 0 (wait for
 * ciphertext, or the stream ended: the caller's EOF path), -1 (c failed). */
static int rec_read(struct tl_loop *l, struct tl_conn *c, struct tl_tls *t)
{
	size_t room = 0, n = 0;
	int r;

	if (t->rec_end)
		return 0;
	if (!tl_tlsrec_midrecord(&t->rec))
		room = rxp_room(l, t); /* keeps a held frame: its slot has room */
	r = tl_tlsrec_open(&t->rec, &l->slots, &c->rxq, l->evq.head_cache, rxp_base(l, t) + t->pt_len, room, &n);
	switch (r) {
	case TL_REC_DATA:
		t->pt_len += n;
		t->held = 0;
		tl_sample_pt(c);
		__atomic_store_n(&l->stats->tls_records, l->stats->tls_records + 1, __ATOMIC_RELAXED);
		if (t->rec.gcm)
			__atomic_store_n(&l->stats->tls_records_gcm, l->stats->tls_records_gcm + 1, __ATOMIC_RELAXED);
		return 1;
	case TL_REC_AGAIN:
		return 1;
	case TL_REC_KEYREQ:
		/* The server asked for our KeyUpdate (4.6.3): the write side is
		 * the library's, which queues it (one at a time: a request while
		 * ours is queued adds nothing) and sends it on the next write.
		 * That is the empty one at the end of tl_tls_drive, so a burst of
		 * requests gets one answer, as 4.6.3 says of a silent receiver,
		 * not one per record piling up for a peer that does not read. */
		if (!key_update_queued(t->ssl) && SSL_key_update(t->ssl, SSL_KEY_UPDATE_NOT_REQUESTED) != 1) {
			t->rec_end = 1;
			tls_fail(l, c, TL_TLS_GENERIC, "cannot send our KeyUpdate");
			tl_tlsrec_free(&t->rec);
			return -1;
		}
		t->consumed = 1;
		err_clear();
		return 1;
	case TL_REC_MORE:
		return 0;
	case TL_REC_EOF:
		t->rec_end = 1;
		tl_tlsrec_free(&t->rec);
		peer_closed(c);
		return 0;
	default:
		t->rec_end = 1;
		if (c->close_rcvd) {
			/* After the close handshake what comes is no failure of the
			 * connection (as on the SSL_read path): the stream ends here,
			 * as at a close_notify (the input still queued is dropped at
			 * teardown: tl_life_drive does not wait for it). */
			tl_tlsrec_free(&t->rec);
			peer_closed(c);
			return 0;
		}
		tls_fail(l, c, TL_TLS_GENERIC, t->rec.err);
		tl_tlsrec_free(&t->rec);
		return -1;
	}
}

int tl_tls_drive(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_tls *t = c->tls;
	int r;

	if (!t)
		return TL_FEED_DEAD;
	if (!t->handshake_done) {
		r = handshake(l, c, t);
		if (r <= 0)
			return r == 0 ? TL_FEED_OK : TL_FEED_DEAD;
	}
	if (tl_conn_flush_pending(l, c) == TL_FEED_STALL)
		return TL_FEED_STALL;
	for (;;) {
		if (tl_conn_replies(c) > l->cfg.max_send_queue)
			return TL_FEED_STALL; /* pongs pile up, the peer does not read: as tl_plain_drive */
		if (t->pt_off < t->pt_len && !t->held) {
			size_t used = 0;
			/* Whole frames in a plaintext slot stay there; one not all
			 * decrypted yet waits in it for the rest (rx_hold). */
			c->cur_q = t->pq;
			c->rx_hold = t->pq >= 0 && !t->unhold ? TL_PT_HOLD : 0;
			if (!t->reoffer)
				c->rx_held_ok = 0; /* the run does not start with a held frame */
			t->reoffer = 0;
			r = tl_conn_feed(l, c, rxp_base(l, t) + t->pt_off, t->pt_len - t->pt_off, &used);
			c->cur_q = -1;
			c->rx_hold = 0;
			t->unhold = 0;
			t->pt_off += used;
			if (r == TL_FEED_STALL)
				return TL_FEED_STALL;
			if (r == TL_FEED_DEAD) {
				t->pt_off = t->pt_len;
				c->discard = 1;
			}
			if (tl_conn_ending(c))
				return TL_FEED_DEAD;
			t->held = t->pt_off < t->pt_len;
			t->reoffer = t->held;
			continue;
		}
		if (t->held && TL_PT_SLOT - t->pt_len < TL_PT_RECORD && rxp_move_held(l, t) < 0) {
			/* No slot to grow the frame in: the parser reassembles it. */
			t->held = 0;
			t->unhold = 1;
			continue;
		}
		if (t->rec_on) {
			r = rec_read(l, c, t);
			if (r > 0)
				continue;
			if (r < 0)
				return TL_FEED_DEAD;
			break;
		}
		{
			size_t room = rxp_room(l, t); /* keeps a held frame: its slot has room */
			r = SSL_read(t->ssl, rxp_base(l, t) + t->pt_len, (int)room);
		}
		if (r > 0) {
			t->pt_len += (size_t)r;
			t->held = 0;
			tl_sample_pt(c);
			if (t->rec_track)
				rec_try(t);
			continue;
		}
		{
			int e = SSL_get_error(t->ssl, r);
			if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
				err_clear();
				break;
			}
			if (e == SSL_ERROR_ZERO_RETURN) {
				ERR_clear_error();
				peer_closed(c);
				break;
			}
			if (c->eof || c->close_rcvd) {
				/* Transport EOF without close_notify: BoringSSL says
				 * SYSCALL, OpenSSL "unexpected eof". Report both the same way,
				 * through the EOF path. After the close handshake the
				 * stream is over for us: what the library says about the
				 * rest is no failure of the connection either, and it
				 * ends the stream as a close_notify would. */
				ERR_clear_error();
				if (!c->eof)
					peer_closed(c);
				break;
			}
			tls_fail(l, c, TL_TLS_GENERIC, NULL);
			return TL_FEED_DEAD;
		}
	}
	if (t->consumed && !tl_conn_ending(c) && !c->close_sent) {
		/* Acknowledge a KeyUpdate (or flush any post-handshake reply) even on
		 * a connection that never sends: both libraries emit it on write.
		 * Keyed on ciphertext consumed, not on plaintext returned: a
		 * KeyUpdate that arrives alone yields no application data. */
		t->consumed = 0;
		SSL_write(t->ssl, "", 0);
		err_clear();
	}
	return TL_FEED_OK;
}
