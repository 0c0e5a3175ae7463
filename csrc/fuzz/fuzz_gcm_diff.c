/* fuzz_gcm_diff.c - gcm.c against the library's EVP AES-GCM. From the
 * input: a key (16 or 32 bytes), a nonce, AAD of 0..40 bytes, up to 17 KiB
 * of data and up to 8 cut points. Mode 0 seals the data with the library
 * (the correct tag), mode 1 seals and flips a bit of the tag, mode 2 a bit
 * of the ciphertext or AAD, mode 3 takes the data as ciphertext and a tag
 * from the input. gcm.c opens in the pieces the cuts make (as the record
 * layer feeds a record cut across receive slots), alternately in place:
 * the emulated build (gcm_emul.h) on every CPU, the native VAES build too
 * where the CPU has it. The library opens the same message whole. Verdict
 * and plaintext must be the same; a sealed, untampered message must open
 * to the data. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "test/gcm_impls.h"

enum { MAXN = 17 * 1024 };

static struct tl_gcm *gn, *ge;
static EVP_CIPHER_CTX *lib;
static int native_on;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc, (void)argv;
	native_on = tl_gcm_supported();
	gn = native_on ? tl_gcm_new() : NULL;
	ge = tl_gcm_emul_supported() ? tl_gcm_emul_new() : NULL;
	lib = EVP_CIPHER_CTX_new();
	if (!ge || !lib || (native_on && !gn))
		abort();
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t ct[MAXN + 16], want[MAXN], got[MAXN + 1];
	uint8_t key[32] = {0}, nonce[12] = {0}, aad[40] = {0}, tag[16] = {0};
	size_t klen, alen, n, cuts[8];
	int mode, ncut, lv;

	if (size < 4)
		return 0;
	klen = data[0] & 1 ? 32 : 16;
	mode = (data[0] >> 1) & 3;
	ncut = (data[0] >> 3) & 7;
	alen = data[1] % 41;
	data += 2, size -= 2;
#define TAKE(dst, k)                                                    \
	do {                                                            \
		size_t t_ = (k) < size ? (k) : size;                    \
		memcpy(dst, data, t_);                                  \
		data += t_, size -= t_;                                 \
	} while (0)
	TAKE(key, klen);
	TAKE(nonce, 12);
	TAKE(aad, alen);
	if (mode == 3)
		TAKE(tag, 16);
	for (int i = 0; i < ncut; i++) {
		uint8_t c[2] = {0, 0};
		TAKE(c, 2);
		cuts[i] = (size_t)c[0] << 8 | c[1];
	}
	n = size < MAXN ? size : MAXN;
	for (int i = 0; i < ncut; i++)
		cuts[i] = n ? cuts[i] * 67 % (n + 1) : 0; /* spread over the whole message */
	for (int i = 1; i < ncut; i++)
		for (int j = i; j > 0 && cuts[j - 1] > cuts[j]; j--) {
			size_t t = cuts[j];
			cuts[j] = cuts[j - 1];
			cuts[j - 1] = t;
		}
	if (mode == 3) {
		memcpy(ct, data, n);
	} else {
		if (gcm_lib_seal(key, klen, nonce, aad, alen, data, n, ct, tag) != 0)
			abort();
		if (mode == 1)
			tag[n % 16] ^= (uint8_t)(1u << (n % 8));
		else if (mode == 2 && n)
			ct[(n * 31) % n] ^= 0x20;
		else if (mode == 2)
			aad[0] ^= 1, alen = alen ? alen : 1;
	}
	lv = gcm_lib_open(lib, key, klen, nonce, aad, alen, ct, want, n, tag, NULL, 0);
	if (lv == -2 || (mode == 0 && (lv != 0 || memcmp(want, data, n) != 0)) || ((mode == 1 || mode == 2) && lv != -1))
		abort();
	for (int w = 0; w < 2; w++) {
		const struct gcm_impl *im = w ? &gcm_native : &gcm_emul;
		int inplace = (int)(n & 1), v;

		if (w && !native_on)
			continue;
		got[n] = 0xa5;
		if (inplace)
			memcpy(got, ct, n);
		v = gcm_impl_open(im, w ? gn : ge, key, klen, nonce, aad, alen, inplace ? got : ct, got, n, tag, cuts,
				  ncut);
		if (v != lv || got[n] != 0xa5 || (v == 0 && memcmp(got, want, n) != 0))
			abort();
	}
	return 0;
}
