/* transport/tlsrec.c - our own TLS 1.3 receive record layer (see tlsrec.h): RFC 8446
 * sections 5.2-5.4 (records, nonce, padding), 7.1-7.3 (key schedule) and
 * 4.6.3 (KeyUpdate), with the library's libcrypto (HMAC, and EVP AES-GCM
 * where gcm.h does not run).
 * Every check fails closed: an error ends the connection and nothing of
 * the record it is in is reported. Calls slots.h and gcm.h only. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "transport/tlsrec.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <string.h>

#define TLREC_HDR 5
#define TLREC_TAG 16
#define TLREC_MAX_INNER ((1u << 14) + 1) /* TLSInnerPlaintext limit (5.4) */
#define TLREC_MAX_CONTENT (1u << 14)     /* TLSPlaintext limit (5.1) */
#define TLREC_HS_NEW_SESSION_TICKET 4
#define TLREC_HS_KEY_UPDATE 24
#define TLREC_USER_CANCELED 90

static int rec_unhex(int ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	if (ch >= 'a' && ch <= 'f')
		return ch - 'a' + 10;
	if (ch >= 'A' && ch <= 'F')
		return ch - 'A' + 10;
	return -1;
}

int tl_tlsrec_keylog(struct tl_tlsrec *r, const char *line)
{
	static const char label[] = "SERVER_TRAFFIC_SECRET_0 ";
	const char *p;
	size_t hexlen;

	if (strncmp(line, label, sizeof(label) - 1) != 0)
		return 0;
	/* Skip the client random: the callback is per SSL, so it is ours. */
	p = strchr(line + sizeof(label) - 1, ' ');
	if (!p)
		return 0;
	p++;
	hexlen = strlen(p);
	while (hexlen && (p[hexlen - 1] == '\n' || p[hexlen - 1] == '\r'))
		hexlen--;
	/* SHA-256 or SHA-384 suites: 32 or 48 bytes; anything else is a
	 * suite we do not open (tl_tlsrec_start checks the length again). */
	if (hexlen != 64 && hexlen != 96)
		return 0;
	for (size_t i = 0; i < hexlen / 2; i++) {
		int hi = rec_unhex(p[2 * i]), lo = rec_unhex(p[2 * i + 1]);
		if (hi < 0 || lo < 0) {
			OPENSSL_cleanse(r->secret, sizeof(r->secret));
			r->secret_len = 0;
			return 0;
		}
		r->secret[i] = (uint8_t)(hi << 4 | lo);
	}
	r->secret_len = (uint32_t)(hexlen / 2);
	return 1;
}

/* rec_expand_label is HKDF-Expand-Label(secret, label, "", len) (7.1) for len at
 * most one hash block, which every use here is (key 16/32, iv 12, the next
 * secret one hash length): T(1) = HMAC(secret, HkdfLabel || 0x01).
 * Returns 0 or -1. */
static int rec_expand_label(const struct tl_tlsrec *r, const uint8_t *secret, const char *label, uint8_t *out, size_t len)
{
	uint8_t info[2 + 1 + 6 + 16 + 1 + 1], md[EVP_MAX_MD_SIZE];
	size_t ll = strlen(label), k = 0;
	unsigned int mdlen = 0;
	int ok;

	if (ll > 16 || len > (size_t)EVP_MD_size(r->md))
		return -1;
	info[k++] = (uint8_t)(len >> 8);
	info[k++] = (uint8_t)len;
	info[k++] = (uint8_t)(6 + ll);
	memcpy(info + k, "tls13 ", 6);
	k += 6;
	memcpy(info + k, label, ll);
	k += ll;
	info[k++] = 0; /* empty context */
	info[k++] = 1; /* the block counter */
	ok = HMAC(r->md, secret, r->secret_len, info, k, md, &mdlen) != NULL && mdlen >= len;
	if (ok)
		memcpy(out, md, len);
	OPENSSL_cleanse(md, sizeof(md));
	return ok ? 0 : -1;
}

/* rec_set_keys derives the key and iv of r->secret (7.3) and keys the
 * cipher context with the key. Returns 0 or -1. */
static int rec_set_keys(struct tl_tlsrec *r)
{
	uint8_t key[32];
	int klen = EVP_CIPHER_CTX_key_length(r->ctx), rc = -1;

	if (klen <= 0 || (size_t)klen > sizeof(key))
		return -1;
	if (rec_expand_label(r, r->secret, "key", key, (size_t)klen) == 0 &&
	    rec_expand_label(r, r->secret, "iv", r->iv, sizeof(r->iv)) == 0 &&
	    EVP_DecryptInit_ex(r->ctx, NULL, NULL, key, NULL) == 1 &&
	    (!r->gcm || tl_gcm_setkey(r->gcm, key, (size_t)klen) == 0))
		rc = 0;
	OPENSSL_cleanse(key, sizeof(key));
	return rc;
}

