/* crypto/gcm.c - AES-GCM decryption on 256-bit vectors (see gcm.h).
 *
 * GHASH works on byte-reversed blocks: reversing a block's 16 bytes puts
 * the coefficient of x^0 in bit 127 and of x^127 in bit 0, so a carry-less
 * multiply of two reversed elements gives their product reversed, one bit
 * short (255 bits): shift it left by one and reduce it modulo
 * x^128 + x^7 + x^2 + x + 1 in the same reversed order (gh_reduce).
 * Shift and reduction are linear, so sixteen products are summed unreduced
 * and reduced once: Y' = (Y + C1) H^16 + C2 H^15 + ... + C16 H (gcm_decrypt,
 * gh_fold). Sixteen, not eight: the chain from one Y to the next (a
 * multiply, the fold, the reduction) then runs under twice the AES work
 * (bench_gcm: 0.152 against 0.178 ns/B for eight).
 * The counter block is kept reversed too: its 32-bit counter is then the
 * low lane, incremented with an add (inc32 wraps within those 32 bits). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "crypto/gcm.h"
#include "base/timer.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)

#include <cpuid.h>
#include <immintrin.h>

#include <openssl/evp.h>

/* A test build may bring its own (csrc/test/gcm_emul.h). */
#ifndef GCM_TARGET
#define GCM_TARGET __attribute__((target("avx2,aes,pclmul,vaes,vpclmulqdq,ssse3,sse4.1")))
#endif

struct tl_gcm {
	_Alignas(32) uint8_t rk[15][32]; /* round keys, each in both 128-bit lanes */
	_Alignas(32) uint8_t hp[8][32];  /* H^16|H^15, ..., H^2|H (low lane first), reversed; gh_h */
	_Alignas(16) uint8_t y[16];      /* the GHASH accumulator, reversed */
	_Alignas(16) uint8_t ctr[16];    /* the next counter block, reversed */
	_Alignas(16) uint8_t ek0[16];    /* E(K, J0): masks the tag */
	uint8_t ks[16];                  /* keystream of the block under way */
	uint8_t ct[16];                  /* its ciphertext so far (GHASH input) */
	unsigned part;                   /* bytes of that block used (0: none under way) */
	unsigned rounds;                 /* 10 or 14; 0: unkeyed */
	uint64_t aad_len, ct_len;
};

/* gcm_probe reads CPUID itself (clang 14's __builtin_cpu_supports
 * knows no "vaes"): leaf 1 for AES-NI, PCLMULQDQ, AVX and OSXSAVE, XCR0
 * for the kernel saving the xmm and ymm registers, leaf 7 for AVX2, VAES
 * and VPCLMULQDQ. */
