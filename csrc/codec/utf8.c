/* codec/utf8.c - streaming UTF-8 validator (RFC 3629) for RFC 6455 text frames.
 *
 * A byte-class DFA: every byte maps to one of 12 classes and the state
 * moves on (state, class). The states are chosen so that the RFC 3629
 * table (section 4) is enforced one byte at a time, which is what makes
 * the validator fail fast: E0 80, ED A0, F0 80 and F4 90 are rejected at
 * their second byte, C0/C1/F5..FF at their first, instead of after a whole
 * code point has been collected and decoded. */
#include "codec/utf8.h"

#include <string.h>

enum {
	S_ACC = 0, /* at a code point boundary; must be 0 (tl_utf8_complete) */
	S_C1,      /* one more 80..BF needed */
	S_C2,      /* two more 80..BF needed */
	S_C3,      /* three more 80..BF needed */
	S_E0,      /* after E0: A0..BF (shorter would be overlong) */
	S_ED,      /* after ED: 80..9F (A0..BF would be a surrogate) */
	S_F0,      /* after F0: 90..BF (shorter would be overlong) */
	S_F4,      /* after F4: 80..8F (90.. would exceed U+10FFFF) */
	S_REJ,     /* sink */
	S_COUNT
};

enum {
	K_ASCII, /* 00..7F */
	K_80,    /* 80..8F */
	K_90,    /* 90..9F */
	K_A0,    /* A0..BF */
	K_BAD,   /* C0, C1 (always overlong), F5..FF (always > U+10FFFF) */
	K_L2,    /* C2..DF */
	K_E0,
	K_L3,    /* E1..EC, EE, EF */
	K_ED,
	K_F0,
	K_L4,    /* F1..F3 */
	K_F4,
	K_COUNT
};

static const uint8_t byte_class[256] = {
	[0x00 ... 0x7F] = K_ASCII,
	[0x80 ... 0x8F] = K_80,
	[0x90 ... 0x9F] = K_90,
	[0xA0 ... 0xBF] = K_A0,
	[0xC0 ... 0xC1] = K_BAD,
	[0xC2 ... 0xDF] = K_L2,
	[0xE0] = K_E0,
	[0xE1 ... 0xEC] = K_L3,
	[0xED] = K_ED,
	[0xEE ... 0xEF] = K_L3,
	[0xF0] = K_F0,
	[0xF1 ... 0xF3] = K_L4,
	[0xF4] = K_F4,
	[0xF5 ... 0xFF] = K_BAD,
};

#define R S_REJ
/* Rows are states, columns classes:
 *            ASCII  80    90    A0    BAD  L2    E0    L3    ED    F0    L4    F4 */
static const uint8_t next_state[S_COUNT][K_COUNT] = {
	[S_ACC] = {S_ACC, R,    R,    R,    R,   S_C1, S_E0, S_C2, S_ED, S_F0, S_C3, S_F4},
	[S_C1]  = {R,     S_ACC, S_ACC, S_ACC, R, R,   R,    R,    R,    R,    R,    R},
	[S_C2]  = {R,     S_C1, S_C1, S_C1, R,   R,    R,    R,    R,    R,    R,    R},
	[S_C3]  = {R,     S_C2, S_C2, S_C2, R,   R,    R,    R,    R,    R,    R,    R},
	[S_E0]  = {R,     R,    R,    S_C1, R,   R,    R,    R,    R,    R,    R,    R},
	[S_ED]  = {R,     S_C1, S_C1, R,    R,   R,    R,    R,    R,    R,    R,    R},
	[S_F0]  = {R,     R,    S_C2, S_C2, R,   R,    R,    R,    R,    R,    R,    R},
	[S_F4]  = {R,     S_C2, R,    R,    R,   R,    R,    R,    R,    R,    R,    R},
	[S_REJ] = {R,     R,    R,    R,    R,   R,    R,    R,    R,    R,    R,    R},
};
#undef R

#define HIGH_BITS 0x8080808080808080ull

static inline uint64_t load64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, sizeof v); /* unaligned-safe; compiles to one mov */
	return v;
}

int tl_utf8_feed(tl_utf8 *u, const uint8_t *p, size_t n)
{
	uint32_t s = u->state;
	size_t i = 0;

	/* A reset-less call after a failure must keep failing rather than
	 * index the table with a stale state. */
	if (s >= S_REJ) {
		u->state = S_REJ;
		return -1;
	}
	while (i < n) {
		if (s == S_ACC) {
			/* Market data is almost all ASCII JSON: skip it 16, then
			 * 8 bytes at a time, and only fall into the DFA at the
			 * first word holding a high bit. */
			while (n - i >= 16 && ((load64(p + i) | load64(p + i + 8)) & HIGH_BITS) == 0)
				i += 16;
			while (n - i >= 8 && (load64(p + i) & HIGH_BITS) == 0)
				i += 8;
			while (i < n && p[i] < 0x80)
				i++;
			if (i == n)
				break;
		}
		s = next_state[s][byte_class[p[i++]]];
		if (s == S_REJ) {
			u->state = S_REJ;
			return -1;
		}
	}
	u->state = s;
	return 0;
}

int tl_utf8_valid(const uint8_t *p, size_t n)
{
	tl_utf8 u = {0};

	return tl_utf8_feed(&u, p, n) == 0 && tl_utf8_complete(&u);
}
