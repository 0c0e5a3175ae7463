/* transport/tls_read.c - the TLS read side (tl_tls_drive): the handshake
 * (then the upgrade request), decrypting into plaintext runs (a plaintext
 * slot the parser reads in place, or the connection's own buffer), feeding
 * them to the frame parser, the server's close_notify, and a failed
 * handshake turned into the cause users act on. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "transport/internal.h"
#include "base/sample.h"
#include "transport/tls_verify.h"

#include <openssl/err.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

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

/* read_truncated says whether SSL_read's failure e is the transport's end
 * without a close_notify: BoringSSL reports it as SSL_ERROR_SYSCALL,
 * OpenSSL 3 as SSL_ERROR_SSL with "unexpected eof while reading". Any
 * other SSL_ERROR_SSL is a record the library refused (it sent the alert). */
static int read_truncated(int e)
{
	if (e != SSL_ERROR_SSL)
		return 1;
#ifdef SSL_R_UNEXPECTED_EOF_WHILE_READING
	return ERR_GET_REASON(ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING;
#else
	return 0;
#endif
}

/* tl_tls_rxp_drop gives up t's plaintext slot: back to the free stack, or deferred
 * while an event Go has not passed points into it (tl_slots_release). */
void tl_tls_rxp_drop(struct tl_loop *l, struct tl_tls *t)
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
		tl_tls_rxp_drop(l, t);
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
	tl_tls_rxp_drop(l, t);
	t->pq = q;
	t->pt_off = 0;
	t->pt_len = n;
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
		tl_tls_fail(l, c, cause, what);
		return -2;
	}
	SSL_get0_alpn_selected(t->ssl, &sel, &sel_len);
	if (sel_len && (sel_len != 8 || memcmp(sel, "http/1.1", 8) != 0)) {
		tl_tls_fail(l, c, TL_TLS_ALPN, "server selected an ALPN protocol other than http/1.1");
		return -2;
	}
	{
		int cause;
		const char *what;
		if (tl_tlsv_handshake_done(l, c, t->ssl, &cause, &what) < 0) {
			tl_tls_fail(l, c, cause, what);
			return -2;
		}
	}
	t->handshake_done = 1;
	tl_tls_rec_setup(t);
	if (tl_conn_start_upgrade(l, c) < 0)
		return -2;
	return 1;
}

/* stream_ended drops what is queued behind the end of the server's TLS
 * stream: after close_notify nothing more is read (RFC 8446 6.1), so the
 * queue would never drain and the EOF path (which waits for it) never
 * run. Bytes that still arrive are dropped by the next drive. */
static void stream_ended(struct tl_loop *l, struct tl_conn *c, struct tl_tls *t)
{
	t->ended = 1;
	tl_rxq_drain(&l->slots, &c->rxq, l->evq.head_cache);
}

/* peer_closed handles the server's close_notify: the TLS stream ended
 * cleanly. What that means for the WebSocket is decided like a TCP EOF.
 * Answer with ours and our FIN now (the teardown that follows closes the
 * socket without waiting for a send). */
static void peer_closed(struct tl_loop *l, struct tl_conn *c)
{
	stream_ended(l, c, c->tls);
	c->eof = 1;
	if (c->shut_wr == TL_SHUT_NONE && !(c->todo & TL_DO_SHUT_WR) && c->fd >= 0) {
		tl_tls_close_notify(c);
		tl_tls_send_alert_now(c);
		if (!c->send_inflight) {
			shutdown(c->fd, SHUT_WR);
			tl_conn_shut_set(c, TL_SHUT_DONE);
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
			tl_tls_fail(l, c, TL_TLS_GENERIC, "cannot send our KeyUpdate");
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
		peer_closed(l, c);
		return 0;
	default:
		/* A failure, after the WebSocket close too: a record that does
		 * not open is no end of stream, whenever it comes. The server
		 * learns why (the alert), then the connection fails. */
		t->rec_end = 1;
		tl_tls_rec_alert(t, t->rec.alert);
		tl_tls_fail(l, c, TL_TLS_GENERIC, t->rec.err);
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
	if (t->ended) {
		stream_ended(l, c, t); /* bytes after close_notify: dropped */
		return TL_FEED_OK;
	}
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
				tl_tls_rec_try(t);
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
				peer_closed(l, c);
				break;
			}
			if ((c->eof || tl_conn_close_rcvd(c)) && read_truncated(e)) {
				/* Transport EOF without close_notify: report it through
				 * the EOF path, on both backends the same way. After the
				 * close frame the stream may end so too. A record that
				 * does not open is a failure whenever it comes, a FIN
				 * behind it or not (below: the library has sent its
				 * alert). */
				ERR_clear_error();
				if (!c->eof)
					peer_closed(l, c);
				break;
			}
			tl_tls_fail(l, c, TL_TLS_GENERIC, NULL);
			return TL_FEED_DEAD;
		}
	}
	if (t->consumed && !tl_conn_ending(c) && !tl_conn_close_sent(c)) {
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
