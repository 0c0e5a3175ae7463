/* test_gcm.c - our VAES/VPCLMULQDQ AES-GCM decryption (gcm.c) against the
 * library's libcrypto (EVP AES-GCM, an independent implementation): for
 * both key sizes, random keys, nonces, additional data of 0-40 bytes and
 * ciphertexts of 0 to 16401 bytes (a full TLS record is 16385 + the tag),
 * fed whole and in random pieces (every piece size 1-200 and across the
 * 128-byte steps), the plaintext must equal EVP's and the tag verify; a
 * flipped bit anywhere in the ciphertext, the tag or the additional data
 * must fail it. Two known answers from the GCM specification (McGrew and
 * Viega, "The Galois/Counter Mode of Operation", test cases 1 and 2: the
 * all-zero key and nonce) pin the byte order independently of EVP. Every
 * split of short messages into two and three pieces, each piece from and
 * to a heap buffer of its exact size (ASan: no byte read or written past
 * a piece); 1 MiB messages; a failed tl_gcm_setkey leaves no key behind. On a
 * CPU without VAES the test says so and checks only that the state is not
 * offered. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <malloc.h>

#include <openssl/evp.h>

#include "crypto/gcm.h"
#include "check.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 11);
}

static void rnd_bytes(uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)rnd();
}

/* evp_seal encrypts pt into ct and tag with the library. */
static void evp_seal(const uint8_t *key, size_t klen, const uint8_t nonce[12], const uint8_t *aad, size_t alen,
		     const uint8_t *pt, size_t n, uint8_t *ct, uint8_t tag[16])
{
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	int outl = 0;

	CHECK(ctx != NULL);
	CHECK(EVP_EncryptInit_ex(ctx, klen == 16 ? EVP_aes_128_gcm() : EVP_aes_256_gcm(), NULL, key, nonce) == 1);
	if (alen)
		CHECK(EVP_EncryptUpdate(ctx, NULL, &outl, aad, (int)alen) == 1);
	if (n) {
		CHECK(EVP_EncryptUpdate(ctx, ct, &outl, pt, (int)n) == 1);
		CHECK_EQ(outl, n);
	}
	CHECK(EVP_EncryptFinal_ex(ctx, ct + n, &outl) == 1);
	CHECK(EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, tag) == 1);
	EVP_CIPHER_CTX_free(ctx);
}

/* open_pieces decrypts ct (n bytes) with g in pieces: whole when maxp is
 * 0, else of random sizes 1..maxp. Returns tl_gcm_finish's verdict. */
static int open_pieces(struct tl_gcm *g, const uint8_t nonce[12], const uint8_t *aad, size_t alen, const uint8_t *ct,
		       size_t n, uint8_t *out, const uint8_t tag[16], size_t maxp)
{
	size_t at = 0;

	tl_gcm_begin(g, nonce, aad, alen);
	while (at < n) {
		size_t k = maxp ? 1 + rnd() % maxp : n;
		if (k > n - at)
			k = n - at;
		tl_gcm_decrypt(g, ct + at, out + at, k);
		at += k;
	}
	if (!maxp && n == 0)
		tl_gcm_decrypt(g, ct, out, 0); /* an empty piece is allowed */
	return tl_gcm_finish(g, tag);
}

static void known_answers(struct tl_gcm *g)
{
	static const uint8_t zero[16];
	/* Test case 1: empty plaintext; test case 2: one zero block. */
	static const uint8_t t1[16] = {0x58, 0xe2, 0xfc, 0xce, 0xfa, 0x7e, 0x30, 0x61,
				       0x36, 0x7f, 0x1d, 0x57, 0xa4, 0xe7, 0x45, 0x5a};
	static const uint8_t c2[16] = {0x03, 0x88, 0xda, 0xce, 0x60, 0xb6, 0xa3, 0x92,
				       0xf3, 0x28, 0xc2, 0xb9, 0x71, 0xb2, 0xfe, 0x78};
	static const uint8_t t2[16] = {0xab, 0x6e, 0x47, 0xd4, 0x2c, 0xec, 0x13, 0xbd,
				       0xf5, 0x3a, 0x67, 0xb2, 0x12, 0x57, 0xbd, 0xdf};
	uint8_t out[16];

	CHECK_EQ(tl_gcm_setkey(g, zero, 16), 0);
	tl_gcm_begin(g, zero, NULL, 0);
	CHECK_EQ(tl_gcm_finish(g, t1), 0);
	tl_gcm_begin(g, zero, NULL, 0);
	tl_gcm_decrypt(g, c2, out, 16);
	CHECK_EQ(tl_gcm_finish(g, t2), 0);
	CHECK(memcmp(out, zero, 16) == 0);
	CHECK_EQ(tl_gcm_setkey(g, zero, 24), -1); /* AES-192 is no TLS 1.3 suite */
}

