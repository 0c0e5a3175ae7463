/* transport/tls.c - the TLS (wss://) transport: a connection's SSL made
 * (contexts, roots, the name to verify, the policy of transport/tls_verify.c)
 * and freed. Ciphertext arrives in provided-buffer slots and is read by a
 * custom BIO straight from the connection's slot queue (transport/tls_bio.c:
 * no BIO_s_mem copy; a slot goes back to the kernel as soon as the
 * library has taken its bytes); SSL_read decrypts into a plaintext slot
 * (base/slots.h) the parser (ws/frames.c) reads in place, so whole frames are
 * delivered without a copy into the arena, as on ws:// (transport/tls_read.c);
 * once the handshake is done our own TLS 1.3 record layer may take the
 * reading over (transport/tls_handover.c, transport/tlsrec.c).
 * Outgoing frames are framed by ws/ into the connection's plaintext
 * buffer (tx_pt); tl_tls_seal, called by the loop's flush, encrypts them
 * into the out buffer, which leaves through the loop's send
 * (transport/tls_send.c). Calls ws/ and the layers below it, never loop/.
 * One code path for BoringSSL and OpenSSL 3; OPENSSL_IS_BORINGSSL guards
 * the few differences. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "transport/internal.h"
#include "transport/tls_verify.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>

const char *tl_tls_backend(void)
{
#ifdef OPENSSL_IS_BORINGSSL
	return "boringssl";
#else
	return "openssl";
#endif
}

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

int tl_tls_start(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_dial *d = c->dial;
	struct tl_tls *t;
	SSL_CTX *ctx;
	BIO *bio;
	unsigned char ipbuf[16];
	int is_ip;

	pthread_once(&tl_tls_slot_method_once, tl_tls_make_slot_method);
	if (!tl_tls_slot_method) {
		tl_tls_fail(l, c, TL_TLS_GENERIC, "cannot create the slot BIO method");
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
			tl_tls_fail(l, c, TL_TLS_GENERIC, NULL);
			return -1;
		}
		if (d->insecure) {
			SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
		} else if (d->ca_file_len && SSL_CTX_load_verify_locations(ctx, d->ca_file, NULL) != 1) {
			/* The Go side checked that the file reads and holds a PEM
			 * certificate: what is left is the library's reason. */
			char why[88];
			unsigned long e = ERR_peek_last_error();
			const char *r = e ? ERR_reason_error_string(e) : NULL;
			snprintf(why, sizeof(why), "cannot load RootCAFile: %s", r ? r : "no usable certificate");
			tl_tls_fail(l, c, TL_TLS_CONFIG, why);
			return -1;
		} else if (d->ca_pem_len && add_pem_roots(ctx, d->ca_pem, d->ca_pem_len) < 0) {
			tl_tls_fail(l, c, TL_TLS_CONFIG, "RootCAPEM holds no certificate");
			return -1;
		}
	} else {
		if (!l->ts.ctx_default) {
			ctx = new_ctx();
			if (!ctx) {
				tl_tls_fail(l, c, TL_TLS_GENERIC, NULL);
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
	bio = BIO_new(tl_tls_slot_method);
	if (!t->ssl || !bio) {
		BIO_free(bio);
		tl_tls_fail(l, c, TL_TLS_GENERIC, NULL);
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
			tl_tls_fail(l, c, TL_TLS_CONFIG, "cannot set the name to verify");
			return -1;
		}
	}
	{
		int cause;
		const char *what;
		if (tl_tlsv_conn_setup(l, c, t->ssl, &cause, &what) < 0) {
			tl_tls_fail(l, c, cause, what);
			return -1;
		}
	}
	return tl_tls_drive(l, c) == TL_FEED_DEAD ? -1 : 0;
}

void tl_tls_free(struct tl_conn *c)
{
	struct tl_tls *t = c->tls;
	if (!t)
		return;
	tl_tls_rxp_drop(t->l, t);
	tl_tls_rec_stop(t);
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
