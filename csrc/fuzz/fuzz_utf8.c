/* fuzz_utf8.c - the DFA validator against a plain decoder written from
 * RFC 3629 in the most obvious way, under arbitrary fragmentation.
 *
 * Input: byte 0 and byte 1 pick two cut points, the rest is the text.
 * Checked:
 *   - one-shot tl_utf8_valid == reference;
 *   - feeding in three pieces (cuts from bytes 0/1) gives the same verdict;
 *   - byte-by-byte feeding fails exactly at the first byte after which no
 *     continuation could make the text valid (fail-fast), as computed by
 *     the reference plus a brute-force search over completions. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/utf8.h"

enum { REF_INVALID = 0, REF_VALID = 1, REF_TRUNCATED = 2 };

/* ref_decode decodes code point by code point. REF_TRUNCATED means the
 * text ends inside a sequence whose present bytes are all continuation
 * bytes; *tail is where that sequence starts. */
static int ref_decode(const uint8_t *p, size_t n, size_t *tail)
{
	size_t i = 0;

	while (i < n) {
		uint8_t c = p[i];
		size_t need;
		uint32_t cp, min;

		if (c < 0x80) {
			i++;
			continue;
		} else if ((c & 0xE0) == 0xC0) {
			need = 1; cp = c & 0x1F; min = 0x80;
		} else if ((c & 0xF0) == 0xE0) {
			need = 2; cp = c & 0x0F; min = 0x800;
		} else if ((c & 0xF8) == 0xF0) {
			need = 3; cp = c & 0x07; min = 0x10000;
		} else {
			return REF_INVALID;
		}
		if (n - i - 1 < need) {
			for (size_t k = i + 1; k < n; k++)
				if ((p[k] & 0xC0) != 0x80)
					return REF_INVALID;
			*tail = i;
			return REF_TRUNCATED;
		}
		for (size_t k = 1; k <= need; k++) {
			if ((p[i + k] & 0xC0) != 0x80)
				return REF_INVALID;
			cp = cp << 6 | (p[i + k] & 0x3F);
		}
		if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
			return REF_INVALID;
		i += need + 1;
	}
	return REF_VALID;
}

static int ref_valid(const uint8_t *p, size_t n)
{
	size_t t;
	return ref_decode(p, n, &t) == REF_VALID;
}

/* The range a second byte may take has its ends among these, so trying
 * them for each missing byte finds a completion whenever one exists. */
static const uint8_t probes[] = {0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF};

static int complete_from(uint8_t *seq, size_t have, size_t want)
{
	if (have == want)
		return ref_valid(seq, want);
	for (size_t k = 0; k < sizeof probes; k++) {
		seq[have] = probes[k];
		if (complete_from(seq, have + 1, want))
			return 1;
	}
	return 0;
}

/* viable reports whether p[0..n) is a prefix of some valid UTF-8 text. */
static int viable(const uint8_t *p, size_t n)
{
	size_t t;
	int r = ref_decode(p, n, &t);
	uint8_t seq[4];
	size_t want;

	if (r != REF_TRUNCATED)
		return r == REF_VALID;
	want = p[t] >= 0xF0 ? 4 : p[t] >= 0xE0 ? 3 : 2;
	memcpy(seq, p + t, n - t);
	return complete_from(seq, n - t, want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	const uint8_t *p = data + 2;
	size_t n = size - 2;
	size_t c1 = n ? data[0] % (n + 1) : 0;
	size_t c2 = n ? data[1] % (n + 1) : 0;
	if (c1 > c2) {
		size_t t = c1; c1 = c2; c2 = t;
	}

	int want = ref_valid(p, n);
	if (tl_utf8_valid(p, n) != want)
		abort();

	/* three pieces */
	tl_utf8 u;
	tl_utf8_reset(&u);
	int ok = tl_utf8_feed(&u, p, c1) == 0 &&
		 tl_utf8_feed(&u, p + c1, c2 - c1) == 0 &&
		 tl_utf8_feed(&u, p + c2, n - c2) == 0;
	if ((ok && tl_utf8_complete(&u)) != want)
		abort();

	/* byte by byte: fail-fast position */
	size_t at = n;
	tl_utf8_reset(&u);
	for (size_t i = 0; i < n; i++) {
		if (tl_utf8_feed(&u, p + i, 1) < 0) {
			at = i;
			break;
		}
	}
	if (at < n) {
		if (!viable(p, at) || viable(p, at + 1))
			abort();
		/* the piecewise run must also have failed */
		if (ok)
			abort();
	} else {
		if (!viable(p, n))
			abort();
		if (tl_utf8_complete(&u) != want)
			abort();
	}
	return 0;
}