static int gcm_probe(void)
{
	unsigned a, b, c, d, xlo, xhi;

	if (!__get_cpuid(1, &a, &b, &c, &d))
		return 0;
	if (!(c & bit_AES) || !(c & bit_PCLMUL) || !(c & bit_AVX) || !(c & bit_OSXSAVE))
		return 0;
	__asm__("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
	(void)xhi;
	if ((xlo & 6) != 6)
		return 0;
	if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
		return 0;
#ifdef TL_GCM_EMUL
	/* The test build that runs VAES and VPCLMULQDQ as 128-bit halves
	 * (csrc/test/gcm_emul.h) needs neither. */
	return !!(b & bit_AVX2);
#else
	return (b & bit_AVX2) && (c & (1u << 9)) && (c & (1u << 10)); /* VAES, VPCLMULQDQ */
#endif
}

/* The probe's answer, once: CPUID traps to the hypervisor in a VM. Racing
 * first callers store the same value. */
static int gcm_cpu = -1;

static int gcm_selftest_ok(void);

int tl_gcm_supported(void)
{
	int v = __atomic_load_n(&gcm_cpu, __ATOMIC_RELAXED);

	if (v < 0) {
		v = gcm_probe();
		__atomic_store_n(&gcm_cpu, v, __ATOMIC_RELAXED);
	}
	return v && gcm_selftest_ok();
}

GCM_TARGET static inline __m128i gcm_rev(__m128i v)
{
	return _mm_shuffle_epi8(v, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

GCM_TARGET static inline __m256i gcm_rev2(__m256i v)
{
	/* vpshufb works per 128-bit lane: each block is reversed in place. */
	return _mm256_shuffle_epi8(v, _mm256_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2,
						      3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

/* gh_shr128 shifts a 128-bit value right by k (1..63). */
GCM_TARGET static inline __m128i gh_shr128(__m128i v, int k)
{
	return _mm_or_si128(_mm_srli_epi64(v, k), _mm_srli_si128(_mm_slli_epi64(v, 64 - k), 8));
}

/* gh_reduce takes the unreduced 256-bit product hi:lo of two reversed
 * elements (bits 0-254) and returns it reduced, reversed. First the shift
 * by one; then, with the low 128 bits X1:X0 standing for the terms of
 * degree 128 and up, fold them down twice: x^128 = x^7 + x^2 + x + 1,
 * which in reversed order is a right shift by 1, 2 and 7 plus the value
 * itself (the words shifted past bit 0 come back through D). */
GCM_TARGET static inline __m128i gh_reduce(__m128i lo, __m128i hi)
{
	__m128i carry = _mm_srli_si128(_mm_srli_epi64(lo, 63), 8);
	__m128i x0, d, dx, t;

	hi = _mm_or_si128(_mm_or_si128(_mm_slli_epi64(hi, 1), _mm_slli_si128(_mm_srli_epi64(hi, 63), 8)), carry);
	lo = _mm_or_si128(_mm_slli_epi64(lo, 1), _mm_slli_si128(_mm_srli_epi64(lo, 63), 8));
	/* D = X1 ^ X0<<63 ^ X0<<62 ^ X0<<57 (64-bit shifts of X0). */
	x0 = _mm_slli_si128(lo, 8); /* X0 in the high word */
	t = _mm_xor_si128(_mm_xor_si128(_mm_slli_epi64(x0, 63), _mm_slli_epi64(x0, 62)), _mm_slli_epi64(x0, 57));
	d = _mm_xor_si128(lo, t); /* high word D, low word X0 */
	dx = _mm_xor_si128(_mm_xor_si128(d, gh_shr128(d, 1)), _mm_xor_si128(gh_shr128(d, 2), gh_shr128(d, 7)));
	return _mm_xor_si128(hi, dx);
}

/* gh_combine adds the middle partial product mid (bits 64-191) into
 * lo:hi and reduces the total. */
GCM_TARGET static inline __m128i gh_combine(__m128i lo, __m128i mid, __m128i hi)
{
	return gh_reduce(_mm_xor_si128(lo, _mm_slli_si128(mid, 8)), _mm_xor_si128(hi, _mm_srli_si128(mid, 8)));
}

/* gh_mul returns a * b (both reversed), reduced. */
GCM_TARGET static inline __m128i gh_mul(__m128i a, __m128i b)
{
	return gh_combine(_mm_clmulepi64_si128(a, b, 0x00),
			  _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01), _mm_clmulepi64_si128(a, b, 0x10)),
			  _mm_clmulepi64_si128(a, b, 0x11));
}

/* gh_h returns H (reversed): the high lane of the last power pair. */
GCM_TARGET static inline __m128i gh_h(const struct tl_gcm *g)
{
	return _mm_load_si128((const __m128i *)(g->hp[7] + 16));
}

/* gh_block absorbs one 16-byte block (as in memory) into the accumulator. */
GCM_TARGET static inline void gh_block(struct tl_gcm *g, const uint8_t *b)
{
	__m128i y = _mm_load_si128((const __m128i *)g->y);

	y = _mm_xor_si128(y, gcm_rev(_mm_loadu_si128((const __m128i *)b)));
	_mm_store_si128((__m128i *)g->y, gh_mul(y, gh_h(g)));
}

/* gh_mul2 adds the unreduced products of two pairs of elements (one per
 * lane) to lo, mid and hi. */
GCM_TARGET static inline void gh_mul2(__m256i a, __m256i b, __m256i *lo, __m256i *mid, __m256i *hi)
{
	*lo = _mm256_xor_si256(*lo, _mm256_clmulepi64_epi128(a, b, 0x00));
	*hi = _mm256_xor_si256(*hi, _mm256_clmulepi64_epi128(a, b, 0x11));
	*mid = _mm256_xor_si256(*mid, _mm256_xor_si256(_mm256_clmulepi64_epi128(a, b, 0x01),
						       _mm256_clmulepi64_epi128(a, b, 0x10)));
}

/* gh_fold adds the two lanes of the unreduced sums lo, mid, hi (gh_mul2)
 * and reduces the total. */
GCM_TARGET static inline __m128i gh_fold(__m256i lo, __m256i mid, __m256i hi)
{
	return gh_combine(_mm_xor_si128(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1)),
			  _mm_xor_si128(_mm256_castsi256_si128(mid), _mm256_extracti128_si256(mid, 1)),
			  _mm_xor_si128(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)));
}

/* aes_block encrypts one block with the round keys' low lanes. */
GCM_TARGET static inline __m128i aes_block(const struct tl_gcm *g, __m128i b)
{
	b = _mm_xor_si128(b, _mm_load_si128((const __m128i *)g->rk[0]));
	for (unsigned r = 1; r < g->rounds; r++)
		b = _mm_aesenc_si128(b, _mm_load_si128((const __m128i *)g->rk[r]));
	return _mm_aesenclast_si128(b, _mm_load_si128((const __m128i *)g->rk[g->rounds]));
}

/* Key expansion (FIPS 197 5.2) with AESKEYGENASSIST: each step XORs the
 * previous round key's words into each other (w[i] ^= w[i-1], as prefix
 * sums by shifting) and adds the assist's word. */
GCM_TARGET static inline __m128i key_fold(__m128i k, __m128i assist)
{
	k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
	k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
	k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
	return _mm_xor_si128(k, assist);
}

#define KEY128(i, rcon)                                                                                            \
	k[i] = key_fold(k[(i) - 1], _mm_shuffle_epi32(_mm_aeskeygenassist_si128(k[(i) - 1], rcon), 0xff))
#define KEY256(i, rcon)                                                                                            \
	do {                                                                                                       \
		k[i] = key_fold(k[(i) - 2], _mm_shuffle_epi32(_mm_aeskeygenassist_si128(k[(i) - 1], rcon), 0xff)); \
		k[(i) + 1] = key_fold(k[(i) - 1], _mm_shuffle_epi32(_mm_aeskeygenassist_si128(k[i], 0), 0xaa));   \
	} while (0)

GCM_TARGET int tl_gcm_setkey(struct tl_gcm *g, const uint8_t *key, size_t len)
{
	__m128i k[16], h, p[17]; /* k[15]: KEY256(14) computes one key too many */

	if (len == 16) {
		k[0] = _mm_loadu_si128((const __m128i *)key);
		KEY128(1, 0x01);
		KEY128(2, 0x02);
		KEY128(3, 0x04);
		KEY128(4, 0x08);
		KEY128(5, 0x10);
		KEY128(6, 0x20);
		KEY128(7, 0x40);
		KEY128(8, 0x80);
		KEY128(9, 0x1b);
		KEY128(10, 0x36);
		g->rounds = 10;
	} else if (len == 32) {
		k[0] = _mm_loadu_si128((const __m128i *)key);
		k[1] = _mm_loadu_si128((const __m128i *)(key + 16));
		KEY256(2, 0x01);
		KEY256(4, 0x02);
		KEY256(6, 0x04);
		KEY256(8, 0x08);
		KEY256(10, 0x10);
		KEY256(12, 0x20);
		KEY256(14, 0x40);
		g->rounds = 14;
	} else {
		/* Unkeyed: nothing of the previous key stays. */
		memset(g->rk, 0, sizeof(g->rk));
		memset(g->hp, 0, sizeof(g->hp));
		memset(g->ek0, 0, sizeof(g->ek0));
		memset(g->ks, 0, sizeof(g->ks));
		g->rounds = 0;
		return -1;
	}
	/* Round keys past the last (an AES-256 key's, when an AES-128 one
	 * follows it) are wiped, not left behind. */
	for (unsigned r = 0; r < 15; r++)
		_mm256_store_si256((__m256i *)g->rk[r],
				   r <= g->rounds ? _mm256_broadcastsi128_si256(k[r]) : _mm256_setzero_si256());
	h = gcm_rev(aes_block(g, _mm_setzero_si128()));
	p[1] = h;
	for (int i = 2; i <= 16; i++)
		p[i] = gh_mul(p[i - 1], h);
	for (int i = 0; i < 8; i++) /* lane 0 the higher power: it meets the earlier block */
		_mm256_store_si256((__m256i *)g->hp[i], _mm256_set_m128i(p[15 - 2 * i], p[16 - 2 * i]));
	/* The key's copies on the stack go with the frame; wipe them. */
	memset(k, 0, sizeof(k));
	memset(p, 0, sizeof(p));
	__asm__ __volatile__("" : : "r"(k), "r"(p) : "memory");
	return 0;
}

GCM_TARGET void tl_gcm_begin(struct tl_gcm *g, const uint8_t nonce[12], const uint8_t *aad, size_t aad_len)
{
	uint8_t j0[16], b[16];

	memcpy(j0, nonce, 12);
	j0[12] = j0[13] = j0[14] = 0;
	j0[15] = 1;
	_mm_store_si128((__m128i *)g->ek0, aes_block(g, _mm_loadu_si128((const __m128i *)j0)));
	/* The first data block's counter is inc32(J0). */
	_mm_store_si128((__m128i *)g->ctr,
			_mm_add_epi32(gcm_rev(_mm_loadu_si128((const __m128i *)j0)), _mm_set_epi32(0, 0, 0, 1)));
	_mm_store_si128((__m128i *)g->y, _mm_setzero_si128());
	g->part = 0;
	g->aad_len = aad_len;
	g->ct_len = 0;
	for (; aad_len >= 16; aad += 16, aad_len -= 16)
		gh_block(g, aad);
	if (aad_len) {
		memset(b, 0, sizeof(b));
		memcpy(b, aad, aad_len);
		gh_block(g, b);
	}
}

/* aes8_start loads the next sixteen counter blocks, two per vector, into
 * x with round key 0 added, and steps *ctr past them. */
GCM_TARGET static inline void aes8_start(const struct tl_gcm *g, __m256i x[8], __m256i *ctr)
{
	const __m256i two = _mm256_set_epi32(0, 0, 0, 2, 0, 0, 0, 2);
	__m256i rk = _mm256_load_si256((const __m256i *)g->rk[0]);

	_Pragma("GCC unroll 8")
	for (int i = 0; i < 8; i++) {
		x[i] = _mm256_xor_si256(gcm_rev2(*ctr), rk);
		*ctr = _mm256_add_epi32(*ctr, two);
	}
}

/* aes8_rounds runs rounds first .. last - 1 on the eight vectors and
 * returns the last round key: the caller's aesenclast merges it. */
GCM_TARGET static inline __m256i aes8_rounds(const struct tl_gcm *g, __m256i x[8], unsigned first)
{
	for (unsigned r = first; r < g->rounds; r++) {
		__m256i rk = _mm256_load_si256((const __m256i *)g->rk[r]);

		_Pragma("GCC unroll 8")
		for (int i = 0; i < 8; i++)
			x[i] = _mm256_aesenc_epi128(x[i], rk);
	}
	return _mm256_load_si256((const __m256i *)g->rk[g->rounds]);
}

/* gh_pow returns H^m (reversed), 1 <= m <= 16, from the power table:
 * hp[i] holds H^(16-2i) in its low lane and H^(15-2i) in its high one. */
GCM_TARGET static inline __m128i gh_pow(const struct tl_gcm *g, unsigned m)
{
	return _mm_load_si128((const __m128i *)(g->hp[(16 - m) / 2] + (m & 1 ? 16 : 0)));
}

/* gcm_tail decrypts the last n < 256 bytes of a piece: its k = n / 16
 * whole blocks and, when n % 16, the start of a block the next piece
 * finishes. Block by block each AES waited for the one before and each
 * GHASH step for its reduction; here the keystream of all of them comes
 * from one pass over eight vectors (sixteen blocks, their rounds
 * overlapping: about the time of one block's), and GHASH is k products
 * by H^k..H^1 summed unreduced and reduced once. The ciphertext is
 * hashed before anything is stored: in may be out. */
GCM_TARGET static void gcm_tail(struct tl_gcm *g, const uint8_t *in, uint8_t *out, size_t n)
{
	unsigned k = (unsigned)(n / 16), rest = (unsigned)(n % 16), used = k + (rest != 0);
	__m128i c = _mm_load_si128((const __m128i *)g->ctr);
	__m256i ctr = _mm256_add_epi32(_mm256_broadcastsi128_si256(c), _mm256_set_epi32(0, 0, 0, 1, 0, 0, 0, 0));
	__m256i x[8], rk;
	int i;

	if (k) {
		__m128i lo = _mm_setzero_si128(), mid = lo, hi = lo;
		__m128i y = _mm_load_si128((const __m128i *)g->y);

		for (unsigned j = 0; j < k; j++) {
			__m128i d = gcm_rev(_mm_loadu_si128((const __m128i *)(in + 16 * j)));
			__m128i h = gh_pow(g, k - j);

			if (j == 0)
				d = _mm_xor_si128(d, y);
			lo = _mm_xor_si128(lo, _mm_clmulepi64_si128(d, h, 0x00));
			hi = _mm_xor_si128(hi, _mm_clmulepi64_si128(d, h, 0x11));
			mid = _mm_xor_si128(mid, _mm_xor_si128(_mm_clmulepi64_si128(d, h, 0x01),
							       _mm_clmulepi64_si128(d, h, 0x10)));
		}
		_mm_store_si128((__m128i *)g->y, gh_combine(lo, mid, hi));
	}
	aes8_start(g, x, &ctr);
	rk = aes8_rounds(g, x, 1);
	_Pragma("GCC unroll 8")
	for (i = 0; i < 8; i++)
		x[i] = _mm256_aesenclast_epi128(x[i], rk);
	/* Unrolled, each vector named by a constant: a variable index (x[j / 2])
	 * puts all sixteen keystream blocks in the stack frame, left there. */
	_Pragma("GCC unroll 16")
	for (unsigned j = 0; j < 16; j++) {
		__m128i ks = j & 1 ? _mm256_extracti128_si256(x[j / 2], 1) : _mm256_castsi256_si128(x[j / 2]);

		if (j == k) {
			if (rest)
				_mm_storeu_si128((__m128i *)g->ks, ks);
			break;
		}
		_mm_storeu_si128((__m128i *)(out + 16 * j),
				 _mm_xor_si128(ks, _mm_loadu_si128((const __m128i *)(in + 16 * j))));
	}
	/* The counter moves past the blocks used, keystream included. */
	_mm_store_si128((__m128i *)g->ctr, _mm_add_epi32(c, _mm_set_epi32(0, 0, 0, (int)used)));
	if (rest) {
		in += 16 * k;
		out += 16 * k;
		for (; g->part < rest; g->part++) {
			g->ct[g->part] = in[g->part];
			out[g->part] = (uint8_t)(in[g->part] ^ g->ks[g->part]);
		}
	}
}

GCM_TARGET void tl_gcm_decrypt(struct tl_gcm *g, const uint8_t *in, uint8_t *out, size_t n)
{
	g->ct_len += n;
	/* Finish the block under way. */
	if (g->part) {
		while (n > 0 && g->part < 16) {
			uint8_t c = *in++;
			g->ct[g->part] = c;
			*out++ = (uint8_t)(c ^ g->ks[g->part++]);
			n--;
		}
		if (g->part < 16)
			return;
		gh_block(g, g->ct);
		g->part = 0;
	}
	if (n >= 256) {
		__m128i y = _mm_load_si128((const __m128i *)g->y);
		__m128i c = _mm_load_si128((const __m128i *)g->ctr);
		__m256i ctr = _mm256_add_epi32(_mm256_broadcastsi128_si256(c), _mm256_set_epi32(0, 0, 0, 1, 0, 0, 0, 0));

		for (; n >= 256; n -= 256, in += 256, out += 256) {
			__m256i x[8], rk;
			__m256i lo = _mm256_setzero_si256(), mid = lo, hi = lo;
			unsigned r;
			int i;

			aes8_start(g, x, &ctr);
			/* Rounds 1-8 carry GHASH's sixteen products (of the
			 * ciphertext, which is there from the start): the AES and the
			 * carry-less multiplies overlap, and the ciphertext is loaded
			 * where it is used instead of held in registers. */
			_Pragma("GCC unroll 8")
			for (r = 1; r <= 8; r++) {
				__m256i d = gcm_rev2(_mm256_loadu_si256((const __m256i *)(in + 32 * (r - 1))));
				rk = _mm256_load_si256((const __m256i *)g->rk[r]);
				_Pragma("GCC unroll 8")
				for (i = 0; i < 4; i++)
					x[i] = _mm256_aesenc_epi128(x[i], rk);
				if (r == 1)
					d = _mm256_xor_si256(d, _mm256_zextsi128_si256(y));
				gh_mul2(d, _mm256_load_si256((const __m256i *)g->hp[r - 1]), &lo, &mid, &hi);
				_Pragma("GCC unroll 8")
				for (i = 4; i < 8; i++)
					x[i] = _mm256_aesenc_epi128(x[i], rk);
			}
			y = gh_fold(lo, mid, hi);
			rk = aes8_rounds(g, x, r);
			/* Load each vector's ciphertext before storing it: in may be out. */
			_Pragma("GCC unroll 8")
			for (i = 0; i < 8; i++)
				_mm256_storeu_si256((__m256i *)(out + 32 * i),
						    _mm256_xor_si256(_mm256_aesenclast_epi128(x[i], rk),
								     _mm256_loadu_si256((const __m256i *)(in + 32 * i))));
		}
		_mm_store_si128((__m128i *)g->y, y);
		_mm_store_si128((__m128i *)g->ctr, _mm256_castsi256_si128(ctr));
	}
	if (n > 0)
		gcm_tail(g, in, out, n);
}

GCM_TARGET int tl_gcm_finish(struct tl_gcm *g, const uint8_t tag[16])
{
	uint8_t t[16], diff = 0;
	__m128i y;

	if (g->part) {
		memset(g->ct + g->part, 0, 16 - g->part);
		gh_block(g, g->ct);
		g->part = 0;
	}
	/* The lengths block, len(A) || len(C) in bits, big-endian: reversed,
	 * the bit length of A is the high half. */
	y = _mm_xor_si128(_mm_load_si128((const __m128i *)g->y),
			  _mm_set_epi64x((long long)(g->aad_len * 8), (long long)(g->ct_len * 8)));
	y = gh_mul(y, gh_h(g));
	_mm_storeu_si128((__m128i *)t, _mm_xor_si128(gcm_rev(y), _mm_load_si128((const __m128i *)g->ek0)));
	for (int i = 0; i < 16; i++)
		diff |= (uint8_t)(t[i] ^ tag[i]);
	memset(t, 0, sizeof(t));
	memset(g->ks, 0, sizeof(g->ks));
	__asm__ __volatile__("" : : "r"(t) : "memory");
	return diff ? -1 : 0;
}

static struct tl_gcm *gcm_alloc(void)
{
	struct tl_gcm *g = aligned_alloc(32, sizeof(struct tl_gcm));

	if (g)
		memset(g, 0, sizeof(*g));
	return g;
}

/* Power-on self-test: before the first state is handed out, messages the
 * library seals (its EVP AES-GCM, an independent implementation, linked
 * anyway) must open here to the same plaintext, whole and in the pieces
 * receive slots cut a record into, and tampered ones must be refused.
 * Both key sizes; lengths around a block, a 256-byte step and a full TLS
 * record's inner plaintext; AAD of 0, 5 (a TLS 1.3 record header) and 13
 * bytes. Key, nonce, AAD and plaintext come from a fixed pattern. A
 * mismatch turns the own GCM off for the process: tl_gcm_supported says 0,
 * tl_gcm_new gives NULL and the record layer opens with the library.
 * gcm_kat: -1 not run, 1 passed, 0 failed; racing first callers store the
 * same answer. */
static int gcm_kat = -1;
#ifdef TL_DEBUG
static int gcm_kat_spoil = -1; /* tl_gcm_selftest_hook: the row whose expected tag is spoiled */
#endif

#define GCM_KAT_MAX 16385

static void kat_fill(uint8_t *p, size_t n, uint32_t *x)
{
	for (size_t i = 0; i < n; i++) {
		*x = *x * 1103515245u + 12345u;
		p[i] = (uint8_t)(*x >> 16);
	}
}

static int kat_seal(const uint8_t *key, size_t klen, const uint8_t nonce[12], const uint8_t *aad, size_t alen,
		    const uint8_t *pt, size_t n, uint8_t *ct, uint8_t tag[16])
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

/* kat_open opens ct in the pieces cuts[0..ncut) make (ascending, each at
 * most n; a repeated cut is an empty piece) and says whether the verdict
 * and plaintext are what they must be. */
static int kat_open(struct tl_gcm *g, const uint8_t nonce[12], const uint8_t *aad, size_t alen, const uint8_t *ct,
		    uint8_t *out, size_t n, const uint8_t tag[16], const size_t *cuts, int ncut, const uint8_t *pt)
{
	size_t at = 0;

	tl_gcm_begin(g, nonce, aad, alen);
	for (int i = 0; i <= ncut; i++) {
		size_t end = i < ncut ? cuts[i] : n;
		tl_gcm_decrypt(g, ct + at, out + at, end - at);
		at = end;
	}
	if (tl_gcm_finish(g, tag) != 0)
		return !pt; /* refused: right when it had to be */
	return pt && memcmp(out, pt, n) == 0;
}

static int gcm_selftest(void)
{
	static const size_t lens[] = {0, 1, 15, 16, 17, 255, 256, 257, GCM_KAT_MAX};
	static const size_t alens[] = {0, 5, 13};
	uint8_t key[32], nonce[12], aad[13], tag[16];
	uint8_t *buf = malloc(3 * GCM_KAT_MAX), *pt = buf, *ct = buf + GCM_KAT_MAX, *out = buf + 2 * GCM_KAT_MAX;
	struct tl_gcm *g = gcm_alloc();
	uint32_t x = 0x7a6c5e01u;
	int ok = buf && g, row = 0;

	for (size_t klen = 16; ok && klen <= 32; klen += 16) {
		kat_fill(key, klen, &x);
		ok = tl_gcm_setkey(g, key, klen) == 0;
		for (size_t li = 0; ok && li < sizeof(lens) / sizeof(lens[0]); li++) {
			for (size_t ai = 0; ok && ai < sizeof(alens) / sizeof(alens[0]); ai++, row++) {
				size_t n = lens[li], alen = alens[ai];
				/* Cut as slots cut a record: a byte, mid-block, a block
				 * short of the end, an empty piece. */
				size_t cuts[4] = {n ? 1 : 0, n / 2 + 7 < n ? n / 2 + 7 : n, n > 16 ? n - 16 : n, 0};

				if (cuts[2] < cuts[1])
					cuts[2] = cuts[1];
				cuts[3] = cuts[2];

				kat_fill(nonce, sizeof(nonce), &x);
				kat_fill(aad, alen, &x);
				kat_fill(pt, n, &x);
				ok = kat_seal(key, klen, nonce, aad, alen, pt, n, ct, tag) == 0;
#ifdef TL_DEBUG
				if (row == gcm_kat_spoil)
					tag[row % 16] ^= 0x10;
#endif
				ok = ok && kat_open(g, nonce, aad, alen, ct, out, n, tag, NULL, 0, pt);
				memcpy(out, ct, n); /* in place */
				ok = ok && kat_open(g, nonce, aad, alen, out, out, n, tag, cuts, 4, pt);
				/* Refused: a flipped tag bit, ciphertext bit, AAD bit. */
				tag[row % 16] ^= 0x01;
				ok = ok && kat_open(g, nonce, aad, alen, ct, out, n, tag, cuts, 2, NULL);
				tag[row % 16] ^= 0x01;
				if (n) {
					ct[(size_t)row % n] ^= 0x80;
					ok = ok && kat_open(g, nonce, aad, alen, ct, out, n, tag, cuts, 4, NULL);
					ct[(size_t)row % n] ^= 0x80;
				}
				if (alen) {
					aad[alen - 1] ^= 0x02;
					ok = ok && kat_open(g, nonce, aad, alen, ct, out, n, tag, NULL, 0, NULL);
				}
			}
		}
	}
	tl_gcm_free(g);
	if (buf)
		memset(buf, 0, 3 * GCM_KAT_MAX);
	free(buf);
	return ok ? 1 : 0;
}

/* The speed race: the own GCM is the default only where it opens records
 * faster than the library it would replace, measured in this process on
 * this CPU. Each side opens a full TLS record (16385 bytes of ciphertext)
 * and a 67-byte one (a 64 B order over wss) RACE_ROUNDS times; the best
 * time of each size counts, so a preemption in one round does not decide.
 * The library side does what the record layer's library path does per
 * record: the key set once, only the nonce per record. The own code must
 * be faster at both sizes by RACE_MARGIN_PCT percent. Test builds
 * (TL_DEBUG, sanitizers) skip it: instrumented code is no measure of
 * speed, and their job is to run the own code. */
#ifndef TL_DEBUG
#define RACE_ROUNDS 16
#define RACE_MARGIN_PCT 5

/* gcm_race returns 1 when the own GCM won, 0 when the library did, and 1
 * when the race could not run (out of memory, a library error: the
 * self-test that passed is the verdict that counts then). */
static int gcm_race(void)
{
	static const size_t lens[2] = {GCM_KAT_MAX, 67};
	uint8_t key[16], nonce[12], aad[5] = {0x17, 0x03, 0x03, 0, 0}, tag[16];
	uint8_t *buf = malloc(3 * GCM_KAT_MAX), *pt = buf, *ct = buf + GCM_KAT_MAX, *out = buf + 2 * GCM_KAT_MAX;
	struct tl_gcm *g = gcm_alloc();
	EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
	uint32_t x = 0x5eed0001u;
	int won = 1;

	if (!buf || !g || !ctx)
		goto out;
	kat_fill(key, sizeof(key), &x);
	kat_fill(nonce, sizeof(nonce), &x);
	if (tl_gcm_setkey(g, key, sizeof(key)) != 0 ||
	    EVP_DecryptInit_ex(ctx, EVP_aes_128_gcm(), NULL, key, NULL) != 1)
		goto out;
	for (int i = 0; i < 2; i++) {
		size_t n = lens[i];
		uint64_t own = UINT64_MAX, lib = UINT64_MAX;
		int outl;

		kat_fill(pt, n, &x);
		if (kat_seal(key, sizeof(key), nonce, aad, sizeof(aad), pt, n, ct, tag) != 0)
			goto out;
		for (int r = 0; r < RACE_ROUNDS; r++) {
			uint64_t t0 = tl_timer_now_ns(), t1, t2;
			int ok;

			tl_gcm_begin(g, nonce, aad, sizeof(aad));
			tl_gcm_decrypt(g, ct, out, n);
			ok = tl_gcm_finish(g, tag) == 0;
			t1 = tl_timer_now_ns();
			ok = ok && EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, nonce) == 1 &&
			     EVP_DecryptUpdate(ctx, NULL, &outl, aad, (int)sizeof(aad)) == 1 &&
			     EVP_DecryptUpdate(ctx, out, &outl, ct, (int)n) == 1 &&
			     EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, 16, tag) == 1 &&
			     EVP_DecryptFinal_ex(ctx, out + outl, &outl) == 1;
			t2 = tl_timer_now_ns();
			if (!ok)
				goto out;
			if (t1 - t0 < own)
				own = t1 - t0;
			if (t2 - t1 < lib)
				lib = t2 - t1;
		}
		if (own * 100 > lib * (100 - RACE_MARGIN_PCT)) {
			won = 0;
			break;
		}
	}
