/* gcm_impls.h - the AES-GCM openers the gcm tests and the differential
 * fuzzer compare: gcm.c as shipped (native VAES/VPCLMULQDQ), gcm.c's
 * emulated test build (gcm_emul.h: tl_gcm_emul_*, any AVX2 CPU) and the
 * library's EVP AES-GCM fed as the record layer feeds it (tlsrec.c:
 * DecryptInit with the nonce, the AAD, one DecryptUpdate per piece,
 * SET_TAG, DecryptFinal). Each opens ct (n bytes) in the pieces that
 * ncut ascending cuts make (a repeated cut is an empty piece), from in to
 * out (in may be out), and returns 0 when the tag verifies, -1 when not. */
#ifndef TALARIS_TEST_GCM_IMPLS_H
#define TALARIS_TEST_GCM_IMPLS_H

#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>

#include "crypto/gcm.h"

int tl_gcm_emul_supported(void);
struct tl_gcm *tl_gcm_emul_new(void);
void tl_gcm_emul_free(struct tl_gcm *g);
int tl_gcm_emul_setkey(struct tl_gcm *g, const uint8_t *key, size_t len);
void tl_gcm_emul_begin(struct tl_gcm *g, const uint8_t nonce[12], const uint8_t *aad, size_t aad_len);
void tl_gcm_emul_decrypt(struct tl_gcm *g, const uint8_t *in, uint8_t *out, size_t n);
int tl_gcm_emul_finish(struct tl_gcm *g, const uint8_t tag[16]);
int tl_gcm_emul_selftest_failed(void);
void tl_gcm_emul_selftest_hook(int spoil_row);

struct gcm_impl {
	const char *name;
	int (*supported)(void);
	struct tl_gcm *(*new_)(void);
	void (*free_)(struct tl_gcm *);
	int (*setkey)(struct tl_gcm *, const uint8_t *, size_t);
	void (*begin)(struct tl_gcm *, const uint8_t *, const uint8_t *, size_t);
	void (*decrypt)(struct tl_gcm *, const uint8_t *, uint8_t *, size_t);
	int (*finish)(struct tl_gcm *, const uint8_t *);
};

static const struct gcm_impl gcm_native __attribute__((unused)) = {
	"native VAES", tl_gcm_supported, tl_gcm_new, tl_gcm_free, tl_gcm_setkey, tl_gcm_begin, tl_gcm_decrypt, tl_gcm_finish,
};
static const struct gcm_impl gcm_emul __attribute__((unused)) = {
	"emulated", tl_gcm_emul_supported, tl_gcm_emul_new, tl_gcm_emul_free, tl_gcm_emul_setkey,
	tl_gcm_emul_begin, tl_gcm_emul_decrypt, tl_gcm_emul_finish,
};

static inline int gcm_impl_open(const struct gcm_impl *im, struct tl_gcm *g, const uint8_t *key, size_t klen,
				const uint8_t nonce[12], const uint8_t *aad, size_t alen, const uint8_t *in,
				uint8_t *out, size_t n, const uint8_t tag[16], const size_t *cuts, int ncut)
{
	size_t at = 0;

	if (im->setkey(g, key, klen) != 0)
		return -2;
	im->begin(g, nonce, aad, alen);
	for (int i = 0; i <= ncut; i++) {
		size_t end = i < ncut ? cuts[i] : n;
		im->decrypt(g, in + at, out + at, end - at);
		at = end;
	}
	return im->finish(g, tag);
}

static inline int gcm_lib_open(EVP_CIPHER_CTX *ctx, const uint8_t *key, size_t klen, const uint8_t nonce[12],
			       const uint8_t *aad, size_t alen, const uint8_t *in, uint8_t *out, size_t n,
			       const uint8_t tag[16], const size_t *cuts, int ncut)
{
	uint8_t scratch[16];
	size_t at = 0;
	int outl = 0;

	if (EVP_DecryptInit_ex(ctx, klen == 16 ? EVP_aes_128_gcm() : EVP_aes_256_gcm(), NULL, NULL, NULL) != 1 ||
	    EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, 12, NULL) != 1 ||
	    EVP_DecryptInit_ex(ctx, NULL, NULL, key, nonce) != 1 ||
	    (alen && EVP_DecryptUpdate(ctx, NULL, &outl, aad, (int)alen) != 1))
		return -2;
	for (int i = 0; i <= ncut; i++) {
		size_t end = i < ncut ? cuts[i] : n;
		if (end > at && (EVP_DecryptUpdate(ctx, out + at, &outl, in + at, (int)(end - at)) != 1 ||
				 (size_t)outl != end - at))
			return -2;
		at = end;
	}
	if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, 16, (void *)tag) != 1)
		return -2;
	return EVP_DecryptFinal_ex(ctx, scratch, &outl) == 1 ? 0 : -1;
}

/* gcm_lib_seal encrypts pt into ct and tag with the library. */
static inline int gcm_lib_seal(const uint8_t *key, size_t klen, const uint8_t nonce[12], const uint8_t *aad,
			       size_t alen, const uint8_t *pt, size_t n, uint8_t *ct, uint8_t tag[16])
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int outl = 0, ok;

	if (!ctx)
		return -1;
	ok = EVP_EncryptInit_ex(ctx, klen == 16 ? EVP_aes_128_gcm() : EVP_aes_256_gcm(), NULL, key, nonce) == 1 &&
	     (!alen || EVP_EncryptUpdate(ctx, NULL, &outl, aad, (int)alen) == 1) &&
	     (!n || (EVP_EncryptUpdate(ctx, ct, &outl, pt, (int)n) == 1 && (size_t)outl == n)) &&
	     EVP_EncryptFinal_ex(ctx, ct + n, &outl) == 1 &&
	     EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, tag) == 1;
	EVP_CIPHER_CTX_free(ctx);
	return ok ? 0 : -1;
}

#endif
