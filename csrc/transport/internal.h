/* transport/internal.h - what the files of the TLS transport (tls.c,
 * tls_bio.c, tls_read.c, tls_send.c, tls_handover.c) share among
 * themselves: a connection's TLS state (struct tl_tls), sizes, and the
 * functions one of them calls in another. Includes the TLS library's
 * headers; nothing outside transport/ includes it. */
#ifndef TALARIS_TRANSPORT_INTERNAL_H
#define TALARIS_TRANSPORT_INTERNAL_H

#include "base/slots.h"
#include "loop/state.h"
#include "transport/tls.h"
#include "transport/tlsrec.h"

#include <openssl/bio.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdint.h>

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
	uint8_t ended;     /* the server's close_notify came: nothing after it is read (stream_ended) */
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

/* key_update_queued says whether a KeyUpdate of ours waits in the library
 * for the next write. OpenSSL 3 refuses SSL_key_update (and SSL_shutdown)
 * while one does: the queued one puts the connection back "in init" until
 * a write sends it. BoringSSL has no getter, and needs none: a second
 * SSL_key_update while one is pending adds nothing and succeeds. */
static inline int key_update_queued(SSL *ssl)
{
#ifdef OPENSSL_IS_BORINGSSL
	(void)ssl;
	return 0;
#else
	return SSL_get_key_update_type(ssl) != SSL_KEY_UPDATE_NONE;
#endif
}

/* tls_bio.c: the slot BIO's method, made once (pthread_once). */
extern BIO_METHOD *tl_tls_slot_method;
extern pthread_once_t tl_tls_slot_method_once;
void tl_tls_make_slot_method(void);

/* tls_send.c: failure and its alert. */
void tl_tls_send_alert_now(struct tl_conn *c);
void tl_tls_fail(struct tl_loop *l, struct tl_conn *c, int cause, const char *what);
/* tl_tls_rec_alert has the library send the fatal alert a failure of our
 * record layer calls for (tl_tlsrec.alert; RFC 8446 5.2, 6.2): the write
 * side and its keys are the library's. Nothing for TL_REC_ALERT_NONE or
 * after our close_notify. BoringSSL sends it as named
 * (SSL_send_fatal_alert). OpenSSL 3 has no such call: its own reader is
 * handed a record it refuses with the same alert, record_overflow or
 * bad_record_mac, or unexpected_message for every other failure. The
 * alert lands in the out buffer, which tl_tls_fail then sends. */
void tl_tls_rec_alert(struct tl_tls *t, uint8_t alert);

/* tls_handover.c: our record layer taking over. */
void tl_tls_rec_stop(struct tl_tls *t);
void tl_tls_rec_setup(struct tl_tls *t);
void tl_tls_rec_try(struct tl_tls *t);

/* tls_read.c: the plaintext run's slot. */
void tl_tls_rxp_drop(struct tl_loop *l, struct tl_tls *t);

#endif