int tl_tlsrec_start(struct tl_tlsrec *r, uint16_t suite, uint64_t seq)
{
	const EVP_CIPHER *cipher;
	EVP_CIPHER_CTX *ctx;

	switch (suite) {
	case TL_TLS_AES_128_GCM_SHA256:
		cipher = EVP_aes_128_gcm();
		r->md = EVP_sha256();
		break;
	case TL_TLS_AES_256_GCM_SHA384:
		cipher = EVP_aes_256_gcm();
		r->md = EVP_sha384();
		break;
	default:
		return -1;
	}
	/* The secret's length is the suite hash's: a mismatch means the line
	 * we kept belongs to another suite than the one negotiated. */
	if (!r->secret_len || r->secret_len != (uint32_t)EVP_MD_size(r->md))
		return -1;
	if (!(ctx = EVP_CIPHER_CTX_new()))
		return -1;
	if (EVP_DecryptInit_ex(ctx, cipher, NULL, NULL, NULL) != 1 ||
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, (int)sizeof(r->iv), NULL) != 1) {
		EVP_CIPHER_CTX_free(ctx);
		return -1;
	}
	r->ctx = ctx;
	/* No gcm state (old CPU, out of memory, lib_gcm): the library opens. */
	r->gcm = r->lib_gcm ? NULL : tl_gcm_new();
	if (rec_set_keys(r) < 0) {
		tl_tlsrec_free(r);
		return -1;
	}
	r->seq = seq;
	r->hdr_have = r->tag_have = 0;
	r->hs_have = 0;
	r->hs_left = 0;
	return 0;
}

void tl_tlsrec_free(struct tl_tlsrec *r)
{
	if (r->ctx)
		EVP_CIPHER_CTX_free(r->ctx); /* both libraries cleanse the key schedule */
	r->ctx = NULL;
	tl_gcm_free(r->gcm); /* wipes it */
	r->gcm = NULL;
	OPENSSL_cleanse(r->secret, sizeof(r->secret));
	OPENSSL_cleanse(r->iv, sizeof(r->iv));
	OPENSSL_cleanse(r->tail, sizeof(r->tail)); /* a byte of plaintext */
	r->secret_len = 0;
}

static int rec_fail(struct tl_tlsrec *r, uint8_t alert, const char *what)
{
	r->alert = alert;
	snprintf(r->err, sizeof(r->err), "TLS record: %s", what);
	return TL_REC_ERR;
}

/* rec_key_update moves to the next server secret (7.2): the old one, its key
 * and iv are gone, the sequence starts again at 0. */
static int rec_key_update(struct tl_tlsrec *r)
{
	uint8_t next[48];
	int rc = rec_expand_label(r, r->secret, "traffic upd", next, r->secret_len);

	if (rc == 0) {
		memcpy(r->secret, next, r->secret_len);
		rc = rec_set_keys(r);
	}
	OPENSSL_cleanse(next, sizeof(next));
	if (rc < 0)
		return rec_fail(r, TL_REC_ALERT_INTERNAL_ERROR, "cannot derive the KeyUpdate keys");
	r->seq = 0;
	return TL_REC_AGAIN;
}

/* rec_handshake walks the post-handshake messages in one verified handshake
 * record (p, n) as a stream continued from the last one: NewSessionTicket
 * is skipped (resumption tickets arrive while the library still reads,
 * see tls.c), KeyUpdate rekeys, anything else (a post-handshake
 * CertificateRequest we never offered, a second Finished) is an error.
 * A message may span records (5.1), a KeyUpdate too: its header may end
 * one record and its body byte come in the next; but the body byte must
 * end its record, as nothing may span the key change it makes. */