static void differential(struct tl_gcm *g)
{
	enum { MAXN = 16401 + 300 };
	static uint8_t pt[MAXN], ct[MAXN], out[MAXN];
	static const size_t piece[] = {0, 1, 7, 15, 16, 17, 31, 33, 127, 129, 200};
	uint8_t key[32], nonce[12], aad[40], tag[16];
	int runs = 0;

	for (int i = 0; i < 600; i++) {
		size_t klen = i & 1 ? 32 : 16, alen = rnd() % 41, n;
		switch (i % 5) {
		case 0:
			n = 16401; /* a full record's inner plaintext and a bit */
			break;
		case 1:
			n = rnd() % 64;
			break;
		default:
			n = rnd() % 3000;
		}
		rnd_bytes(key, klen);
		rnd_bytes(nonce, sizeof(nonce));
		rnd_bytes(aad, alen);
		rnd_bytes(pt, n);
		evp_seal(key, klen, nonce, aad, alen, pt, n, ct, tag);
		CHECK_EQ(tl_gcm_setkey(g, key, klen), 0);
		for (size_t p = 0; p < sizeof(piece) / sizeof(piece[0]); p++) {
			memset(out, 0xee, n + 1);
			CHECK_EQ(open_pieces(g, nonce, aad, alen, ct, n, out, tag, piece[p]), 0);
			CHECK(memcmp(out, pt, n) == 0);
			CHECK_EQ(out[n], 0xee); /* nothing written past the end */
			runs++;
		}
		/* In place. */
		memcpy(out, ct, n);
		CHECK_EQ(open_pieces(g, nonce, aad, alen, out, n, out, tag, i % 3 ? 0 : 100), 0);
		CHECK(memcmp(out, pt, n) == 0);
		/* Tampering: one bit of the ciphertext, the tag or the aad. */
		{
			int where = (int)(rnd() % 3);
			if (where == 0 && n > 0) {
				size_t at = rnd() % n;
				ct[at] ^= (uint8_t)(1u << (rnd() % 8));
				CHECK_EQ(open_pieces(g, nonce, aad, alen, ct, n, out, tag, 50), -1);
			} else if (where == 1 || alen == 0) {
				tag[rnd() % 16] ^= (uint8_t)(1u << (rnd() % 8));
				CHECK_EQ(open_pieces(g, nonce, aad, alen, ct, n, out, tag, 0), -1);
			} else {
				aad[rnd() % alen] ^= (uint8_t)(1u << (rnd() % 8));
				CHECK_EQ(open_pieces(g, nonce, aad, alen, ct, n, out, tag, 0), -1);
			}
		}
	}
	printf("test_gcm: %d differential openings against EVP\n", runs);
}

/* open_cuts decrypts ct (n bytes) with g in the pieces that the ncuts
 * ascending offsets in cuts make (a cut may repeat or sit at 0 or n: an
 * empty piece). Every piece is copied to a heap buffer of exactly its size
 * and decrypted from there into another (or in place when inplace), so
 * ASan sees any byte read before in or at in + n and any byte written
 * outside out's n; an empty piece points one past its buffer. Returns
 * tl_gcm_finish's verdict, the plaintext in out. */
