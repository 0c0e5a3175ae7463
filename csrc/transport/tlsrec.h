/* transport/tlsrec.h - our own TLS 1.3 receive record layer (tlsrec.c), for
 * AES-128-GCM and AES-256-GCM only. Once the library has finished the
 * handshake, tls.c hands the server's application records to it instead
 * of SSL_read: it decrypts them with the library's libcrypto straight from
 * the receive slots (tl_rxq) into the caller's plaintext buffer - out of
 * place, streaming GCM over every slot a record straddles, so neither the
 * slot BIO's copy into the library's record buffer nor the library's copy
 * out of it is made. Nothing of a record is reported before its tag
 * verifies. Handles what a client may receive after the handshake:
 * application data, NewSessionTicket (skipped), KeyUpdate (the next read
 * secret; an update_requested is reported so the library sends ours),
 * alerts (close_notify reported, a few user_canceled skipped, anything
 * else an error). The write side
 * stays the library's. */
#ifndef TALARIS_TLSREC_H
#define TALARIS_TLSREC_H

#include <stddef.h>
#include <stdint.h>

#include "crypto/gcm.h"
#include "base/slots.h"

/* Suites (IANA numbers) tl_tlsrec_start accepts. */
#define TL_TLS_AES_128_GCM_SHA256 0x1301
#define TL_TLS_AES_256_GCM_SHA384 0x1302

/* Results of tl_tlsrec_open. */
enum {
	TL_REC_DATA = 1,   /* an application-data record: *n plaintext bytes at the buffer */
	TL_REC_AGAIN = 0,  /* a record without application data was handled: call again */
	TL_REC_MORE = -1,  /* the queue ends inside a record: wait for more ciphertext */
	TL_REC_KEYREQ = -2, /* KeyUpdate with update_requested: send ours, then call again */
	TL_REC_EOF = -3,   /* close_notify: the stream ended cleanly */
	TL_REC_ERR = -4,   /* the connection must fail: tl_tlsrec.err says why, tl_tlsrec.alert what to send */
};

/* Alert descriptions (RFC 8446 6) a failure of ours asks to send in
 * tl_tlsrec.alert; TL_REC_ALERT_NONE when the server's own fatal alert
 * ended the stream (nothing is sent back). */
enum {
	TL_REC_ALERT_NONE = 0,
	TL_REC_ALERT_UNEXPECTED_MESSAGE = 10,
	TL_REC_ALERT_BAD_RECORD_MAC = 20,
	TL_REC_ALERT_RECORD_OVERFLOW = 22,
	TL_REC_ALERT_ILLEGAL_PARAMETER = 47,
	TL_REC_ALERT_DECODE_ERROR = 50,
	TL_REC_ALERT_PROTOCOL_VERSION = 70,
	TL_REC_ALERT_INTERNAL_ERROR = 80,
};

/* TL_REC_TAIL is how many bytes of a record's inner plaintext may land
 * past the caller's room (in tl_tlsrec.tail): an inner plaintext is at
 * most 2^14 + 1 bytes (content, type byte, no padding beyond 2^14 + 1 in
 * all), a caller's room at least 2^14, so the type byte of a full record
 * may not fit. */
#define TL_REC_TAIL 1

/* Records that bring the user nothing, in a row, with BoringSSL's limits
 * (kMaxWarningAlerts, kMaxEmptyRecords, kMaxKeyUpdates): a server
 * streaming them keeps the loop decrypting without one byte of data.
 * One past a cap fails the stream. Only application data with content
 * resets the counters, all three (stricter than BoringSSL, which resets
 * each on its own terms). */
#define TL_REC_MAX_USER_CANCELED 4
#define TL_REC_MAX_EMPTY 32
#define TL_REC_MAX_KEY_UPDATES 32

