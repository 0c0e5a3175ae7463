/* transport/tls_send.c - the TLS write side: framed plaintext sealed into
 * records, our close_notify, and a failure's alert sent at once. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "transport/internal.h"
#include "base/pub.h"

#include <openssl/err.h>
#include <sys/socket.h>

/* tl_tls_send_alert_now hands the alert the library just queued (unknown_ca,
 * no_renegotiation, ...) to the socket at once, so the server learns why
 * we leave: teardown shuts the socket down without waiting for a send.
 * Failure path only; skipped when a send is in flight (order matters). */
void tl_tls_send_alert_now(struct tl_conn *c)
{
	struct tl_outbuf *ob = &c->out[c->cur];
	if (c->fd < 0 || c->send_inflight || ob->len == 0)
		return;
	if (send(c->fd, ob->p, ob->len, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
		/* nothing to do: we are leaving anyway */
	}
	ob->len = 0;
}

#ifndef OPENSSL_IS_BORINGSSL
/* Records OpenSSL's own reader refuses with the alert named (RFC 8446
 * 5.1, 5.2): a header past its largest record, a plaintext handshake
 * record after the handshake, a record that cannot open. */
static const uint8_t rec_overflow[] = {23, 3, 3, 0xff, 0xff};
static const uint8_t rec_unexpected[] = {22, 3, 3, 0, 1, 0};
static const uint8_t rec_bad_mac[5 + 17] = {23, 3, 3, 0, 17};
#endif

void tl_tls_rec_alert(struct tl_tls *t, uint8_t alert)
{
	if (alert == TL_REC_ALERT_NONE || t->shutdown_sent)
		return;
#ifdef OPENSSL_IS_BORINGSSL
	SSL_send_fatal_alert(t->ssl, alert);
#else
	{
		const uint8_t *rec = rec_unexpected;
		int len = (int)sizeof(rec_unexpected);
		BIO *slot = SSL_get_rbio(t->ssl), *mem;
		char byte;
		if (alert == TL_REC_ALERT_RECORD_OVERFLOW) {
			rec = rec_overflow;
			len = (int)sizeof(rec_overflow);
		} else if (alert == TL_REC_ALERT_BAD_RECORD_MAC) {
			rec = rec_bad_mac;
			len = (int)sizeof(rec_bad_mac);
		}
		mem = BIO_new_mem_buf(rec, len);
		if (!mem || !BIO_up_ref(slot)) {
			BIO_free(mem);
			ERR_clear_error();
			return;
		}
		/* SSL_set0_rbio frees the reader it replaces: the reference
		 * taken above keeps the slot BIO (still the writer), and goes
		 * back with it afterwards, freeing the memory BIO. */
		SSL_set0_rbio(t->ssl, mem);
		SSL_read(t->ssl, &byte, 1);
		SSL_set0_rbio(t->ssl, slot);
	}
#endif
	ERR_clear_error();
}

void tl_tls_fail(struct tl_loop *l, struct tl_conn *c, int cause, const char *what)
{
	char buf[88];
	unsigned long e = ERR_peek_last_error();
	if (e && !what) {
		ERR_error_string_n(e, buf, sizeof(buf));
		what = buf;
	}
	ERR_clear_error();
	tl_tls_send_alert_now(c);
	tl_conn_fail(l, c, TL_E_TLS, cause, c->state == TL_ST_OPEN ? 1006 : 0, what ? what : "TLS failure");
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

/* pt_drop empties c's plaintext buffer, dropping the send units of its
 * frames (they will never be written: counted as dropped). */
static void pt_drop(struct tl_loop *l, struct tl_conn *c)
{
	struct tl_outbuf *pt = &c->tx_pt;
	uint64_t units = pt->units;

	pt->len = 0;
	pt->units = 0;
	pt->replies = 0;
	tl_pub_tx_drop(l, c, units);
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
			tl_tls_fail(l, c, TL_TLS_GENERIC, NULL);
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
