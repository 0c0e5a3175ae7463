/* crypto/gcm.h - AES-GCM decryption (NIST SP 800-38D) on 256-bit vectors: VAES
 * for the counter mode, VPCLMULQDQ for GHASH, sixteen blocks per step with
 * one reduction. The record layer (tlsrec.c) opens TLS 1.3 records with it
 * where the CPU has both (x86-64 with AVX2: AMD Zen 3 on, Intel Ice Lake
 * on); the libraries Debian ships run AES-GCM on 128-bit vectors only,
 * about twice the cycles per byte. Streaming: a record's ciphertext may
 * come in pieces of any size (it straddles receive slots). Decryption
 * only: the write side stays the library's. Calls nothing of talaris. */
#ifndef TALARIS_GCM_H
#define TALARIS_GCM_H

#include <stddef.h>
#include <stdint.h>

struct tl_gcm;

/* tl_gcm_supported says whether this CPU (and the kernel's saving of its
 * vector registers) can run tl_gcm, its power-on self-test passed and
 * (outside TL_DEBUG builds) it opened records faster than the library's
 * AES-GCM in the speed race run once after the self-test: 1 or 0. Always 0
 * off x86-64. */
int tl_gcm_supported(void);

/* tl_gcm_selftest_failed says whether the power-on self-test (run once,
 * by the first tl_gcm_supported or tl_gcm_new where the CPU runs tl_gcm)
 * found a message that did not open as the library's AES-GCM sealed it:
 * 1, and tl_gcm is then off for the process (tl_gcm_supported 0), else 0. */
int tl_gcm_selftest_failed(void);

/* tl_gcm_library_faster says whether the self-test passed but the library's
 * AES-GCM opened records faster than tl_gcm in this process's speed race
 * (run once after the self-test, in builds without TL_DEBUG): 1, and
 * tl_gcm is then off for the process (tl_gcm_supported 0), else 0. */
int tl_gcm_library_faster(void);

#ifdef TL_DEBUG
/* tl_gcm_selftest_hook (test builds) forgets the self-test's answer and
 * spoils the expected tag of row spoil_row (-1: none) in the next run. */
void tl_gcm_selftest_hook(int spoil_row);
#endif

/* tl_gcm_new allocates an unkeyed state (32-byte aligned). Returns NULL
 * when out of memory or !tl_gcm_supported(). Free with tl_gcm_free. */
struct tl_gcm *tl_gcm_new(void);

/* tl_gcm_new_unraced is tl_gcm_new for benchmarks: it also allocates where
 * only the speed race ruled tl_gcm out (tl_gcm_library_faster), so the two
 * can still be measured side by side. */
struct tl_gcm *tl_gcm_new_unraced(void);

/* tl_gcm_free wipes g's key schedule, hash key and state and frees it.
 * Safe on NULL. */
void tl_gcm_free(struct tl_gcm *g);

/* tl_gcm_setkey keys g with an AES key of len bytes (16 or 32). Returns 0,
 * or -1 for another length (g is then unkeyed, the previous key wiped). */
int tl_gcm_setkey(struct tl_gcm *g, const uint8_t *key, size_t len);

/* tl_gcm_begin starts a message under a 96-bit nonce with aad_len bytes of
 * additional data. Any message under way is dropped. */
void tl_gcm_begin(struct tl_gcm *g, const uint8_t nonce[12], const uint8_t *aad, size_t aad_len);

/* tl_gcm_decrypt decrypts the next n bytes of the message's ciphertext
 * from in to out (the same pointer, or not overlapping). The plaintext is
 * not authentic until tl_gcm_finish says so: the caller must not act on
 * it before. */
void tl_gcm_decrypt(struct tl_gcm *g, const uint8_t *in, uint8_t *out, size_t n);

/* tl_gcm_finish ends the message and compares its tag with tag (16 bytes,
 * in constant time). Returns 0 when they match, -1 when not. */
int tl_gcm_finish(struct tl_gcm *g, const uint8_t tag[16]);

#endif