static int rec_handshake(struct tl_tlsrec *r, const uint8_t *p, size_t n)
{
	while (n > 0) {
		if (r->hs_have < 4) {
			r->hs_hdr[r->hs_have++] = *p++;
			n--;
			if (r->hs_have < 4)
				continue;
			r->hs_type = r->hs_hdr[0];
			r->hs_left = (uint32_t)r->hs_hdr[1] << 16 | (uint32_t)r->hs_hdr[2] << 8 | r->hs_hdr[3];
			if (r->hs_type == TLREC_HS_KEY_UPDATE && r->hs_left != 1)
				return rec_fail(r, TL_REC_ALERT_DECODE_ERROR, "malformed KeyUpdate");
			if (r->hs_type != TLREC_HS_KEY_UPDATE && r->hs_type != TLREC_HS_NEW_SESSION_TICKET)
				return rec_fail(r, TL_REC_ALERT_UNEXPECTED_MESSAGE, "unexpected post-handshake message");
			if (r->hs_left == 0)
				return rec_fail(r, TL_REC_ALERT_DECODE_ERROR, "empty NewSessionTicket");
			continue;
		}
		if (r->hs_type == TLREC_HS_KEY_UPDATE) {
			int rc;
			if (n != 1)
				return rec_fail(r, TL_REC_ALERT_UNEXPECTED_MESSAGE, "KeyUpdate not at the end of its record");
			if (p[0] > 1)
				return rec_fail(r, TL_REC_ALERT_ILLEGAL_PARAMETER, "KeyUpdate with an unknown request");
			r->hs_have = 0;
			r->hs_left = 0;
			if (++r->key_updates > TL_REC_MAX_KEY_UPDATES)
				return rec_fail(r, TL_REC_ALERT_UNEXPECTED_MESSAGE, "too many KeyUpdates without application data");
			rc = rec_key_update(r);
			if (rc == TL_REC_AGAIN && p[0] == 1)
				rc = TL_REC_KEYREQ; /* update_requested: ours must follow */
			return rc;
		}
		{
			size_t k = n < r->hs_left ? n : r->hs_left;
			p += k;
			n -= k;
			r->hs_left -= (uint32_t)k;
			if (r->hs_left == 0)
				r->hs_have = 0;
		}
	}
	return TL_REC_AGAIN;
}

/* rec_begin_record checks the header just read and sets the cipher up for the
 * record: nonce = iv XOR the 64-bit sequence number, left-padded (5.3);
 * the additional data is the header (5.2). */
static int rec_begin_record(struct tl_tlsrec *r, uint8_t *dst, size_t room)
{
	uint8_t nonce[12];
	uint32_t len = (uint32_t)r->hdr[3] << 8 | r->hdr[4];
	int outl = 0;

	/* Every TLS 1.3 record after the handshake is an encrypted one: outer
	 * type application_data, legacy version 0x0303 (5.1, 5.2). A
	 * change_cipher_spec is only allowed before the server's Finished. */
	if (r->hdr[0] != 23)
		return rec_fail(r, TL_REC_ALERT_UNEXPECTED_MESSAGE, "unexpected record type after the handshake");
	if (r->hdr[1] != 3 || r->hdr[2] != 3)
		return rec_fail(r, TL_REC_ALERT_PROTOCOL_VERSION, "bad record version");
	/* At least the type byte and the tag (shorter cannot authenticate:
	 * bad_record_mac, as BoringSSL); at most the largest inner plaintext
	 * plus the tag (record_overflow: 5.2 and 5.4). */
	if (len < 1 + TLREC_TAG || len > TLREC_MAX_INNER + TLREC_TAG)
		return rec_fail(r, len < 1 + TLREC_TAG ? TL_REC_ALERT_BAD_RECORD_MAC : TL_REC_ALERT_RECORD_OVERFLOW,
				"bad record length");
	/* Never reached with the callers' room (>= 2^14): checked so that a
	 * smaller one cannot write past dst and the tail. */
	if (room + TL_REC_TAIL < len - TLREC_TAG)
		return rec_fail(r, TL_REC_ALERT_INTERNAL_ERROR, "no room for the record");
	/* A sequence number must not wrap (5.3): the server must have rekeyed
	 * long before. */
	if (r->seq == UINT64_MAX)
		return rec_fail(r, TL_REC_ALERT_INTERNAL_ERROR, "sequence number exhausted");
	memcpy(nonce, r->iv, sizeof(nonce));
	for (int i = 0; i < 8; i++)
		nonce[11 - i] ^= (uint8_t)(r->seq >> (8 * i));
	if (r->gcm)
		tl_gcm_begin(r->gcm, nonce, r->hdr, TLREC_HDR);
	else if (EVP_DecryptInit_ex(r->ctx, NULL, NULL, NULL, nonce) != 1 ||
	    EVP_DecryptUpdate(r->ctx, NULL, &outl, r->hdr, TLREC_HDR) != 1)
		return rec_fail(r, TL_REC_ALERT_INTERNAL_ERROR, "cipher setup failed");
	r->ct_len = len - TLREC_TAG;
	r->ct_have = 0;
	r->tag_have = 0;
	r->dst = dst;
	r->room = room;
	return TL_REC_AGAIN;
}

