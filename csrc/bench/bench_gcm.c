/* bench_gcm.c - AES-128-GCM decryption of full TLS records (16385 bytes of
 * ciphertext, the 5-byte header as additional data, the tag checked):
 * our VAES/VPCLMULQDQ code (gcm.c) against the library's EVP, each on the
 * same 1 MiB of records, best of 201 passes, in cycles-free units (ns per
 * byte and per 256 B frame as the wss bench sends them, 258 bytes with
 * the header). Single thread, warm caches: the per-byte cost of the
 * cipher alone, which the loop pays per record. A third row feeds our
 * code each record in two pieces, as a receive slot boundary cuts it in
 * the loop (a record is 16406 bytes on the wire, a slot 16 KiB, so nearly
 * every one straddles two): the cuts are fixed points spread over the
 * record and over the offsets within a 256-byte step, and the blocks
 * after each piece's last step, and the block split between the pieces,
 * take the tail path (gcm_tail). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>

#include "../gcm.h"

#define REC 16385
#define NREC 16

static uint64_t now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint8_t ct[NREC][REC], tags[NREC][16], out[REC];

int main(void)
{
	uint8_t key[16], nonce[12], hdr[5] = {23, 3, 3, 0x40, 0x11};
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	struct tl_gcm *g = tl_gcm_new();
	double best_evp = 1e18, best_own = 1e18, best_split = 1e18;
	int outl;

	for (size_t i = 0; i < sizeof(key); i++)
		key[i] = (uint8_t)(i * 7 + 1);
	memset(nonce, 0x5a, sizeof(nonce));
	for (int r = 0; r < NREC; r++) {
		for (int i = 0; i < REC; i++)
			out[i] = (uint8_t)(i * 31 + r);
		nonce[11] = (uint8_t)r;
		EVP_EncryptInit_ex(ctx, EVP_aes_128_gcm(), NULL, key, nonce);
		EVP_EncryptUpdate(ctx, NULL, &outl, hdr, 5);
		EVP_EncryptUpdate(ctx, ct[r], &outl, out, REC);
		EVP_EncryptFinal_ex(ctx, out, &outl);
		EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, tags[r]);
	}
	EVP_DecryptInit_ex(ctx, EVP_aes_128_gcm(), NULL, key, NULL);
	if (g && tl_gcm_setkey(g, key, 16) != 0)
		return 1;
	for (int pass = 0; pass < 201; pass++) {
		uint64_t t0 = now();
		for (int r = 0; r < NREC; r++) {
			nonce[11] = (uint8_t)r;
			EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, nonce);
			EVP_DecryptUpdate(ctx, NULL, &outl, hdr, 5);
			EVP_DecryptUpdate(ctx, out, &outl, ct[r], REC);
			EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, 16, tags[r]);
			if (EVP_DecryptFinal_ex(ctx, out, &outl) != 1)
				return 1;
		}
		uint64_t t1 = now();
		if (g) {
			for (int r = 0; r < NREC; r++) {
				nonce[11] = (uint8_t)r;
				tl_gcm_begin(g, nonce, hdr, 5);
				tl_gcm_decrypt(g, ct[r], out, REC);
				if (tl_gcm_finish(g, tags[r]) != 0)
					return 1;
			}
		}
		uint64_t t2 = now();
		if (g) {
			for (int r = 0; r < NREC; r++) {
				/* The same cuts every pass, spread over the record and
				 * over the offsets within a 256-byte step. */
				size_t cut = (size_t)(1 + (r * 4099 + 4000) % (REC - 1));
				nonce[11] = (uint8_t)r;
				tl_gcm_begin(g, nonce, hdr, 5);
				tl_gcm_decrypt(g, ct[r], out, cut);
				tl_gcm_decrypt(g, ct[r] + cut, out + cut, REC - cut);
				if (tl_gcm_finish(g, tags[r]) != 0)
					return 1;
			}
		}
		uint64_t t3 = now();
		if ((double)(t3 - t2) < best_split)
			best_split = (double)(t3 - t2);
		if ((double)(t1 - t0) < best_evp)
			best_evp = (double)(t1 - t0);
		if ((double)(t2 - t1) < best_own)
			best_own = (double)(t2 - t1);
	}
	best_evp /= (double)NREC * REC;
	best_own /= (double)NREC * REC;
	best_split /= (double)NREC * REC;
	printf("bench_gcm: AES-128-GCM open, 16385-byte records: library EVP %.3f ns/B (%.1f ns per 258 B frame)\n",
	       best_evp, best_evp * 258);
	if (g) {
		printf("bench_gcm: talaris gcm.c %.3f ns/B (%.1f ns per 258 B frame), %.2fx the library's speed\n",
		       best_own, best_own * 258, best_evp / best_own);
		printf("bench_gcm: talaris gcm.c, each record in two pieces (a slot boundary) %.3f ns/B (%.1f ns per 258 B frame)\n",
		       best_split, best_split * 258);
	} else
		printf("bench_gcm: no VAES/VPCLMULQDQ on this CPU\n");
	tl_gcm_free(g);
	EVP_CIPHER_CTX_free(ctx);
	return 0;
}
