/* bench_gcm.c - AES-128-GCM decryption of TLS records (the 5-byte header
 * as additional data, the tag checked): our VAES/VPCLMULQDQ code (gcm.c)
 * against the library's EVP, each on the same records, best of 201
 * passes. Single thread, warm caches: the cost of the cipher alone, which
 * the loop pays per record.
 *
 * - Full records (16385 bytes of ciphertext, 16 of them: 256 KiB), in ns
 *   per byte and per 256 B frame as the wss bench sends them (258 bytes
 *   with the header).
 * - The same records fed to our code in two pieces, as a receive slot
 *   boundary cuts them in the loop (a record is 16406 bytes on the wire, a
 *   slot 16 KiB, so nearly every one straddles two): the cuts are fixed
 *   points spread over the record and over the offsets within a 256-byte
 *   step, and the blocks after each piece's last step, and the block split
 *   between the pieces, take the tail path (gcm_tail).
 * - Small records: a 64 B order echoed over wss is a record of 67 bytes of
 *   ciphertext (2 B frame header, the payload, the content type byte), all
 *   of it the tail path, plus the per-record setup and tag; ns per record. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>

#include "crypto/gcm.h"

#define REC 16385
#define NREC 16
#define SREC 67
#define NSREC 4096

static uint64_t now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A set of n records of len bytes each, stride bytes apart, record r
 * sealed under the nonce set_nonce gives it. */
struct recs {
	uint8_t *ct, (*tags)[16], *out, hdr[5];
	size_t len, stride;
	int n;
};

static void set_nonce(uint8_t nonce[12], int r)
{
	memset(nonce, 0x5a, 12);
	nonce[10] = (uint8_t)(r >> 8);
	nonce[11] = (uint8_t)r;
}

/* seal fills the records with a pattern and encrypts them in place with
 * the library. */
static void seal(EVP_CIPHER_CTX *ctx, const uint8_t key[16], struct recs *s)
{
	uint8_t nonce[12];
	int outl;

	for (int r = 0; r < s->n; r++) {
		uint8_t *c = s->ct + (size_t)r * s->stride;

		for (size_t i = 0; i < s->len; i++)
			s->out[i] = (uint8_t)(i * 31 + (size_t)r);
		set_nonce(nonce, r);
		EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), NULL, key, nonce);
		EVP_EncryptUpdate(ctx, NULL, &outl, s->hdr, 5);
		EVP_EncryptUpdate(ctx, c, &outl, s->out, (int)s->len);
		EVP_EncryptFinal_ex(ctx, s->out, &outl);
		EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, s->tags[r]);
	}
}

/* open_all opens every record once: with the library's keyed ctx when g
 * is NULL, else with g, whole or (split) in two pieces. Returns the
 * nanoseconds taken, or -1 when a tag fails. */
static double open_all(EVP_CIPHER_CTX *ctx, struct tl_gcm *g, const struct recs *s, int split)
{
	uint8_t nonce[12];
	int outl;
	uint64_t t0 = now();

	for (int r = 0; r < s->n; r++) {
		const uint8_t *c = s->ct + (size_t)r * s->stride;

		set_nonce(nonce, r);
		if (!g) {
			EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, nonce);
			EVP_DecryptUpdate(ctx, NULL, &outl, s->hdr, 5);
			EVP_DecryptUpdate(ctx, s->out, &outl, c, (int)s->len);
			EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, 16, s->tags[r]);
			if (EVP_DecryptFinal_ex(ctx, s->out, &outl) != 1)
				return -1;
			continue;
		}
		size_t cut = split ? (size_t)(1 + ((size_t)r * 4099 + 4000) % (s->len - 1)) : s->len;
		tl_gcm_begin(g, nonce, s->hdr, 5);
		tl_gcm_decrypt(g, c, s->out, cut);
		tl_gcm_decrypt(g, c + cut, s->out + cut, s->len - cut);
		if (tl_gcm_finish(g, s->tags[r]) != 0)
			return -1;
	}
	return (double)(now() - t0);
}

static uint8_t ct[NREC][REC], tags[NREC][16], out[REC];
static uint8_t sct[NSREC][SREC], stags[NSREC][16];

int main(void)
{
	uint8_t key[16];
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	struct tl_gcm *g = tl_gcm_new_unraced();
	struct recs big = {&ct[0][0], tags, out, {23, 3, 3, 0x40, 0x11}, REC, REC, NREC};
	struct recs small = {&sct[0][0], stags, out, {23, 3, 3, 0, SREC + 16}, SREC, SREC, NSREC};
	/* best[set][way]: way 0 the library, 1 ours whole, 2 ours in two pieces. */
	double best[2][3] = {{1e18, 1e18, 1e18}, {1e18, 1e18, 1e18}};
	const struct recs *sets[2] = {&big, &small};

	for (size_t i = 0; i < sizeof(key); i++)
		key[i] = (uint8_t)(i * 7 + 1);
	seal(ctx, key, &big);
	seal(ctx, key, &small);
	EVP_DecryptInit_ex(ctx, EVP_aes_128_gcm(), NULL, key, NULL);
	if (g && tl_gcm_setkey(g, key, 16) != 0)
		return 1;
	for (int pass = 0; pass < 201; pass++) {
		for (int set = 0; set < 2; set++) {
			for (int way = 0; way < (g ? 3 : 1); way++) {
				double t = open_all(ctx, way ? g : NULL, sets[set], way == 2);
				if (t < 0)
					return 1;
				if (t < best[set][way])
					best[set][way] = t;
			}
		}
	}
	for (int way = 0; way < 3; way++) {
		best[0][way] /= (double)NREC * REC;
		best[1][way] /= NSREC;
	}
	printf("bench_gcm: AES-128-GCM open, 16385-byte records: library EVP %.3f ns/B (%.1f ns per 258 B frame)\n",
	       best[0][0], best[0][0] * 258);
	if (g) {
		printf("bench_gcm: talaris gcm.c %.3f ns/B (%.1f ns per 258 B frame), %.2fx the library's speed\n",
		       best[0][1], best[0][1] * 258, best[0][0] / best[0][1]);
		printf("bench_gcm: talaris gcm.c, each record in two pieces (a slot boundary) %.3f ns/B (%.1f ns per 258 B frame)\n",
		       best[0][2], best[0][2] * 258);
		printf("bench_gcm: %d-byte records (a 64 B order over wss): library EVP %.1f ns, talaris gcm.c %.1f ns whole, %.1f ns in two pieces\n",
		       SREC, best[1][0], best[1][1], best[1][2]);
		printf("bench_gcm: the speed race (crypto/gcm.c, run once per process) chose %s\n",
		       tl_gcm_supported() ? "talaris gcm.c" : "the library's AES-GCM");
	} else {
		printf("bench_gcm: no VAES/VPCLMULQDQ on this CPU (or its self-test failed)\n");
	}
	tl_gcm_free(g);
	EVP_CIPHER_CTX_free(ctx);
	return 0;
}
