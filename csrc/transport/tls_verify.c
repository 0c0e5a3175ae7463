/* transport/tls_verify.c - per-connection TLS policy (the C side of
 * TLSOptions), kept out of the rest of the TLS transport:
 *
 *  - host names are checked against subjectAltName only (DNS and IP
 *    entries), never the subject CN (RFC 9525), on both libraries;
 *  - every certificate in the trust store is an anchor, also one that is
 *    not a CA (X509_V_FLAG_PARTIAL_CHAIN): a self-signed CA:FALSE leaf given
 *    as the only root is accepted like Go's crypto/tls accepts a leaf that
 *    is in its root pool, on both libraries;
 *  - client certificate and key, minimum (and derived maximum) version,
 *    TLS 1.2 cipher list and (OpenSSL only) TLS 1.3 suites;
 *  - SHA-256 pins of the server's SubjectPublicKeyInfo, checked after every
 *    handshake (resumed ones too, and with InsecureSkipVerify);
 *  - a client session cache per loop (tl_tls_shared.sess_cache) keyed by
 *    a string Go builds from address, SNI and a digest of the TLS options,
 *    filled by the new-session callback (TLS 1.2 sessions and TLS 1.3
 *    tickets), offered on the next dial with the same key. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "transport/tls_verify.h"
#include "loop/state.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdlib.h>
#include <string.h>

#define TL_SESS_CACHE_MAX 64

struct tl_tls_dial {
	char *client_cert, *client_key, *ciphers12, *ciphers13, *sess_key;
	size_t client_cert_len, client_key_len, ciphers12_len, ciphers13_len, sess_key_len;
	uint8_t *pins;
	size_t pins_len;
	uint32_t min_version, max_version;
};

struct tl_sess_entry {
	char *key;
	SSL_SESSION *sess;
};

struct tl_sess_cache {
	int n;
	struct tl_sess_entry e[TL_SESS_CACHE_MAX];
};

/* tl_sess_ref hangs on an SSL (app data) that takes part in the cache. */
struct tl_sess_ref {
	struct tl_loop *l;
	char *key;
};

void tl_tlsv_dial_free(struct tl_tls_dial *x)
{
	if (!x)
		return;
	free(x->client_cert);
	if (x->client_key) {
		OPENSSL_cleanse(x->client_key, x->client_key_len);
		free(x->client_key);
	}
	free(x->ciphers12);
	free(x->ciphers13);
	free(x->sess_key);
	free(x->pins);
	free(x);
}

/* dup_field sets *dst to a NUL-terminated copy of src[0..n) (src may be
 * NULL when n is 0) and *dst_len to n; -1 on no memory. */
static int dup_field(char **dst, size_t *dst_len, const void *src, size_t n)
{
	*dst = tl_dupn(src ? src : "", n);
	*dst_len = n;
	return *dst ? 0 : -1;
}

struct tl_tls_dial *tl_tlsv_dial_copy(const struct tl_dial_params *p)
{
	struct tl_tls_dial *x = calloc(1, sizeof(*x));
	char *pins = NULL;

	if (!x)
		return NULL;
	if (dup_field(&x->client_cert, &x->client_cert_len, p->client_cert, p->client_cert_len) < 0 ||
	    dup_field(&x->client_key, &x->client_key_len, p->client_key, p->client_key_len) < 0 ||
	    dup_field(&x->ciphers12, &x->ciphers12_len, p->ciphers12, p->ciphers12_len) < 0 ||
	    dup_field(&x->ciphers13, &x->ciphers13_len, p->ciphers13, p->ciphers13_len) < 0 ||
	    dup_field(&x->sess_key, &x->sess_key_len, p->sess_key, p->sess_key_len) < 0 ||
	    dup_field(&pins, &x->pins_len, p->pins, p->pins_len) < 0) {
		tl_tlsv_dial_free(x);
		return NULL;
	}
	x->pins = (uint8_t *)pins;
	x->min_version = p->min_version;
	x->max_version = p->max_version;
	return x;
}

/* ---- session cache ---- */

static struct tl_sess_cache *cache_of(struct tl_loop *l)
{
	if (!l->ts.sess_cache)
		l->ts.sess_cache = calloc(1, sizeof(struct tl_sess_cache));
	return l->ts.sess_cache;
}

/* cache_put stores sess (taking the caller's reference) under key;
 * returns 0 when it did not take it. */