/* rec_decrypt runs the cipher over k ciphertext bytes at p into the record's
 * plaintext (dst, then tail past room). GCM is a stream: one update per
 * piece, whatever the piece boundaries. */
static int rec_decrypt(struct tl_tlsrec *r, const uint8_t *p, size_t k)
{
	while (k > 0) {
		size_t at = r->ct_have, n = k;
		uint8_t *out;
		int outl = 0;
		if (at < r->room) {
			out = r->dst + at;
			if (n > r->room - at)
				n = r->room - at;
		} else {
			out = r->tail + (at - r->room); /* rec_begin_record checked it fits */
		}
		if (r->gcm)
			tl_gcm_decrypt(r->gcm, p, out, n);
		else if (EVP_DecryptUpdate(r->ctx, out, &outl, p, (int)n) != 1 || (size_t)outl != n)
			return -1;
		r->ct_have += (uint32_t)n;
		p += n;
		k -= n;
	}
	return 0;
}

/* rec_wipe clears the plaintext this record wrote (dst, then tail): after a
 * bad tag it is unverified and must not linger in the plaintext slot, and a
 * handshake message's or alert's is nobody's to read once handled. */
static void rec_wipe(struct tl_tlsrec *r)
{
	size_t n = r->ct_have;

	OPENSSL_cleanse(r->dst, n < r->room ? n : r->room);
	if (n > r->room)
		OPENSSL_cleanse(r->tail, n - r->room);
}

/* rec_control handles a verified record that is not application data: its
 * inner type and content length i (the content at dst). Returns what
 * rec_finish returns. */
static int rec_control(struct tl_tlsrec *r, uint8_t type, size_t i)
{
	switch (type) {
	case 22:
		if (i == 0)
			return rec_fail(r, TL_REC_ALERT_UNEXPECTED_MESSAGE, "empty handshake record");
		return rec_handshake(r, r->dst, i);
	case 21:
		/* An alert is two bytes, level and description (6); like any
		 * other record type it must not come inside a handshake message
		 * (5.1): a close_notify there is no clean end. */
		if (r->hs_have || r->hs_left)
			return rec_fail(r, TL_REC_ALERT_UNEXPECTED_MESSAGE, "alert inside a handshake message");
		if (i != 2)
			return rec_fail(r, TL_REC_ALERT_DECODE_ERROR, "malformed alert");
		/* close_notify is a clean end only as the warning it is (BoringSSL
		 * and OpenSSL read a fatal one as a fatal alert). */
		if (r->dst[1] == 0 && r->dst[0] != 1)
			return rec_fail(r, TL_REC_ALERT_NONE, "close_notify at the fatal level");
		if (r->dst[1] == 0)
			return TL_REC_EOF; /* close_notify */
		/* user_canceled as a warning is skipped, as both libraries do in
		 * TLS 1.3 (JDK 11 servers send it before close_notify), but only
		 * a few in a row, as they do: a stream of them is no data. */
		if (r->dst[0] == 1 && r->dst[1] == TLREC_USER_CANCELED) {
			if (++r->user_canceled > TL_REC_MAX_USER_CANCELED)
				return rec_fail(r, TL_REC_ALERT_UNEXPECTED_MESSAGE, "too many user_canceled alerts");
			return TL_REC_AGAIN;
		}
		r->alert = TL_REC_ALERT_NONE; /* the server ended it: nothing goes back */
		snprintf(r->err, sizeof(r->err), "TLS alert %u from the server", r->dst[1]);
		return TL_REC_ERR;
	default:
		return rec_fail(r, TL_REC_ALERT_UNEXPECTED_MESSAGE, "unexpected inner content type");
	}
}

/* rec_finish verifies the tag and reports the verified record by its inner
 * content type (5.4: the last non-zero byte; zeros after it are padding). */
