/* transport/tls_verify.h - per-connection TLS policy (the C side of
 * TLSOptions): SAN-only host check and trust anchors, client certificate,
 * version and cipher choice, public key pins, and the loop's client
 * session cache. The TLS transport (tls.c, tls_read.c) calls these at a
 * few points; everything else about TLS stays in those files.
 *
 * The library types are named by their struct tags (struct ssl_st is SSL,
 * struct ssl_ctx_st is SSL_CTX in BoringSSL and OpenSSL alike) so loop/api.c
 * can include this header for the dial copy without the TLS headers. */
#ifndef TALARIS_TLS_VERIFY_H
#define TALARIS_TLS_VERIFY_H

struct ssl_st;
struct ssl_ctx_st;
struct tl_loop;
struct tl_conn;
struct tl_dial_params;
struct tl_tls_shared;
struct tl_tls_dial;

/* tl_tlsv_dial_copy copies the TLS policy fields of p into a new
 * tl_tls_dial the caller owns (NULL on no memory); tl_tlsv_dial_free
 * releases one, wiping the client key (NULL allowed). */
struct tl_tls_dial *tl_tlsv_dial_copy(const struct tl_dial_params *p);
void tl_tlsv_dial_free(struct tl_tls_dial *x);

/* tl_tlsv_ctx_setup turns on the external client session cache on ctx
 * (sessions are stored by the new-session callback, never by the library). */
void tl_tlsv_ctx_setup(struct ssl_ctx_st *ctx);

/* tl_tlsv_conn_setup applies c's dial policy to ssl before the handshake:
 * host check flags, trust anchors, client certificate, versions, ciphers,
 * the cached session. Returns 0, or -1 with *cause (TL_TLS_*) and *what
 * (NULL: the error queue says) set. What it hangs on ssl is released by
 * tl_tlsv_conn_free. */
int tl_tlsv_conn_setup(struct tl_loop *l, struct tl_conn *c, struct ssl_st *ssl, int *cause, const char **what);

/* tl_tlsv_handshake_done publishes whether the handshake resumed a session
 * (tl_conn_pub.resumed), keeps the current session, and checks the pins.
 * Returns 0, or -1 with *cause (TL_TLS_PIN) and *what set. */
int tl_tlsv_handshake_done(struct tl_loop *l, struct tl_conn *c, struct ssl_st *ssl, int *cause, const char **what);

/* tl_tlsv_conn_free releases what tl_tlsv_conn_setup hung on ssl; call it
 * before SSL_free (NULL ssl allowed). A connection that failed at the TLS
 * layer drops its cached session. */
void tl_tlsv_conn_free(struct tl_loop *l, struct tl_conn *c, struct ssl_st *ssl);

/* tl_tlsv_shared_free releases the session cache in ts (idempotent). */
void tl_tlsv_shared_free(struct tl_tls_shared *ts);

#endif