static int cache_put(struct tl_loop *l, const char *key, SSL_SESSION *sess)
{
	struct tl_sess_cache *sc;
	int i;

	if (!(sc = cache_of(l)) || !SSL_SESSION_is_resumable(sess))
		return 0;
	for (i = 0; i < sc->n; i++) {
		if (strcmp(sc->e[i].key, key) == 0) {
			SSL_SESSION_free(sc->e[i].sess);
			sc->e[i].sess = sess;
			return 1; /* we keep the reference */
		}
	}
	if (sc->n == TL_SESS_CACHE_MAX) { /* drop the oldest key */
		free(sc->e[0].key);
		SSL_SESSION_free(sc->e[0].sess);
		memmove(&sc->e[0], &sc->e[1], sizeof(sc->e[0]) * (TL_SESS_CACHE_MAX - 1));
		sc->n--;
	}
	sc->e[sc->n].key = strdup(key);
	if (!sc->e[sc->n].key)
		return 0;
	sc->e[sc->n].sess = sess;
	sc->n++;
	return 1;
}

/* sess_new_cb sees full-handshake TLS 1.2 sessions and every TLS 1.3
 * ticket. */
static int sess_new_cb(SSL *ssl, SSL_SESSION *sess)
{
	struct tl_sess_ref *ref = SSL_get_app_data(ssl);
	return ref ? cache_put(ref->l, ref->key, sess) : 0;
}

static SSL_SESSION *cache_find(struct tl_loop *l, const char *key)
{
	struct tl_sess_cache *sc = l->ts.sess_cache;
	if (!sc)
		return NULL;
	for (int i = 0; i < sc->n; i++)
		if (strcmp(sc->e[i].key, key) == 0)
			return sc->e[i].sess;
	return NULL;
}

void tl_tlsv_shared_free(struct tl_tls_shared *ts)
{
	struct tl_sess_cache *sc = ts->sess_cache;
	if (!sc)
		return;
	for (int i = 0; i < sc->n; i++) {
		free(sc->e[i].key);
		SSL_SESSION_free(sc->e[i].sess);
	}
	free(sc);
	ts->sess_cache = NULL;
}

void tl_tlsv_ctx_setup(SSL_CTX *ctx)
{
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
	SSL_CTX_sess_set_new_cb(ctx, sess_new_cb);
}

static void cache_remove(struct tl_loop *l, const char *key)
{
	struct tl_sess_cache *sc = l->ts.sess_cache;
	if (!sc)
		return;
	for (int i = 0; i < sc->n; i++) {
		if (strcmp(sc->e[i].key, key) == 0) {
			free(sc->e[i].key);
			SSL_SESSION_free(sc->e[i].sess);
			memmove(&sc->e[i], &sc->e[i + 1], sizeof(sc->e[0]) * (size_t)(sc->n - i - 1));
			sc->n--;
			return;
		}
	}
}

/* A connection that failed at the TLS layer (verification, pin, a bad
 * record) leaves no session behind. Any other ending keeps it: a WebSocket
 * ends with its close handshake and TCP, not with close_notify, and OpenSSL
 * would otherwise mark the session not resumable at SSL_free (BoringSSL
 * does not), so the library is told the shutdown was clean. */
void tl_tlsv_conn_free(struct tl_loop *l, struct tl_conn *c, SSL *ssl)
{
	struct tl_sess_ref *ref;
	if (!ssl || !(ref = SSL_get_app_data(ssl)))
		return;
	if (__atomic_load_n(&l->pub[c->slot].err, __ATOMIC_RELAXED) == TL_E_TLS)
		cache_remove(l, ref->key);
	else
		SSL_set_shutdown(ssl, SSL_get_shutdown(ssl) | SSL_SENT_SHUTDOWN);
	SSL_set_app_data(ssl, NULL);
	free(ref->key);
	free(ref);
}

/* ---- before the handshake ---- */

static int use_client_cert(SSL *ssl, const struct tl_tls_dial *x, const char **what)
{
	BIO *b = BIO_new_mem_buf(x->client_cert, (int)x->client_cert_len);
	X509 *leaf = NULL, *extra;
	EVP_PKEY *key = NULL;
	int ok = 0;

	if (!b)
		return -1;
	leaf = PEM_read_bio_X509(b, NULL, NULL, NULL);
	if (!leaf || SSL_use_certificate(ssl, leaf) != 1) {
		*what = "cannot use the client certificate";
		goto out;
	}
	while ((extra = PEM_read_bio_X509(b, NULL, NULL, NULL)) != NULL) {
		int r = (int)SSL_add1_chain_cert(ssl, extra);
		X509_free(extra);
		if (r != 1) {
			*what = "cannot use the client certificate chain";
			goto out;
		}
	}
	ERR_clear_error(); /* the loop ends on "no start line" */
	BIO_free(b);
	b = BIO_new_mem_buf(x->client_key, (int)x->client_key_len);
	if (!b)
		goto out;
	key = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
	if (!key || SSL_use_PrivateKey(ssl, key) != 1 || SSL_check_private_key(ssl) != 1) {
		*what = "cannot use the client key";
		goto out;
	}
	ok = 1;
out:
	EVP_PKEY_free(key);
	X509_free(leaf);
	BIO_free(b);
	return ok ? 0 : -1;
}