out:
	EVP_CIPHER_CTX_free(ctx);
	tl_gcm_free(g);
	if (buf)
		memset(buf, 0, 3 * GCM_KAT_MAX);
	free(buf);
	return won;
}
#endif /* !TL_DEBUG */

/* gcm_kat after the self-test: 1 passed and the own GCM is used, 2 passed
 * but the library opened records faster here (gcm_race), so it is used. */
static int gcm_selftest_ok(void)
{
	int v = __atomic_load_n(&gcm_kat, __ATOMIC_ACQUIRE);

	if (v < 0) {
		v = gcm_selftest();
#ifndef TL_DEBUG
		if (v == 1 && !gcm_race())
			v = 2;
#endif
		__atomic_store_n(&gcm_kat, v, __ATOMIC_RELEASE);
	}
	return v == 1;
}

int tl_gcm_selftest_failed(void)
{
	return __atomic_load_n(&gcm_kat, __ATOMIC_ACQUIRE) == 0;
}

int tl_gcm_library_faster(void)
{
	return __atomic_load_n(&gcm_kat, __ATOMIC_ACQUIRE) == 2;
}

#ifdef TL_DEBUG
void tl_gcm_selftest_hook(int spoil_row)
{
	gcm_kat_spoil = spoil_row;
	__atomic_store_n(&gcm_kat, -1, __ATOMIC_RELEASE);
}
#endif

