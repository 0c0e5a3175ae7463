/* frames.h - server frames for the C tests: the header RFC 6455 gives an
 * unmasked frame, with the payload after it. */
#ifndef TALARIS_TEST_FRAMES_H
#define TALARIS_TEST_FRAMES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* test_frame writes a frame (FIN when fin, opcode op, payload p[0..n))
 * to out and returns its length: the shortest length form, or the 16-bit
 * one for n < 126 when len16 (legal, not minimal). out holds n + 10. */
static inline size_t test_frame(uint8_t *out, int fin, int op, const void *p, size_t n, int len16)
{
	size_t k = 0;
	out[k++] = (uint8_t)((fin ? 0x80 : 0) | op);
	if (n < 126 && !len16) {
		out[k++] = (uint8_t)n;
	} else if (n < 65536) {
		out[k++] = 126;
		out[k++] = (uint8_t)(n >> 8);
		out[k++] = (uint8_t)n;
	} else {
		out[k++] = 127;
		for (int b = 7; b >= 0; b--)
			out[k++] = (uint8_t)(n >> (8 * b));
	}
	if (n)
		memcpy(out + k, p, n);
	return k + n;
}

#endif
