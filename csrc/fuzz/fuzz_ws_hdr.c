/* fuzz_ws_hdr.c - frame header parser against a plain re-statement of RFC
 * 6455 section 5.2 (client side), prefix consistency, encode/parse round
 * trip, and masking against a byte loop.
 *
 * Input: the bytes to parse; the same bytes double as mask key, key offset
 * and payload for the masking checks. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/ws.h"

/* ref_parse: the rules in the order ws.ParseHeader (Go) checks them. */
static int ref_parse(const uint8_t *p, size_t n, tl_ws_hdr *h)
{
	if (n < 2)
		return TL_WS_NEED_MORE;
	int fin = (p[0] & 0x80) != 0;
	int rsv = (p[0] >> 4) & 7;
	int op = p[0] & 15;
	if (rsv)
		return TL_WS_ERR_RSV;
	if (!(op == 0 || op == 1 || op == 2 || op == 8 || op == 9 || op == 10))
		return TL_WS_ERR_OPCODE;
	if (p[1] & 0x80)
		return TL_WS_ERR_MASKED;
	if (op >= 8 && !fin)
		return TL_WS_ERR_CTRL_FRAG;
	int l7 = p[1] & 0x7F;
	if (op >= 8 && l7 > 125)
		return TL_WS_ERR_CTRL_LEN;
	uint64_t len = l7;
	int hl = 2;
	if (l7 == 126) {
		if (n < 4)
			return TL_WS_NEED_MORE;
		len = p[2] * 256u + p[3];
		hl = 4;
	} else if (l7 == 127) {
		if (n >= 3 && p[2] >= 0x80)
			return TL_WS_ERR_LEN64;
		if (n < 10)
			return TL_WS_NEED_MORE;
		len = 0;
		for (int i = 0; i < 8; i++)
			len = len * 256 + p[2 + i];
		hl = 10;
	}
	h->len = len;
	h->fin = (uint8_t)fin;
	h->opcode = (uint8_t)op;
	return hl;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	tl_ws_hdr h, rh;
	int r = tl_ws_parse_hdr(data, size, &h);
	int rr = ref_parse(data, size, &rh);

	if (r != rr)
		abort();
	if (r > 0) {
		if (!(r == 2 || r == 4 || r == 10) || (size_t)r > size)
			abort();
		if (h.len != rh.len || h.fin != rh.fin || h.opcode != rh.opcode || h.rsv || h.masked)
			abort();
	}

	/* Prefixes never contradict the whole. */
	for (size_t m = 0; m < size && m <= 12; m++) {
		tl_ws_hdr ph;
		int rp = tl_ws_parse_hdr(data, m, &ph);
		if (r > 0) {
			if ((size_t)r <= m ? rp != r : rp != TL_WS_NEED_MORE)
				abort();
		} else if (rp != TL_WS_NEED_MORE && rp != r) {
			abort();
		}
	}

	/* Encode what was parsed; unmasked again it must parse the same, with
	 * a header no longer than the one received (minimal encoding). */
	if (r > 0) {
		uint8_t key[4] = {1, 2, 3, 4}, out[TL_WS_MAX_HDR];
		size_t n = tl_ws_write_hdr(out, h.fin, h.opcode, h.len, key);
		if (n > TL_WS_MAX_HDR || n - 4 > (size_t)r || !(out[1] & 0x80))
			abort();
		out[1] &= 0x7F;
		tl_ws_hdr h2;
		if (tl_ws_parse_hdr(out, n - 4, &h2) != (int)(n - 4))
			abort();
		if (h2.len != h.len || h2.fin != h.fin || h2.opcode != h.opcode)
			abort();
	}

	/* Masking: key and offset from the input, payload from an unaligned
	 * start; out of place and in place, and the round trip. */
	if (size >= 6) {
		uint8_t key[4];
		memcpy(key, data, 4);
		size_t off = data[4];
		const uint8_t *src = data + 5;
		size_t n = size - 5;
		uint8_t *dst = malloc(n + 1), *dst2 = malloc(n + 1);
		if (!dst || !dst2)
			abort();
		tl_ws_mask(dst + 1, src, n, key, off);
		for (size_t i = 0; i < n; i++)
			if (dst[1 + i] != (src[i] ^ key[(off + i) & 3]))
				abort();
		memcpy(dst2, src, n);
		tl_ws_mask(dst2, dst2, n, key, off);
		if (memcmp(dst2, dst + 1, n) != 0)
			abort();
		tl_ws_mask(dst2, dst2, n, key, off);
		if (memcmp(dst2, src, n) != 0)
			abort();
		free(dst);
		free(dst2);
	}
	return 0;
}