static int open_cuts(struct tl_gcm *g, const uint8_t nonce[12], const uint8_t *aad, size_t alen, const uint8_t *ct,
		     size_t n, uint8_t *out, const uint8_t tag[16], const size_t *cuts, int ncuts, int inplace)
{
	size_t at = 0;

	tl_gcm_begin(g, nonce, aad, alen);
	for (int i = 0; i <= ncuts; i++) {
		size_t end = i < ncuts ? cuts[i] : n, k = end - at;
		uint8_t *src = malloc(k ? k : 1), *dst = inplace ? src : malloc(k ? k : 1);

		CHECK(src != NULL && dst != NULL);
		memcpy(src, ct + at, k);
		tl_gcm_decrypt(g, k ? src : src + 1, k ? dst : dst + 1, k);
		memcpy(out + at, dst, k);
		if (!inplace)
			free(dst);
		free(src);
		at = end;
	}
	return tl_gcm_finish(g, tag);
}

/* seal_random fills key, nonce, aad and pt and seals pt into ct and tag. */
static void seal_random(uint8_t *key, size_t klen, uint8_t nonce[12], uint8_t *aad, size_t alen, uint8_t *pt,
			size_t n, uint8_t *ct, uint8_t tag[16])
{
	rnd_bytes(key, klen);
	rnd_bytes(nonce, 12);
	rnd_bytes(aad, alen);
	rnd_bytes(pt, n);
	evp_seal(key, klen, nonce, aad, alen, pt, n, ct, tag);
}

/* splits: every two-piece split of every length 0..300 (across the
 * 16-byte blocks and the 128-byte steps; a piece that ends a block, one
 * that leaves a block under way and one that does not complete it), an
 * empty piece at every cut; every three-piece split of 300 bytes whose
 * first piece is 0..33 bytes (so the second starts inside a block, at its
 * edge, or at a 128-byte step); alternately in place and AES-256. */
static void splits(struct tl_gcm *g)
{
	enum { N = 300 };
	static uint8_t pt[N + 16], ct[N + 16], out[N + 16];
	uint8_t key[32], nonce[12], aad[21], tag[16];
	int runs = 0;

	for (size_t n = 0; n <= N; n++) {
		size_t klen = n & 1 ? 32 : 16, alen = n % 22;
		seal_random(key, klen, nonce, aad, alen, pt, n, ct, tag);
		CHECK_EQ(tl_gcm_setkey(g, key, klen), 0);
		for (size_t c = 0; c <= n; c++) {
			size_t cuts[3] = {c, c, c}; /* the same cut thrice: two empty pieces */
			int ncuts = c % 3 == 0 ? 3 : 1;
			memset(out, 0xee, sizeof(out));
			CHECK_EQ(open_cuts(g, nonce, aad, alen, ct, n, out, tag, cuts, ncuts, (int)(c & 1)), 0);
			CHECK(memcmp(out, pt, n) == 0);
			runs++;
		}
		if (n > 0) { /* a flipped bit still fails, cut there */
			size_t at = rnd() % n, cuts[1] = {at};
			ct[at] ^= 0x80;
			CHECK_EQ(open_cuts(g, nonce, aad, alen, ct, n, out, tag, cuts, 1, 0), -1);
			ct[at] ^= 0x80;
		}
	}
	for (int kl = 0; kl < 2; kl++) {
		size_t klen = kl ? 32 : 16, alen = 13;
		seal_random(key, klen, nonce, aad, alen, pt, N, ct, tag);
		CHECK_EQ(tl_gcm_setkey(g, key, klen), 0);
		for (size_t a = 0; a <= 33; a++) {
			for (size_t b = a; b <= N; b++) {
				size_t cuts[2] = {a, b};
				memset(out, 0xee, sizeof(out));
				CHECK_EQ(open_cuts(g, nonce, aad, alen, ct, N, out, tag, cuts, 2, (int)(b & 1)), 0);
				CHECK(memcmp(out, pt, N) == 0);
				runs++;
			}
		}
	}
	printf("test_gcm: %d split openings\n", runs);
}

/* long_messages: 1 MiB and a bit (far past a TLS record: 8192 and more
 * 128-byte steps under one nonce) whole and in pieces of 4099 and 16417
 * bytes; a message begun and dropped halfway through a block (tl_gcm_begin
 * again) leaves nothing behind; rekeying between sizes (AES-256, then
 * AES-128, then AES-256 again, as a state would across suites) keys
 * afresh; a failed tag does not spoil the next message. */
