/* gcm_emul.h - a second, test-only build of gcm.c that runs on any AVX2 CPU
 * with AES-NI and PCLMULQDQ: its 256-bit VAES and VPCLMULQDQ operations
 * become two 128-bit ones, one per lane. cgo.mk compiles gcm.c with
 * -include of this file and -DTL_GCM_EMUL; every other line is the shipped
 * gcm.c. GCM_TARGET drops vaes and vpclmulqdq, so a 256-bit AES or
 * carry-less multiply left unreplaced fails to compile (target mismatch)
 * instead of running natively. Its functions are named tl_gcm_emul_* so a
 * program links both builds; test code that includes this header calls the
 * emulated build by the usual names. */
#ifndef TALARIS_TEST_GCM_EMUL_H
#define TALARIS_TEST_GCM_EMUL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#define tl_gcm_supported tl_gcm_emul_supported
#define tl_gcm_new tl_gcm_emul_new
#define tl_gcm_new_unraced tl_gcm_emul_new_unraced
#define tl_gcm_free tl_gcm_emul_free
#define tl_gcm_setkey tl_gcm_emul_setkey
#define tl_gcm_begin tl_gcm_emul_begin
#define tl_gcm_decrypt tl_gcm_emul_decrypt
#define tl_gcm_finish tl_gcm_emul_finish
#define tl_gcm_selftest_failed tl_gcm_emul_selftest_failed
#define tl_gcm_library_faster tl_gcm_emul_library_faster
#define tl_gcm_selftest_hook tl_gcm_emul_selftest_hook

#if defined(__x86_64__) && defined(TL_GCM_EMUL)
#include <immintrin.h>

#define GCM_TARGET __attribute__((target("avx2,aes,pclmul,ssse3,sse4.1")))

#define GCM_EMUL_LO(v) _mm256_castsi256_si128(v)
#define GCM_EMUL_HI(v) _mm256_extracti128_si256(v, 1)

GCM_TARGET static inline __m256i gcm_emul_aesenc(__m256i x, __m256i k)
{
	return _mm256_set_m128i(_mm_aesenc_si128(GCM_EMUL_HI(x), GCM_EMUL_HI(k)),
				_mm_aesenc_si128(GCM_EMUL_LO(x), GCM_EMUL_LO(k)));
}

GCM_TARGET static inline __m256i gcm_emul_aesenclast(__m256i x, __m256i k)
{
	return _mm256_set_m128i(_mm_aesenclast_si128(GCM_EMUL_HI(x), GCM_EMUL_HI(k)),
				_mm_aesenclast_si128(GCM_EMUL_LO(x), GCM_EMUL_LO(k)));
}

#undef _mm256_aesenc_epi128
#undef _mm256_aesenclast_epi128
#undef _mm256_clmulepi64_epi128
#define _mm256_aesenc_epi128(x, k) gcm_emul_aesenc(x, k)
#define _mm256_aesenclast_epi128(x, k) gcm_emul_aesenclast(x, k)
/* The selector is an immediate: a macro keeps it a constant. */
#define _mm256_clmulepi64_epi128(a, b, imm)                                                                 \
	__extension__({                                                                                      \
		__m256i a_ = (a), b_ = (b);                                                                  \
		_mm256_set_m128i(_mm_clmulepi64_si128(GCM_EMUL_HI(a_), GCM_EMUL_HI(b_), imm),                \
				 _mm_clmulepi64_si128(GCM_EMUL_LO(a_), GCM_EMUL_LO(b_), imm));              \
	})
#endif

#endif