int tl_tlsv_conn_setup(struct tl_loop *l, struct tl_conn *c, SSL *ssl, int *cause, const char **what)
{
	struct tl_dial *d = c->dial;
	const struct tl_tls_dial *x = d->tlsx;

	*cause = TL_TLS_CONFIG;
	*what = NULL;
	if (!d->insecure) {
		X509_VERIFY_PARAM *param = SSL_get0_param(ssl);
		/* SAN only: a name in the subject CN is never matched. */
		X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS |
							   X509_CHECK_FLAG_NEVER_CHECK_SUBJECT);
		/* A certificate in the trust store is an anchor even when it is
		 * not a CA (a pinned self-signed leaf). */
		X509_VERIFY_PARAM_set_flags(param, X509_V_FLAG_PARTIAL_CHAIN);
	}
	if (!x)
		return 0;
	if (x->min_version && SSL_set_min_proto_version(ssl, (uint16_t)x->min_version) != 1) {
		*what = "cannot set the minimum TLS version";
		return -1;
	}
	if (x->max_version && SSL_set_max_proto_version(ssl, (uint16_t)x->max_version) != 1) {
		*what = "cannot set the maximum TLS version";
		return -1;
	}
	if (x->ciphers12_len && SSL_set_cipher_list(ssl, x->ciphers12) != 1) {
		*what = "cannot set the TLS 1.2 cipher suites";
		return -1;
	}
#ifndef OPENSSL_IS_BORINGSSL
	/* BoringSSL has no TLS 1.3 suite setting: it always offers its three
	 * (AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305) in its own,
	 * hardware-aware order. */
	if (x->ciphers13_len && SSL_set_ciphersuites(ssl, x->ciphers13) != 1) {
		*what = "cannot set the TLS 1.3 cipher suites";
		return -1;
	}
#endif
	if (x->client_cert_len && use_client_cert(ssl, x, what) < 0)
		return -1;
	if (x->sess_key_len) {
		struct tl_sess_ref *ref = calloc(1, sizeof(*ref));
		SSL_SESSION *s;
		if (!ref || !(ref->key = tl_dupn(x->sess_key, x->sess_key_len))) {
			free(ref);
			*what = "out of memory";
			return -1;
		}
		ref->l = l;
		SSL_set_app_data(ssl, ref);
		s = cache_find(l, ref->key);
		if (s && SSL_SESSION_is_resumable(s) && SSL_set_session(ssl, s) != 1)
			ERR_clear_error(); /* a session that no longer fits: full handshake */
	}
	return 0;
}

/* ---- after the handshake ---- */

static int pin_matches(SSL *ssl, const struct tl_tls_dial *x)
{
#ifdef OPENSSL_IS_BORINGSSL
	X509 *peer = SSL_get_peer_certificate(ssl);
#else
	X509 *peer = SSL_get1_peer_certificate(ssl);
#endif
	EVP_PKEY *pk;
	uint8_t *der = NULL, sum[SHA256_DIGEST_LENGTH];
	int n, found = 0;

	if (!peer)
		return 0;
	pk = X509_get_pubkey(peer);
	n = pk ? i2d_PUBKEY(pk, &der) : -1;
	if (n > 0) {
		SHA256(der, (size_t)n, sum);
		for (size_t off = 0; off + SHA256_DIGEST_LENGTH <= x->pins_len; off += SHA256_DIGEST_LENGTH)
			if (CRYPTO_memcmp(sum, x->pins + off, SHA256_DIGEST_LENGTH) == 0)
				found = 1;
	}
	OPENSSL_free(der);
	EVP_PKEY_free(pk);
	X509_free(peer);
	return found;
}

int tl_tlsv_handshake_done(struct tl_loop *l, struct tl_conn *c, SSL *ssl, int *cause, const char **what)
{
	const struct tl_tls_dial *x = c->dial ? c->dial->tlsx : NULL;
	struct tl_sess_ref *ref = SSL_get_app_data(ssl);
	int resumed = SSL_session_reused(ssl);

	__atomic_store_n(&l->pub[c->slot].resumed, resumed ? 1u : 0u, __ATOMIC_RELAXED);
	if (resumed && ref) {
		/* A resumed TLS 1.2 handshake that brought a new ticket made a new
		 * session (OpenSSL marks the old one not resumable) without calling
		 * the new-session callback: keep the current one. */
		SSL_SESSION *s = SSL_get1_session(ssl);
		if (s && !cache_put(l, ref->key, s))
			SSL_SESSION_free(s);
	}
	if (x && x->pins_len && !pin_matches(ssl, x)) {
		*cause = TL_TLS_PIN;
		*what = "server public key matches no pin";
		return -1;
	}
	return 0;
}
