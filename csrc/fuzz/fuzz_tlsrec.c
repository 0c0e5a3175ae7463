/* fuzz_tlsrec.c - our TLS 1.3 record layer (tlsrec.c) against records
 * sealed with a fixed key, so the fuzzer reaches past the tag: inner
 * types, padding, lengths, post-handshake message streams, KeyUpdate
 * (the harness follows the receiver's rekeying), alerts, and bytes cut
 * at fuzzer-chosen points, fed as the library's reads are
 * (tl_tlsrec_shadow into a scratch buffer of exactly TL_REC_SCRATCH
 * bytes, so ASan sees any write past the room and the tail).
 *
 * Input: records, each [flags][cut][len_hi][len_lo][len bytes]:
 *   flags bits 0-1: inner type 23, 22, 21, or the first content byte
 *                   (0: all padding, other types);
 *   flags bit 2:    a raw record: the bytes go unsealed (any header);
 *   flags bit 3:    one ciphertext bit flipped (the tag must fail);
 *   flags bits 4-7: padding zeros, times 64 (0..960: after a content
 *                   near 2^14, the record is too long);
 *   cut:            the record is fed in pieces of cut bytes (0: whole).
 * Checked: a sealed legal application-data record between records opens
 * (an empty one only below the cap on empty records in a row);
 * a sealed record the harness flipped a bit of ends the stream
 * (unless the layer was mid-record from a raw one, and so never took it);
 * the layer never reads or writes out of bounds (sanitizers). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "transport/tlsrec.h"

/* SHA-256 suite secret of the keylog line the layer starts from. */
static const char line[] = "SERVER_TRAFFIC_SECRET_0 00 "
			   "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

/* The sealing side: its own secret, key, iv and sequence number. */
static uint8_t secret[32], key[16], iv[12];
static uint64_t seq;

/* expand is HKDF-Expand-Label(s, label, "", n), n <= 32 (tlsrec.c's is
 * private to it; this one is written from RFC 8446 7.1 again). */
static void expand(const uint8_t *s, const char *label, uint8_t *out, size_t n)
{
	uint8_t info[64], md[EVP_MAX_MD_SIZE];
	size_t ll = strlen(label), k = 0;
	unsigned int mdlen = 0;

	info[k++] = 0;
	info[k++] = (uint8_t)n;
	info[k++] = (uint8_t)(6 + ll);
	memcpy(info + k, "tls13 ", 6);
	k += 6;
	memcpy(info + k, label, ll);
	k += ll;
	info[k++] = 0;
	info[k++] = 1;
	if (!HMAC(EVP_sha256(), s, 32, info, k, md, &mdlen))
		abort();
	memcpy(out, md, n);
}

static void rekey(void)
{
	expand(secret, "key", key, sizeof(key));
	expand(secret, "iv", iv, sizeof(iv));
}

/* seal writes the record of inner plaintext in (n bytes) at out: header,
 * ciphertext, tag. Returns its length. */
static size_t seal(const uint8_t *in, size_t n, uint8_t *out)
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	uint8_t nonce[12];
	int outl = 0;

	memcpy(nonce, iv, sizeof(nonce));
	for (int i = 0; i < 8; i++)
		nonce[11 - i] ^= (uint8_t)(seq >> (8 * i));
	seq++;
	out[0] = 23;
	out[1] = 3;
	out[2] = 3;
	out[3] = (uint8_t)((n + 16) >> 8);
	out[4] = (uint8_t)(n + 16);
	if (!ctx || EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), NULL, key, nonce) != 1 ||
	    EVP_EncryptUpdate(ctx, NULL, &outl, out, 5) != 1 || EVP_EncryptUpdate(ctx, out + 5, &outl, in, (int)n) != 1 ||
	    EVP_EncryptFinal_ex(ctx, out + 5 + n, &outl) != 1 ||
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, out + 5 + n) != 1)
		abort();
	EVP_CIPHER_CTX_free(ctx);
	return 5 + n + 16;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct tl_tlsrec r;
	static uint8_t inner[(1u << 14) + 1024 + 2], rec[sizeof(inner) + 5 + 16];
	uint8_t *scratch = malloc(TL_REC_SCRATCH);
	size_t at = 0;

	memset(&r, 0, sizeof(r));
	if (!scratch || tl_tlsrec_keylog(&r, line) != 1 || tl_tlsrec_start(&r, TL_TLS_AES_128_GCM_SHA256, 0) != 0)
		abort();
	memcpy(secret, r.secret, sizeof(secret));
	rekey();
	seq = 0;
	while (size - at >= 4) {
		uint8_t flags = data[at], cut = data[at + 1];
		size_t len = (size_t)data[at + 2] << 8 | data[at + 3], n, pad = (size_t)(flags >> 4) * 64;
		const uint8_t *p;
		int rc = 0, must_open;

		at += 4;
		if (len > size - at)
			len = size - at;
		/* A sealed, untouched application-data record of legal size,
		 * taken between records and outside a handshake message, must
		 * open (after KeyUpdates too: the harness follows them). */
		must_open = !(flags & 0xc) && (flags & 3) == 0 && tl_tlsrec_boundary(&r) && !r.hs_have && !r.hs_left &&
				(len < (1u << 14) ? len : (1u << 14)) + 1 + pad <= (1u << 14) + 1 &&
				(len > 0 || r.empty_records < TL_REC_MAX_EMPTY); /* one empty past the cap is refused */
		if (flags & 4) {
			n = len < sizeof(rec) ? len : sizeof(rec);
			memcpy(rec, data + at, n);
		} else {
			size_t k = len < (1u << 14) ? len : (1u << 14);
			static const uint8_t types[3] = {23, 22, 21};
			memcpy(inner, data + at, k);
			if ((flags & 3) < 3)
				inner[k++] = types[flags & 3];
			memset(inner + k, 0, pad);
			n = seal(inner, k + pad, rec);
			if (flags & 8)
				rec[5 + (len % (n - 5))] ^= 1;
		}
		at += len;
		p = rec;
		while (n > 0 && rc == 0) {
			size_t k = cut && cut < n ? cut : n;
			rc = tl_tlsrec_shadow(&r, p, k, scratch);
			p += k;
			n -= k;
		}
		if (rc < 0 && must_open)
			abort();
		if (rc < 0)
			break;
		if ((flags & 0xc) == 8 && tl_tlsrec_boundary(&r))
			abort(); /* a sealed record with a flipped bit was taken */
		/* Follow the receiver: a KeyUpdate it took reset its sequence. */
		if (!(flags & 4) && tl_tlsrec_boundary(&r) && r.seq == 0) {
			uint8_t next[32];
			expand(secret, "traffic upd", next, sizeof(next));
			memcpy(secret, next, sizeof(secret));
			rekey();
			seq = 0;
		}
	}
	tl_tlsrec_free(&r);
	free(scratch);
	return 0;
}