struct tl_gcm *tl_gcm_new(void)
{
	if (!tl_gcm_supported())
		return NULL;
	return gcm_alloc();
}

struct tl_gcm *tl_gcm_new_unraced(void)
{
	if (!tl_gcm_supported() && !tl_gcm_library_faster())
		return NULL;
	return gcm_alloc();
}

void tl_gcm_free(struct tl_gcm *g)
{
	if (!g)
		return;
	memset(g, 0, sizeof(*g));
	__asm__ __volatile__("" : : "r"(g) : "memory"); /* the wipe must not be dropped as a dead store */
	free(g);
}

/* talaris_core.c includes every source in one unit: these go no further. */
#undef KEY128
#undef KEY256
#undef GCM_KAT_MAX
#undef RACE_ROUNDS
#undef RACE_MARGIN_PCT
#undef GCM_TARGET

#else /* not x86-64: the record layer keeps the library's AES-GCM */

struct tl_gcm {
	int unused;
};

int tl_gcm_supported(void) { return 0; }
int tl_gcm_selftest_failed(void) { return 0; }
int tl_gcm_library_faster(void) { return 0; }
#ifdef TL_DEBUG
void tl_gcm_selftest_hook(int spoil_row) { (void)spoil_row; }
#endif
struct tl_gcm *tl_gcm_new(void) { return NULL; }
struct tl_gcm *tl_gcm_new_unraced(void) { return NULL; }
void tl_gcm_free(struct tl_gcm *g) { free(g); }
int tl_gcm_setkey(struct tl_gcm *g, const uint8_t *key, size_t len)
{
	(void)g, (void)key, (void)len;
	return -1;
}
void tl_gcm_begin(struct tl_gcm *g, const uint8_t nonce[12], const uint8_t *aad, size_t aad_len)
{
	(void)g, (void)nonce, (void)aad, (void)aad_len;
}
void tl_gcm_decrypt(struct tl_gcm *g, const uint8_t *in, uint8_t *out, size_t n)
{
	(void)g, (void)in, (void)out, (void)n;
}
int tl_gcm_finish(struct tl_gcm *g, const uint8_t tag[16])
{
	(void)g, (void)tag;
	return -1;
}

#endif