static void long_messages(struct tl_gcm *g)
{
	enum { N = (1 << 20) + 77 };
	uint8_t *pt = malloc(N), *ct = malloc(N), *out = malloc(N);
	uint8_t key[32], nonce[12], aad[5], tag[16], bad[16];
	static const size_t sizes[] = {16, 32, 16, 32};

	CHECK(pt && ct && out);
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		size_t klen = sizes[s], cuts[N / 4099 + 1], ncuts = 0;
		seal_random(key, klen, nonce, aad, sizeof(aad), pt, N, ct, tag);
		CHECK_EQ(tl_gcm_setkey(g, key, klen), 0);
		CHECK_EQ(open_pieces(g, nonce, aad, sizeof(aad), ct, N, out, tag, 0), 0);
		CHECK(memcmp(out, pt, N) == 0);
		for (size_t at = s & 1 ? 16417 : 4099; at < N; at += s & 1 ? 16417 : 4099)
			cuts[ncuts++] = at;
		/* Dropped: begun, 21 bytes in. */
		tl_gcm_begin(g, nonce, aad, sizeof(aad));
		tl_gcm_decrypt(g, ct, out, 21);
		memset(out, 0, N);
		CHECK_EQ(open_cuts(g, nonce, aad, sizeof(aad), ct, N, out, tag, cuts, (int)ncuts, (int)(s & 1)), 0);
		CHECK(memcmp(out, pt, N) == 0);
		memcpy(bad, tag, 16);
		bad[15] ^= 1;
		CHECK_EQ(open_pieces(g, nonce, aad, sizeof(aad), ct, 1000, out, bad, 0), -1);
		CHECK_EQ(open_pieces(g, nonce, aad, sizeof(aad), ct, N, out, tag, 0), 0);
	}
	free(pt);
	free(ct);
	free(out);
}

/* unkeyed: a failed tl_gcm_setkey (a length other than 16 or 32) leaves
 * the state unkeyed, nothing of the previous key behind: the hash key
 * H = E(K, 0^128), which the state keeps byte-reversed (and its powers),
 * is found in neither order anywhere in the allocation. */
static void unkeyed(void)
{
	struct tl_gcm *g = tl_gcm_new();
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	uint8_t key[32], h[16], hr[16];
	static const uint8_t zero[16];
	const uint8_t *p = (const uint8_t *)g;
	size_t size;
	int outl = 0;

	CHECK(g != NULL && ctx != NULL);
	rnd_bytes(key, sizeof(key));
	CHECK(EVP_EncryptInit_ex(ctx, EVP_aes_256_ecb(), NULL, key, NULL) == 1);
	CHECK(EVP_EncryptUpdate(ctx, h, &outl, zero, 16) == 1);
	CHECK_EQ(outl, 16);
	EVP_CIPHER_CTX_free(ctx);
	for (int i = 0; i < 16; i++)
		hr[i] = h[15 - i];
	size = malloc_usable_size(g);
	CHECK_EQ(tl_gcm_setkey(g, key, 32), 0);
	{
		int found = 0;
		for (size_t i = 0; i + 16 <= size; i++)
			found |= memcmp(p + i, hr, 16) == 0;
		CHECK(found); /* the scan sees the key where it is */
	}
	CHECK_EQ(tl_gcm_setkey(g, key, 31), -1);
	for (size_t i = 0; i + 16 <= size; i++) {
		CHECK(memcmp(p + i, h, 16) != 0);
		CHECK(memcmp(p + i, hr, 16) != 0);
	}
	tl_gcm_free(g);
}

int main(void)
{
	struct tl_gcm *g;

	if (!tl_gcm_supported()) {
		CHECK(tl_gcm_new() == NULL);
		printf("test_gcm: this CPU has no VAES/VPCLMULQDQ: the record layer uses the library's AES-GCM\n");
		return 0;
	}
	g = tl_gcm_new();
	CHECK(g != NULL);
	known_answers(g);
	differential(g);
	splits(g);
	long_messages(g);
	unkeyed();
	tl_gcm_free(g);
	tl_gcm_free(NULL);
	printf("test_gcm: %lu checks passed\n", check_passed);
	return 0;
}