static int rec_finish(struct tl_tlsrec *r, size_t *n)
{
	uint8_t scratch[16];
	int outl = 0;
	size_t i;
	uint8_t type = 0;

	if (r->gcm ? tl_gcm_finish(r->gcm, r->tag) != 0
		   : EVP_CIPHER_CTX_ctrl(r->ctx, EVP_CTRL_GCM_SET_TAG, TLREC_TAG, r->tag) != 1 ||
			     EVP_DecryptFinal_ex(r->ctx, scratch, &outl) != 1) {
		rec_wipe(r);
		return rec_fail(r, TL_REC_ALERT_BAD_RECORD_MAC, "bad record MAC (decryption failed)");
	}
	r->hdr_have = 0;
	r->seq++;
	for (i = r->ct_len; i > 0; i--) {
		size_t at = i - 1;
		type = at < r->room ? r->dst[at] : r->tail[at - r->room];
		if (type != 0)
			break;
	}
	if (i == 0) {
		rec_wipe(r);
		return rec_fail(r, TL_REC_ALERT_UNEXPECTED_MESSAGE, "record without a content type");
	}
	i--; /* content length: the bytes before the type byte, all in dst */
	if (i > TLREC_MAX_CONTENT || i > r->room) {
		rec_wipe(r);
		return rec_fail(r, TL_REC_ALERT_RECORD_OVERFLOW, "record content too long");
	}
	if (type != 23) {
		/* Not the user's: read it, then wipe it (rec_wipe). */
		int rc = rec_control(r, type, i);
		rec_wipe(r);
		return rc;
	}
	if (r->hs_have || r->hs_left)
		return rec_fail(r, TL_REC_ALERT_UNEXPECTED_MESSAGE, "application data inside a handshake message");
	if (i == 0) {
		/* Zero-length data is allowed (5.4), a stream of it is not; nor
		 * does it count as the data that ends a run of user_canceled
		 * alerts or KeyUpdates. */
		if (++r->empty_records > TL_REC_MAX_EMPTY)
			return rec_fail(r, TL_REC_ALERT_UNEXPECTED_MESSAGE, "too many empty records");
		return TL_REC_AGAIN;
	}
	r->user_canceled = 0;
	r->empty_records = 0;
	r->key_updates = 0;
	*n = i;
	return TL_REC_DATA;
}

/* rec_step feeds up to avail ciphertext bytes at p to the record being
 * opened: header, ciphertext (decrypted at dst, room bytes, fixed at the
 * header), tag. *used is how many it took. Returns TL_REC_MORE when it took
 * them all without ending a record, else what the record was (rec_finish)
 * or TL_REC_ERR. */
static int rec_step(struct tl_tlsrec *r, const uint8_t *p, size_t avail, size_t *used, uint8_t *dst, size_t room,
		    size_t *n)
{
	size_t k;

	*used = 0;
	while (avail > 0) {
		if (r->hdr_have < TLREC_HDR) {
			k = TLREC_HDR - r->hdr_have;
			k = k < avail ? k : avail;
			memcpy(r->hdr + r->hdr_have, p, k);
			r->hdr_have = (uint8_t)(r->hdr_have + k);
			*used += k;
			if (r->hdr_have == TLREC_HDR && rec_begin_record(r, dst, room) != TL_REC_AGAIN)
				return TL_REC_ERR;
		} else if (r->ct_have < r->ct_len) {
			k = r->ct_len - r->ct_have;
			k = k < avail ? k : avail;
			if (rec_decrypt(r, p, k) < 0)
				return rec_fail(r, TL_REC_ALERT_INTERNAL_ERROR, "decryption failed");
			*used += k;
		} else {
			k = TLREC_TAG - r->tag_have;
			k = k < avail ? k : avail;
			memcpy(r->tag + r->tag_have, p, k);
			r->tag_have = (uint8_t)(r->tag_have + k);
			*used += k;
			if (r->tag_have == TLREC_TAG)
				return rec_finish(r, n);
		}
		p += k;
		avail -= k;
	}
	return TL_REC_MORE;
}

int tl_tlsrec_open(struct tl_tlsrec *r, struct tl_slots *s, struct tl_rxq *q, uint64_t ev_head, uint8_t *dst,
		   size_t room, size_t *n)
{
	const uint8_t *p;
	size_t avail, used;
	int rc;

	for (;;) {
		if (tl_rxq_peek(s, q, &p, &avail) < 0)
			return TL_REC_MORE;
		rc = rec_step(r, p, avail, &used, dst, room, n);
		/* The ciphertext is decrypted out of the slot: it can go back (an
		 * empty slot, used 0, leaves the queue too). */
		tl_rxq_consume(s, q, used, ev_head);
		if (rc != TL_REC_MORE)
			return rc;
	}
}

int tl_tlsrec_shadow(struct tl_tlsrec *r, const uint8_t *p, size_t n, uint8_t *scratch)
{
	while (n > 0) {
		size_t used, m;
		int rc = rec_step(r, p, n, &used, scratch, TL_REC_SCRATCH, &m);
		p += used;
		n -= used;
		if (rc == TL_REC_ERR || rc == TL_REC_EOF)
			return -1;
	}
	return 0;
}
