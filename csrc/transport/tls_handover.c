/* transport/tls_handover.c - handing a connection's reading over from the
 * library's SSL_read to our own TLS 1.3 record layer (transport/tlsrec.c):
 * whether it may, following the library's records until it can, and
 * giving up for good. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "transport/internal.h"

#include <stdlib.h>

/* rec_scratch_free wipes and frees the shadow's scratch buffer: it held
 * the plaintext of the records the library read before the hand-over. */
static void rec_scratch_free(struct tl_tls *t)
{
	if (t->scratch)
		OPENSSL_cleanse(t->scratch, TL_REC_SCRATCH);
	free(t->scratch);
	t->scratch = NULL;
}

/* tl_tls_rec_stop keeps the connection on SSL_read for good: the secret and
 * keys are wiped. */
void tl_tls_rec_stop(struct tl_tls *t)
{
	t->rec_track = 0;
	tl_tlsrec_free(&t->rec);
	rec_scratch_free(t);
}

/* tl_tls_rec_setup decides, once the handshake is done, whether our record
 * layer may take the connection over: TLS 1.3 with an AES-GCM suite, the
 * server's secret captured, and nothing of the server's stream buffered
 * in the library (SSL_has_pending; neither library reads ahead in TLS, so
 * the server's Finished was the last record it read and the next byte in
 * the slots starts the first record under the application keys).
 * Anything else (TLS 1.2, ChaCha20) stays on SSL_read, the secret wiped.
 * The library keeps reading until its first application data (tl_tls_rec_try):
 * the NewSessionTickets servers send first go to it, so session
 * resumption works as before; meanwhile rec follows each record it reads
 * (tl_tlsrec_shadow), so it knows the sequence number and any KeyUpdate. */
void tl_tls_rec_setup(struct tl_tls *t)
{
	const SSL_CIPHER *ci = SSL_get_current_cipher(t->ssl);
	uint16_t id = ci ? SSL_CIPHER_get_protocol_id(ci) : 0;

	t->rec.lib_gcm = t->rec_want == TL_TLSREC_LIB_GCM;
	t->rec_track = t->rec_want && SSL_version(t->ssl) == TLS1_3_VERSION && !SSL_has_pending(t->ssl) &&
		       (t->scratch = malloc(TL_REC_SCRATCH)) != NULL && tl_tlsrec_start(&t->rec, id, 0) == 0;
	t->rec_want = 0;
	if (!t->rec_track)
		tl_tls_rec_stop(t);
}

/* tl_tls_rec_try hands the connection to our record layer after SSL_read
 * returned application data, once the library stands between two
 * records: rec, which followed every byte it read, is at a record
 * boundary, and the library holds nothing (SSL_has_pending). BoringSSL's
 * own sequence number (SSL_get_read_sequence) must agree with rec's;
 * OpenSSL 3 has no such call. Not at a boundary yet: tried again after
 * the next SSL_read. */
void tl_tls_rec_try(struct tl_tls *t)
{
	if (!tl_tlsrec_boundary(&t->rec) || SSL_has_pending(t->ssl))
		return;
#ifdef OPENSSL_IS_BORINGSSL
	if (SSL_get_read_sequence(t->ssl) != t->rec.seq) {
		tl_tls_rec_stop(t);
		return;
	}
#endif
	t->rec_track = 0;
	t->rec_on = 1;
	rec_scratch_free(t);
}
