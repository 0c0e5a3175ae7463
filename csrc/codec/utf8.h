/* codec/utf8.h - streaming UTF-8 validation per RFC 3629 (what RFC 6455 requires
 * of text messages and close reasons): no overlongs, no surrogates, nothing
 * above U+10FFFF. Fails fast: an invalid byte is reported by the call that
 * sees it, even when the message is not complete. */
#ifndef TALARIS_UTF8_H
#define TALARIS_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* tl_utf8 is the state carried between fragments; zero means "at a code
 * point boundary". */
typedef struct tl_utf8 {
	uint32_t state;
} tl_utf8;

/* tl_utf8_reset puts u at a code point boundary. */
static inline void tl_utf8_reset(tl_utf8 *u) { u->state = 0; }

/* tl_utf8_feed validates n more bytes of one message. Returns 0 while the
 * bytes so far can still form valid UTF-8, -1 as soon as they cannot (u is
 * then undefined until reset). "As soon as" is exact: the call that
 * receives the first byte no continuation could make valid fails (C0, F5,
 * a stray 80 at once; E0 80, ED A0, F0 80, F4 90 at their second byte).
 * In practice u stays failed: later feeds keep returning -1 until reset.
 * Allocation-free; reads only p[0..n). */
int tl_utf8_feed(tl_utf8 *u, const uint8_t *p, size_t n);

/* tl_utf8_complete returns 1 when u ends at a code point boundary (the
 * message may end here), 0 when a code point is cut. */
static inline int tl_utf8_complete(const tl_utf8 *u) { return u->state == 0; }

/* tl_utf8_valid validates a whole buffer: 1 valid, 0 not. */
int tl_utf8_valid(const uint8_t *p, size_t n);

#endif
