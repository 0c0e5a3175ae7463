/* codec/ws.c - RFC 6455 frame header codec, masking and close-code rules.
 *
 * The parser is written for a client: every frame it accepts came from a
 * server, so a MASK bit is a protocol error (RFC 6455 5.1) and there is no
 * key to read. The checks and their order mirror ws.ParseHeader (the Go
 * reference the C parser is differentially fuzzed against): nothing is
 * judged before two bytes are in, then RSV, OPCODE, MASKED, CTRL_FRAG,
 * CTRL_LEN, and LEN64 from the third byte, so a shorter prefix never
 * reports a different error than the whole header. */
#include "codec/ws.h"

#include <string.h>

int tl_ws_parse_hdr(const uint8_t *p, size_t n, tl_ws_hdr *h)
{
	if (n < 2)
		return TL_WS_NEED_MORE;

	uint8_t b0 = p[0], b1 = p[1];
	unsigned op = b0 & 0x0F;
	unsigned len7 = b1 & 0x7F;
	int fin = b0 >> 7;
	int ctrl = (op & 0x8) != 0;

	/* No extension is ever negotiated (the upgrade parser rejects
	 * Sec-WebSocket-Extensions), so any RSV bit is an error. */
	if (b0 & 0x70)
		return TL_WS_ERR_RSV;
	if ((op >= 0x3 && op <= 0x7) || op >= 0xB)
		return TL_WS_ERR_OPCODE;
	if (b1 & 0x80)
		return TL_WS_ERR_MASKED;
	if (ctrl && !fin)
		return TL_WS_ERR_CTRL_FRAG;
	/* A control frame with the 16- or 64-bit form is rejected even when
	 * the extended value would be <= 125: no conforming peer sends it and
	 * deciding on byte 1 keeps control-frame validation to two bytes. */
	if (ctrl && len7 > 125)
		return TL_WS_ERR_CTRL_LEN;

	uint64_t len;
	int hl;

	if (len7 < 126) {
		len = len7;
		hl = 2;
	} else if (len7 == 126) {
		if (n < 4)
			return TL_WS_NEED_MORE;
		len = (uint64_t)p[2] << 8 | p[3];
		hl = 4;
	} else {
		if (n >= 3 && (p[2] & 0x80))
			return TL_WS_ERR_LEN64;
		if (n < 10)
			return TL_WS_NEED_MORE;
		len = 0;
		for (int i = 2; i < 10; i++)
			len = len << 8 | p[i];
		hl = 10;
	}

	h->len = len;
	h->fin = (uint8_t)fin;
	h->rsv = 0;
	h->opcode = (uint8_t)op;
	h->masked = 0;
	memset(h->mask, 0, sizeof h->mask);
	return hl;
}

size_t tl_ws_write_hdr(uint8_t *out, int fin, int opcode, uint64_t len, const uint8_t key[4])
{
	size_t i = 0;

	out[i++] = (uint8_t)((fin ? 0x80 : 0x00) | (opcode & 0x0F));
	if (len < 126) {
		out[i++] = (uint8_t)(0x80 | len);
	} else if (len <= 0xFFFF) {
		out[i++] = 0x80 | 126;
		out[i++] = (uint8_t)(len >> 8);
		out[i++] = (uint8_t)len;
	} else {
		out[i++] = 0x80 | 127;
		for (int s = 56; s >= 0; s -= 8)
			out[i++] = (uint8_t)(len >> s);
	}
	memcpy(out + i, key, 4);
	return i + 4;
}

void tl_ws_mask(uint8_t *dst, const uint8_t *src, size_t n, const uint8_t key[4], size_t key_off)
{
	uint8_t k8[8];
	uint64_t k;
	size_t i = 0;

	/* Rotate the key so that byte 0 of every 8-byte block lines up with
	 * key[key_off]; built through a byte array and memcpy so the result
	 * is right on either endianness and needs no aligned access. */
	key_off &= 3;
	for (int j = 0; j < 8; j++)
		k8[j] = key[(key_off + (size_t)j) & 3];
	memcpy(&k, k8, sizeof k);

	for (; n - i >= 32; i += 32) {
		uint64_t a, b, c, d;
		memcpy(&a, src + i, 8);
		memcpy(&b, src + i + 8, 8);
		memcpy(&c, src + i + 16, 8);
		memcpy(&d, src + i + 24, 8);
		a ^= k; b ^= k; c ^= k; d ^= k;
		memcpy(dst + i, &a, 8);
		memcpy(dst + i + 8, &b, 8);
		memcpy(dst + i + 16, &c, 8);
		memcpy(dst + i + 24, &d, 8);
	}
	for (; n - i >= 8; i += 8) {
		uint64_t a;
		memcpy(&a, src + i, 8);
		a ^= k;
		memcpy(dst + i, &a, 8);
	}
	/* i is a multiple of 8, so the tail restarts at k8[0]. */
	for (size_t j = 0; i < n; i++, j++)
		dst[i] = src[i] ^ k8[j];
}

int tl_ws_close_code_ok(unsigned code)
{
	/* 1004 reserved, 1005/1006 never on the wire, 1015 TLS-only marker;
	 * 1016-2999 reserved for future RFCs; 3000-3999 registered,
	 * 4000-4999 private use. */
	if (code >= 1000 && code <= 1003)
		return 1;
	if (code >= 1007 && code <= 1014)
		return 1;
	return code >= 3000 && code <= 4999;
}
