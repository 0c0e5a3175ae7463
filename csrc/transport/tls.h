/* transport/tls.h - the TLS (wss://) transport (tls*.c), the same shape as the plain
 * one (plain.h): a custom BIO reads ciphertext from the connection's slot
 * queue (tl_rxq) and writes into its out buffer; plaintext goes to
 * tl_conn_feed; frames ws/ put in the plaintext buffer are encrypted
 * by tl_tls_seal when the loop flushes. BoringSSL or OpenSSL 3. */
#ifndef TALARIS_TLS_H
#define TALARIS_TLS_H

#include <stddef.h>
#include <stdint.h>

struct tl_loop;
struct tl_conn;

/* tl_tls_shared is the TLS transport's state shared by every connection of a loop. */
struct tl_tls_shared {
	void *ctx_default;      /* SSL_CTX for the system store, made on first use */
	void *sess_cache;       /* tls_verify.c: client TLS sessions, made on first use */
};

/* tl_tls_start creates c's SSL (verification per its dial parameters) and
 * sends the ClientHello. Returns 0, or -1 after failing c. */
int tl_tls_start(struct tl_loop *l, struct tl_conn *c);

/* tl_tls_drive runs the handshake (then writes the upgrade request),
 * then decrypts queued ciphertext and feeds the plaintext to the parser.
 * Returns TL_FEED_OK, TL_FEED_STALL (plaintext kept for later) or
 * TL_FEED_DEAD (c failed or is ending); requests for the loop are left in
 * c->todo. A pending EOF and the flush are the caller's. */
int tl_tls_drive(struct tl_loop *l, struct tl_conn *c);

/* tl_tls_seal encrypts c's framed plaintext (c->tx_pt) into its
 * collecting out buffer, moving the frames' send units and reply bytes
 * with it. Returns 0, or -1 after failing c (a TLS error; the plaintext's
 * units are retired). */
int tl_tls_seal(struct tl_loop *l, struct tl_conn *c);

/* tl_tls_close_notify queues c's TLS close_notify alert in its out buffer
 * after the frames waiting in its plaintext buffer (once the handshake is
 * done; later calls do nothing). The caller sends it. */
void tl_tls_close_notify(struct tl_conn *c);

/* tl_tls_free releases c's TLS state (no-op without one). */
void tl_tls_free(struct tl_conn *c);

/* tl_tls_shared_free releases ts's shared SSL_CTX and session cache. */
void tl_tls_shared_free(struct tl_tls_shared *ts);

#endif
