/* test_utf8.c - the validator against Autobahn section 6 style sequences,
 * every code point, and every split of every case: a streaming validator
 * is only correct if where the message is cut never changes the answer. */
#include <stdint.h>
#include <string.h>

#include "codec/utf8.h"
#include "check.h"

struct vec {
	const char *name;
	const char *s;
	size_t n;
	int fail_at;  /* index of the byte that makes the prefix invalid, -1 if none */
	int valid;    /* whole buffer is valid UTF-8 */
};

#define V(name, lit, fail_at, valid) {name, lit, sizeof(lit) - 1, fail_at, valid}

static const struct vec vecs[] = {
	/* 6.1 - 6.3: valid text */
	V("empty", "", -1, 1),
	V("ascii", "Hello, world", -1, 1),
	V("6.2 mixed", "Hello-\xC2\xB5@\xC3\x9F\xC3\xB6\xC3\xA4\xC3\xBC\xC3\xA0\xC3\xA1-UTF-8!!", -1, 1),
	V("6.3 kosme", "\xCE\xBA\xE1\xBD\xB9\xCF\x83\xCE\xBC\xCE\xB5", -1, 1),
	/* 6.4: fail fast in the middle of a message */
	V("6.4.1 kosme+surrogate", "\xCE\xBA\xE1\xBD\xB9\xCF\x83\xCE\xBC\xCE\xB5\xED\xA0\x80" "edited", 12, 0),
	V("6.4.2 F4 90 at once", "\xCE\xBA\xE1\xBD\xB9\xCF\x83\xCE\xBC\xCE\xB5\xF4\x90\x80\x80" "edited", 12, 0),
	V("6.4.3 F4 90", "\xF4\x90", 1, 0),
	V("6.4.4 ED A0", "\xED\xA0", 1, 0),
	/* 6.5 - 6.7: boundaries */
	V("U+0000", "\x00", -1, 1),
	V("U+007F", "\x7F", -1, 1),
	V("U+0080", "\xC2\x80", -1, 1),
	V("U+07FF", "\xDF\xBF", -1, 1),
	V("U+0800", "\xE0\xA0\x80", -1, 1),
	V("U+D7FF", "\xED\x9F\xBF", -1, 1),
	V("U+E000", "\xEE\x80\x80", -1, 1),
	V("U+FFFD", "\xEF\xBF\xBD", -1, 1),
	V("U+FFFF", "\xEF\xBF\xBF", -1, 1),
	V("U+FFFE", "\xEF\xBF\xBE", -1, 1),
	V("U+10000", "\xF0\x90\x80\x80", -1, 1),
	V("U+10FFFF", "\xF4\x8F\xBF\xBF", -1, 1),
	V("U+110000", "\xF4\x90\x80\x80", 1, 0),
	V("U+13FFFF", "\xF4\xBF\xBF\xBF", 1, 0),
	V("F5 lead", "\xF5\x80\x80\x80", 0, 0),
	V("F7 BF BF BF", "\xF7\xBF\xBF\xBF", 0, 0),
	/* 6.8: 5- and 6-byte forms */
	V("5-byte", "\xF8\x88\x80\x80\x80", 0, 0),
	V("6-byte", "\xFC\x84\x80\x80\x80\x80", 0, 0),
	V("6-byte max", "\xFD\xBF\xBF\xBF\xBF\xBF", 0, 0),
	/* 6.9 - 6.10: lone continuation bytes */
	V("lone 80", "\x80", 0, 0),
	V("lone BF", "\xBF", 0, 0),
	V("80 BF", "\x80\xBF", 0, 0),
	V("80 BF 80", "\x80\xBF\x80", 0, 0),
	V("a 80", "a\x80", 1, 0),
	V("2-byte + extra cont", "\xC2\x80\x80", 2, 0),
	V("3-byte + extra cont", "\xE2\x82\xAC\xBF", 3, 0),
	/* 6.11: lonely start characters followed by space */
	V("C0 20", "\xC0\x20", 0, 0),
	V("C2 20", "\xC2\x20", 1, 0),
	V("DF 20", "\xDF\x20", 1, 0),
	V("E0 20", "\xE0\x20", 1, 0),
	V("E1 80 20", "\xE1\x80\x20", 2, 0),
	V("F0 20", "\xF0\x20", 1, 0),
	V("F1 80 80 20", "\xF1\x80\x80\x20", 3, 0),
	/* 6.12 - 6.13: truncated at end (prefix viable, message not complete) */
	V("C2 cut", "\xC2", -1, 0),
	V("E0 cut", "\xE0", -1, 0),
	V("E0 A0 cut", "\xE0\xA0", -1, 0),
	V("ED 9F cut", "\xED\x9F", -1, 0),
	V("F0 90 80 cut", "\xF0\x90\x80", -1, 0),
	V("F4 8F BF cut", "\xF4\x8F\xBF", -1, 0),
	V("kosme cut", "\xCE\xBA\xE1\xBD", -1, 0),
	V("cut then ascii", "\xE2\x82" "a", 2, 0),
	/* 6.14: impossible bytes */
	V("FE", "\xFE", 0, 0),
	V("FF", "\xFF", 0, 0),
	V("FE FE FF FF", "\xFE\xFE\xFF\xFF", 0, 0),
	/* 6.16 - 6.18: overlongs */
	V("C0 AF", "\xC0\xAF", 0, 0),
	V("E0 80 AF", "\xE0\x80\xAF", 1, 0),
	V("F0 80 80 AF", "\xF0\x80\x80\xAF", 1, 0),
	V("F8 80 80 80 AF", "\xF8\x80\x80\x80\xAF", 0, 0),
	V("C1 BF", "\xC1\xBF", 0, 0),
	V("E0 9F BF", "\xE0\x9F\xBF", 1, 0),
	V("F0 8F BF BF", "\xF0\x8F\xBF\xBF", 1, 0),
	V("C0 80", "\xC0\x80", 0, 0),
	V("E0 80 80", "\xE0\x80\x80", 1, 0),
	V("F0 80 80 80", "\xF0\x80\x80\x80", 1, 0),
	/* 6.19 - 6.20: surrogates, single and paired */
	V("U+D800", "\xED\xA0\x80", 1, 0),
	V("U+DB7F", "\xED\xAD\xBF", 1, 0),
	V("U+DB80", "\xED\xAE\x80", 1, 0),
	V("U+DBFF", "\xED\xAF\xBF", 1, 0),
	V("U+DC00", "\xED\xB0\x80", 1, 0),
	V("U+DF80", "\xED\xBE\x80", 1, 0),
	V("U+DFFF", "\xED\xBF\xBF", 1, 0),
	V("D800 DC00", "\xED\xA0\x80\xED\xB0\x80", 1, 0),
	V("DBFF DFFF", "\xED\xAF\xBF\xED\xBF\xBF", 1, 0),
	/* 6.21: noncharacters are valid */
	V("U+FDD0", "\xEF\xB7\x90", -1, 1),
	V("U+1FFFE", "\xF0\x9F\xBF\xBE", -1, 1),
	V("U+10FFFE", "\xF4\x8F\xBF\xBE", -1, 1),
	/* fast path edges: invalid byte just after an 8- and 16-byte run */
	V("8 ascii + bad", "abcdefgh\xFF", 8, 0),
	V("16 ascii + bad", "abcdefghijklmnop\xC0", 16, 0),
	V("15 ascii + 4byte", "abcdefghijklmno\xF0\x9F\x98\x80" "abcdefghijklmnop", -1, 1),
	V("json", "{\"op\":\"subscribe\",\"args\":[\"orderbook.50.BTCUSDT\"],\"note\":\"\xE2\x82\xAC\"}", -1, 1),
};