struct tl_tlsrec {
	void *ctx;             /* EVP_CIPHER_CTX, keyed with the current read key */
	struct tl_gcm *gcm;    /* our AES-GCM (gcm.h), keyed the same, or NULL: ctx opens the records */
	uint8_t lib_gcm;       /* set before tl_tlsrec_start: open with the library's AES-GCM even where gcm.h runs */
	const void *md;        /* EVP_MD of the suite's hash (HKDF) */
	uint8_t secret[48];    /* the current server application traffic secret */
	uint32_t secret_len;   /* 0: none captured (the keylog line did not come) */
	uint8_t iv[12];
	uint64_t seq;          /* sequence number of the next record under the current key */
	/* The record being opened: header, then ciphertext, then tag. */
	uint8_t hdr[5];
	uint8_t hdr_have;      /* header bytes read (5: the cipher is set up for it) */
	uint8_t tag_have;
	uint8_t tag[16];
	uint32_t ct_len;       /* ciphertext bytes of this record (length - tag) */
	uint32_t ct_have;      /* ciphertext bytes decrypted */
	uint8_t *dst;          /* where this record's plaintext goes (fixed at its header) */
	size_t room;           /* bytes at dst; the rest goes to tail */
	uint8_t tail[TL_REC_TAIL];
	/* Post-handshake messages are a byte stream across handshake records:
	 * the 4-byte header of the next message, then its body. */
	uint8_t hs_hdr[4];
	uint8_t hs_have;
	uint32_t hs_left;      /* body bytes of the current message still to come */
	uint8_t hs_type;
	uint8_t user_canceled; /* user_canceled alerts skipped since the last application data */
	uint8_t empty_records; /* empty application-data records since the last data */
	uint8_t key_updates;   /* KeyUpdates since the last application data */
	uint8_t alert;         /* after TL_REC_ERR: the alert the failure calls for (TL_REC_ALERT_*) */
	char err[96];
};

/* tl_tlsrec_keylog takes the server's application traffic secret from a
 * keylog line (SSL_CTX_set_keylog_callback's format, "SERVER_TRAFFIC_SECRET_0
 * <client random> <secret>", both libraries); every other line is
 * ignored. Returns 1 when taken, 0 otherwise. */
int tl_tlsrec_keylog(struct tl_tlsrec *r, const char *line);

/* tl_tlsrec_start keys r for suite (TL_TLS_AES_*) from the secret
 * tl_tlsrec_keylog took, with seq the number of application records the
 * library already read under it (0 right after the handshake). Records
 * are opened with gcm.h where the CPU runs it and r->lib_gcm is 0, else
 * with the library's EVP AES-GCM. Returns 0, or -1 (unsupported suite, no
 * or mismatched secret, out of memory: r stays unused, the caller keeps
 * the library's path). */
int tl_tlsrec_start(struct tl_tlsrec *r, uint16_t suite, uint64_t seq);

/* tl_tlsrec_active says whether tl_tlsrec_start succeeded. */
static inline int tl_tlsrec_active(const struct tl_tlsrec *r) { return r->ctx != NULL; }

/* tl_tlsrec_midrecord says whether a record's plaintext is being written
 * at r->dst: the caller must keep that buffer and pass it again. */
static inline int tl_tlsrec_midrecord(const struct tl_tlsrec *r) { return r->hdr_have == 5; }

/* tl_tlsrec_open reads ciphertext from q (consumed slots are released
 * with ev_head) until one record is opened or q ends. A record's plaintext
 * is written at dst (room bytes, at least 2^14; used from the record's
 * header on, so a caller in the middle of a record passes the same). Returns a
 * TL_REC_* value; for TL_REC_DATA *n is the content length at dst, its
 * type byte and padding stripped. After TL_REC_ERR or TL_REC_EOF, r must
 * not be used again. */
int tl_tlsrec_open(struct tl_tlsrec *r, struct tl_slots *s, struct tl_rxq *q, uint64_t ev_head, uint8_t *dst,
		   size_t room, size_t *n);

/* TL_REC_SCRATCH is the size of tl_tlsrec_shadow's scratch buffer (plus
 * TL_REC_TAIL: the records' room). */
#define TL_REC_SCRATCH (1u << 14)

/* tl_tlsrec_shadow follows the n ciphertext bytes at p that the library
 * is reading (before tls.c hands the connection over), opening each record
 * into scratch (TL_REC_SCRATCH bytes), so that r stays in step with the
 * library: same sequence number, same keys after a KeyUpdate, the same
 * position in the stream. Returns 0, or -1 when r cannot follow (a record
 * it cannot open, close_notify, an alert): r must not take over then. */
int tl_tlsrec_shadow(struct tl_tlsrec *r, const uint8_t *p, size_t n, uint8_t *scratch);

/* tl_tlsrec_boundary says whether r stands between two records (nothing
 * of the next one read yet). */
static inline int tl_tlsrec_boundary(const struct tl_tlsrec *r) { return r->hdr_have == 0; }

/* tl_tlsrec_free wipes r's keys and secret and frees its cipher contexts.
 * Safe on a zeroed or already freed r. */
void tl_tlsrec_free(struct tl_tlsrec *r);

#endif
