/* tls.h - the TLS transport (tls.c): a custom BIO reads ciphertext from
 * the connection's slot queue and writes into its out buffer; plaintext
 * goes to tl_conn_feed. BoringSSL or OpenSSL 3. */
#ifndef TALARIS_TLS_H
#define TALARIS_TLS_H

#include <stddef.h>
#include <stdint.h>

struct tl_loop;
struct tl_conn;

/* tl_tls_shared is tls.c's state shared by every connection of a loop. */
struct tl_tls_shared {
	void *ctx_default;      /* SSL_CTX for the system store, made on first use */
	void *sess_cache;       /* tls_verify.c: client TLS sessions, made on first use */
};

/* tl_tls_start creates c's SSL (verification per its dial parameters) and
 * sends the ClientHello. Returns 0, or -1 after failing c. */
int tl_tls_start(struct tl_loop *l, struct tl_conn *c);

/* tl_tls_drive runs the handshake, then decrypts queued ciphertext and
 * feeds the plaintext to the parser. Returns TL_FEED_OK, TL_FEED_STALL
 * (plaintext kept for later) or TL_FEED_DEAD (c failed). */
int tl_tls_drive(struct tl_loop *l, struct tl_conn *c);

/* tl_tls_write encrypts p[0..n) into c's out buffer. Returns 0, or -1
 * (handshake not done, or a TLS error: c is failed). */
int tl_tls_write(struct tl_loop *l, struct tl_conn *c, const uint8_t *p, size_t n);

/* tl_tls_close_notify queues c's TLS close_notify alert in its out buffer
 * (once the handshake is done; later calls do nothing). The caller sends
 * it. */
void tl_tls_close_notify(struct tl_conn *c);

/* tl_tls_free releases c's TLS state (no-op without one). */
void tl_tls_free(struct tl_conn *c);

/* tl_tls_shared_free releases ts's shared SSL_CTX and session cache. */
void tl_tls_shared_free(struct tl_tls_shared *ts);

#endif