/* feed_split feeds p[0..n) in the pieces given by cuts (ascending, may
 * repeat) and returns -1 on failure, else 1 if complete, 0 if cut. */
static int feed_split(const uint8_t *p, size_t n, const size_t *cuts, size_t ncuts)
{
	tl_utf8 u;
	size_t at = 0;

	tl_utf8_reset(&u);
	for (size_t c = 0; c <= ncuts; c++) {
		size_t end = c < ncuts ? cuts[c] : n;
		if (tl_utf8_feed(&u, p + at, end - at) < 0)
			return -1;
		at = end;
	}
	return tl_utf8_complete(&u);
}

static int expect_split(const struct vec *v)
{
	return v->fail_at >= 0 ? -1 : v->valid;
}

static void test_vectors(void)
{
	for (size_t k = 0; k < sizeof vecs / sizeof vecs[0]; k++) {
		const struct vec *v = &vecs[k];
		const uint8_t *p = (const uint8_t *)v->s;
		int want = expect_split(v);
		tl_utf8 u;

		CHECK_CTX(v->name);
		CHECK_ROW_EQ(tl_utf8_valid(p, v->n), v->valid);
		CHECK_ROW_EQ(feed_split(p, v->n, NULL, 0), want);

		/* Byte by byte: the failure must be reported by the very byte
		 * at fail_at, not earlier and not later. */
		tl_utf8_reset(&u);
		int failed_at = -1;
		for (size_t i = 0; i < v->n; i++) {
			if (tl_utf8_feed(&u, p + i, 1) < 0) {
				failed_at = (int)i;
				break;
			}
		}
		CHECK_ROW_EQ(failed_at, v->fail_at);
		if (failed_at < 0)
			CHECK_ROW_EQ(tl_utf8_complete(&u), v->valid);

		/* Every two- and three-way split. */
		for (size_t a = 0; a <= v->n; a++) {
			size_t c1[1] = {a};
			CHECK_ROW_EQ(feed_split(p, v->n, c1, 1), want);
			for (size_t b = a; b <= v->n; b++) {
				size_t c2[2] = {a, b};
				CHECK_ROW_EQ(feed_split(p, v->n, c2, 2), want);
			}
		}
	}
}

static size_t encode(uint32_t cp, uint8_t *o, int width)
{
	switch (width) {
	case 1: o[0] = (uint8_t)cp; return 1;
	case 2: o[0] = (uint8_t)(0xC0 | cp >> 6); o[1] = (uint8_t)(0x80 | (cp & 63)); return 2;
	case 3:
		o[0] = (uint8_t)(0xE0 | cp >> 12); o[1] = (uint8_t)(0x80 | ((cp >> 6) & 63));
		o[2] = (uint8_t)(0x80 | (cp & 63)); return 3;
	default:
		o[0] = (uint8_t)(0xF0 | cp >> 18); o[1] = (uint8_t)(0x80 | ((cp >> 12) & 63));
		o[2] = (uint8_t)(0x80 | ((cp >> 6) & 63)); o[3] = (uint8_t)(0x80 | (cp & 63)); return 4;
	}
}

static int minimal_width(uint32_t cp)
{
	return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

/* Every scalar value in its minimal form is valid and splits cleanly;
 * surrogates and every overlong or out-of-range form are rejected. Uses
 * plain CHECK sparingly in the loop to keep the run short under ASan. */
static void test_all_code_points(void)
{
	uint8_t b[8];
	unsigned long bad = 0;

	for (uint32_t cp = 0; cp <= 0x1FFFFF; cp++) {
		int mw = minimal_width(cp);
		for (int w = mw; w <= 4; w++) {
			if (w == 1 && cp >= 0x80)
				continue;
			if (w == 2 && cp >= 0x800)
				continue;
			if (w == 3 && cp >= 0x10000)
				continue;
			size_t n = encode(cp, b, w);
			int want = w == mw && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
			if (tl_utf8_valid(b, n) != want)
				bad++;
			if (want) {
				/* split after each byte of the code point */
				for (size_t a = 1; a < n; a++) {
					tl_utf8 u;
					tl_utf8_reset(&u);
					if (tl_utf8_feed(&u, b, a) != 0 || tl_utf8_complete(&u))
						bad++;
					if (tl_utf8_feed(&u, b + a, n - a) != 0 || !tl_utf8_complete(&u))
						bad++;
				}
			} else {
				/* invalid forms fail no later than their second byte
				 * (overlong / surrogate / out of range are all decided
				 * there), or at the first byte for C0 C1 F5..F7 */
				tl_utf8 u;
				int at = -1;
				tl_utf8_reset(&u);
				for (size_t i = 0; i < n; i++) {
					if (tl_utf8_feed(&u, b + i, 1) < 0) {
						at = (int)i;
						break;
					}
				}
				if (at < 0 || at > 1)
					bad++;
			}
		}
	}
	CHECK_EQ(bad, 0);
}

/* Exhaustive over all 2-byte inputs against a rule written from RFC 3629's
 * table rather than from the DFA. */
static int rfc_two_bytes(uint8_t a, uint8_t b, int *fail_at)
{
	int cont = b >= 0x80 && b <= 0xBF;
	*fail_at = -1;
	if (a < 0x80) {
		if (b < 0x80)
			return 1;
		if (b >= 0xC2 && b <= 0xF4)
			return 0; /* valid so far, incomplete */
		*fail_at = 1;
		return 0;
	}
	if (a < 0xC2 || a > 0xF4) {
		*fail_at = 0;
		return 0;
	}
	int lo = 0x80, hi = 0xBF;
	if (a == 0xE0) lo = 0xA0;
	if (a == 0xED) hi = 0x9F;
	if (a == 0xF0) lo = 0x90;
	if (a == 0xF4) hi = 0x8F;
	if (!cont || b < lo || b > hi) {
		*fail_at = 1;
		return 0;
	}
	return a <= 0xDF;
}

static void test_all_pairs(void)
{
	unsigned long bad = 0;

	for (int a = 0; a < 256; a++) {
		for (int b = 0; b < 256; b++) {
			uint8_t s[2] = {(uint8_t)a, (uint8_t)b};
			int fail_at, at = -1;
			int want = rfc_two_bytes(s[0], s[1], &fail_at);
			tl_utf8 u;

			if (tl_utf8_valid(s, 2) != want)
				bad++;
			tl_utf8_reset(&u);
			for (int i = 0; i < 2; i++) {
				if (tl_utf8_feed(&u, s + i, 1) < 0) {
					at = i;
					break;
				}
			}
			if (at != fail_at)
				bad++;
		}
	}
	CHECK_EQ(bad, 0);
}

/* The word-at-a-time path must locate a bad byte at every position and
 * every alignment, and stay right when a multi-byte character straddles
 * an 8- or 16-byte block. */
static void test_fast_path(void)
{
	static uint8_t buf[128 + 8];

	for (size_t off = 0; off < 8; off++) {
		for (size_t len = 0; len <= 80; len++) {
			uint8_t *p = buf + off;
			memset(p, 'x', len);
			CHECK(tl_utf8_valid(p, len) == 1);
			for (size_t bad = 0; bad < len; bad++) {
				tl_utf8 u;
				p[bad] = 0xFF;
				CHECK(tl_utf8_valid(p, len) == 0);
				tl_utf8_reset(&u);
				CHECK(tl_utf8_feed(&u, p, bad) == 0);
				CHECK(tl_utf8_feed(&u, p + bad, len - bad) == -1);
				p[bad] = 'x';
			}
			for (size_t at = 0; at + 3 <= len; at++) {
				memcpy(p + at, "\xE2\x82\xAC", 3);
				CHECK(tl_utf8_valid(p, len) == 1);
				CHECK(tl_utf8_valid(p, at + 2) == 0);
				memset(p + at, 'x', 3);
			}
		}
	}
}

/* After a failure, further feeds keep failing (no out-of-range state). */
static void test_sticky_failure(void)
{
	tl_utf8 u;

	tl_utf8_reset(&u);
	CHECK(tl_utf8_feed(&u, (const uint8_t *)"\xC0", 1) == -1);
	CHECK(tl_utf8_feed(&u, (const uint8_t *)"a", 1) == -1);
	CHECK(tl_utf8_feed(&u, (const uint8_t *)"", 0) == -1);
	tl_utf8_reset(&u);
	CHECK(tl_utf8_feed(&u, (const uint8_t *)"a", 1) == 0);
	CHECK(tl_utf8_complete(&u));
}

int main(void)
{
	test_vectors();
	test_all_code_points();
	test_all_pairs();
	test_fast_path();
	test_sticky_failure();
	CHECK_DONE("test_utf8");
}
