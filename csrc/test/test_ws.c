/* test_ws.c - frame header parse/encode, masking and close codes. */
#include <stdint.h>
#include <string.h>

#include "codec/ws.h"
#include "check.h"

struct hcase {
	const char *name;
	uint8_t b[16];
	size_t n;
	int ret;        /* expected tl_ws_parse_hdr result on all n bytes */
	uint64_t len;   /* when ret > 0 */
	int fin, op;
};

static const struct hcase hcases[] = {
	{"text 0", {0x81, 0x00}, 2, 2, 0, 1, TL_OP_TEXT},
	{"text 5", {0x81, 0x05}, 2, 2, 5, 1, TL_OP_TEXT},
	{"binary 125", {0x82, 0x7D}, 2, 2, 125, 1, TL_OP_BINARY},
	{"cont no fin", {0x00, 0x03}, 2, 2, 3, 0, TL_OP_CONT},
	{"text no fin", {0x01, 0x03}, 2, 2, 3, 0, TL_OP_TEXT},
	{"16-bit 126", {0x82, 0x7E, 0x00, 0x7E}, 4, 4, 126, 1, TL_OP_BINARY},
	{"16-bit 65535", {0x82, 0x7E, 0xFF, 0xFF}, 4, 4, 65535, 1, TL_OP_BINARY},
	{"64-bit 65536", {0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0, 0}, 10, 10, 65536, 1, TL_OP_BINARY},
	{"64-bit 2^63-1", {0x82, 0x7F, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, 10, 10,
	 0x7FFFFFFFFFFFFFFFull, 1, TL_OP_BINARY},
	{"64-bit 2^63", {0x82, 0x7F, 0x80, 0, 0, 0, 0, 0, 0, 0}, 10, TL_WS_ERR_LEN64, 0, 0, 0},
	{"64-bit all ones", {0x82, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, 10, TL_WS_ERR_LEN64, 0, 0, 0},
	{"non-minimal 16-bit 5", {0x81, 0x7E, 0x00, 0x05}, 4, 4, 5, 1, TL_OP_TEXT},
	{"non-minimal 64-bit 5", {0x81, 0x7F, 0, 0, 0, 0, 0, 0, 0, 5}, 10, 10, 5, 1, TL_OP_TEXT},
	{"non-minimal 64-bit 300", {0x82, 0x7F, 0, 0, 0, 0, 0, 0, 0x01, 0x2C}, 10, 10, 300, 1, TL_OP_BINARY},
	{"close 2", {0x88, 0x02}, 2, 2, 2, 1, TL_OP_CLOSE},
	{"close 0", {0x88, 0x00}, 2, 2, 0, 1, TL_OP_CLOSE},
	{"ping 125", {0x89, 0x7D}, 2, 2, 125, 1, TL_OP_PING},
	{"pong 0", {0x8A, 0x00}, 2, 2, 0, 1, TL_OP_PONG},
	{"rsv1", {0xC1, 0x00}, 2, TL_WS_ERR_RSV, 0, 0, 0},
	{"rsv2", {0xA1, 0x00}, 2, TL_WS_ERR_RSV, 0, 0, 0},
	{"rsv3", {0x91, 0x00}, 2, TL_WS_ERR_RSV, 0, 0, 0},
	{"rsv1 alone: judged at 2 bytes", {0xC1}, 1, TL_WS_NEED_MORE, 0, 0, 0},
	{"rsv beats opcode", {0xF3, 0x00}, 2, TL_WS_ERR_RSV, 0, 0, 0},
	{"masked text", {0x81, 0x85, 1, 2, 3, 4}, 6, TL_WS_ERR_MASKED, 0, 0, 0},
	{"masked text, 2 bytes", {0x81, 0x80}, 2, TL_WS_ERR_MASKED, 0, 0, 0},
	{"ping no fin", {0x09, 0x00}, 2, TL_WS_ERR_CTRL_FRAG, 0, 0, 0},
	{"close no fin", {0x08, 0x00}, 2, TL_WS_ERR_CTRL_FRAG, 0, 0, 0},
	{"close no fin, 1 byte", {0x08}, 1, TL_WS_NEED_MORE, 0, 0, 0},
	{"opcode beats masked", {0x83, 0x80}, 2, TL_WS_ERR_OPCODE, 0, 0, 0},
	{"pong no fin", {0x0A, 0x01}, 2, TL_WS_ERR_CTRL_FRAG, 0, 0, 0},
	{"ping 126", {0x89, 0x7E, 0x00, 0x7E}, 4, TL_WS_ERR_CTRL_LEN, 0, 0, 0},
	{"ping 16-bit 5", {0x89, 0x7E, 0x00, 0x05}, 4, TL_WS_ERR_CTRL_LEN, 0, 0, 0},
	{"close 64-bit", {0x88, 0x7F}, 2, TL_WS_ERR_CTRL_LEN, 0, 0, 0},
	{"masked beats ctrl frag", {0x09, 0x80}, 2, TL_WS_ERR_MASKED, 0, 0, 0},
	{"masked beats ctrl len", {0x89, 0xFE}, 2, TL_WS_ERR_MASKED, 0, 0, 0},
	{"empty", {0}, 0, TL_WS_NEED_MORE, 0, 0, 0},
	{"1 byte", {0x81}, 1, TL_WS_NEED_MORE, 0, 0, 0},
	{"16-bit 3 bytes", {0x82, 0x7E, 0x01}, 3, TL_WS_NEED_MORE, 0, 0, 0},
	{"64-bit 9 bytes", {0x82, 0x7F, 0, 0, 0, 0, 0, 1, 0}, 9, TL_WS_NEED_MORE, 0, 0, 0},
	{"64-bit top bit at 3 bytes", {0x82, 0x7F, 0x80}, 3, TL_WS_ERR_LEN64, 0, 0, 0},
	{"trailing payload ignored", {0x81, 0x02, 'h', 'i'}, 4, 2, 2, 1, TL_OP_TEXT},
};

static void test_parse_table(void)
{
	for (size_t k = 0; k < sizeof hcases / sizeof hcases[0]; k++) {
		const struct hcase *c = &hcases[k];
		tl_ws_hdr h;

		CHECK_CTX(c->name);
		memset(&h, 0xAA, sizeof h);
		int r = tl_ws_parse_hdr(c->b, c->n, &h);
		CHECK_ROW_EQ(r, c->ret);
		if (r > 0) {
			CHECK_ROW_EQ(h.len, c->len);
			CHECK_ROW_EQ(h.fin, c->fin);
			CHECK_ROW_EQ(h.opcode, c->op);
			CHECK_ROW_EQ(h.rsv, 0);
			CHECK_ROW_EQ(h.masked, 0);
		}
		/* Each proper prefix either needs more or already reports the
		 * same error: no prefix may contradict the full header. */
		for (size_t m = 0; m < c->n; m++) {
			int rp = tl_ws_parse_hdr(c->b, m, &h);
			if (r > 0)
				CHECK_ROW(rp == TL_WS_NEED_MORE || (size_t)r <= m);
			else
				CHECK_ROW(rp == TL_WS_NEED_MORE || rp == r);
		}
	}
}

/* Every opcode with and without FIN, through each length form. */
static void test_opcodes(void)
{
	for (int op = 0; op < 16; op++) {
		int ctrl = op >= 8;
		int reserved = (op >= 3 && op <= 7) || op >= 11;
		for (int fin = 0; fin <= 1; fin++) {
			uint8_t b[2] = {(uint8_t)(fin << 7 | op), 0x10};
			tl_ws_hdr h;
			int r = tl_ws_parse_hdr(b, 2, &h);
			if (reserved)
				CHECK_EQ(r, TL_WS_ERR_OPCODE);
			else if (ctrl && !fin)
				CHECK_EQ(r, TL_WS_ERR_CTRL_FRAG);
			else {
				CHECK_EQ(r, 2);
				CHECK_EQ(h.opcode, op);
				CHECK_EQ(h.fin, fin);
				CHECK_EQ(h.len, 16);
			}
		}
	}
}

static void test_write_hdr(void)
{
	static const uint64_t lens[] = {
		0, 1, 125, 126, 127, 255, 256, 65535, 65536, 1u << 20,
		0xFFFFFFFFull, 0x100000000ull, 0x7FFFFFFFFFFFFFFFull,
	};
	const uint8_t key[4] = {0x12, 0x34, 0x56, 0x78};

	for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++) {
		for (int op = 0; op <= 0xA; op++) {
			uint8_t out[TL_WS_MAX_HDR + 2];
			uint64_t len = lens[k];
			size_t want = len < 126 ? 6 : len <= 0xFFFF ? 8 : 14;
			int fin = op & 1;

			memset(out, 0xEE, sizeof out);
			size_t n = tl_ws_write_hdr(out, fin, op, len, key);
			CHECK_EQ(n, want);
			CHECK_EQ(out[TL_WS_MAX_HDR], 0xEE);
			CHECK_EQ(out[0], (fin ? 0x80 : 0) | op);
			CHECK(out[1] & 0x80);
			CHECK(memcmp(out + n - 4, key, 4) == 0);

			/* As a server would see it: strip the mask bit and key,
			 * and the client parser must read back the same header. */
			uint8_t srv[TL_WS_MAX_HDR];
			memcpy(srv, out, n - 4);
			srv[1] &= 0x7F;
			tl_ws_hdr h;
			int r = tl_ws_parse_hdr(srv, n - 4, &h);
			if ((op >= 3 && op <= 7) || (op >= 8 && (!fin || len > 125))) {
				CHECK(r < 0);
				continue;
			}
			CHECK_EQ(r, (int)(n - 4));
			CHECK_EQ(h.len, len);
			CHECK_EQ(h.opcode, op);
			CHECK_EQ(h.fin, fin);
			/* and unmodified it is rejected as masked */
			CHECK_EQ(tl_ws_parse_hdr(out, n, &h), TL_WS_ERR_MASKED);
		}
	}
	/* exact bytes for the three forms */
	uint8_t out[TL_WS_MAX_HDR];
	CHECK_EQ(tl_ws_write_hdr(out, 1, TL_OP_TEXT, 5, key), 6);
	CHECK(memcmp(out, "\x81\x85\x12\x34\x56\x78", 6) == 0);
	CHECK_EQ(tl_ws_write_hdr(out, 1, TL_OP_BINARY, 256, key), 8);
	CHECK(memcmp(out, "\x82\xFE\x01\x00\x12\x34\x56\x78", 8) == 0);
	CHECK_EQ(tl_ws_write_hdr(out, 0, TL_OP_BINARY, 65536, key), 14);
	CHECK(memcmp(out, "\x02\xFF\x00\x00\x00\x00\x00\x01\x00\x00\x12\x34\x56\x78", 14) == 0);
}

static void ref_mask(uint8_t *dst, const uint8_t *src, size_t n, const uint8_t key[4], size_t off)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = src[i] ^ key[(off + i) & 3];
}

/* Every key offset, every length up to 100, every misalignment of src and
 * dst, in place and out of place; guard bytes catch overruns that ASan
 * cannot see inside one array. */
static void test_mask(void)
{
	static uint8_t src[128 + 16], dst[128 + 16], want[128 + 16];
	const uint8_t key[4] = {0xA5, 0x3C, 0x0F, 0xF0};
	unsigned long bad = 0;

	for (size_t i = 0; i < sizeof src; i++)
		src[i] = (uint8_t)(i * 37 + 11);
	for (size_t off = 0; off < 4; off++) {
		for (size_t n = 0; n <= 100; n++) {
			for (size_t sa = 0; sa < 8; sa++) {
				for (size_t da = 0; da < 8; da++) {
					memset(dst, 0x5A, sizeof dst);
					tl_ws_mask(dst + da, src + sa, n, key, off);
					ref_mask(want, src + sa, n, key, off);
					if (memcmp(dst + da, want, n) != 0)
						bad++;
					for (size_t g = 0; g < da; g++)
						bad += dst[g] != 0x5A;
					for (size_t g = da + n; g < sizeof dst; g++)
						bad += dst[g] != 0x5A;
					/* round trip in place restores the input */
					tl_ws_mask(dst + da, dst + da, n, key, off);
					if (memcmp(dst + da, src + sa, n) != 0)
						bad++;
				}
			}
		}
	}
	CHECK_EQ(bad, 0);

	/* A message masked in arbitrary chunks, carrying the key offset
	 * forward, equals one pass: what the sender does across writes. */
	for (size_t chunk = 1; chunk <= 17; chunk++) {
		uint8_t one[100], pieces[100];
		tl_ws_mask(one, src, sizeof one, key, 0);
		for (size_t at = 0; at < sizeof pieces; at += chunk) {
			size_t m = sizeof pieces - at < chunk ? sizeof pieces - at : chunk;
			tl_ws_mask(pieces + at, src + at, m, key, at & 3);
		}
		CHECK(memcmp(one, pieces, sizeof one) == 0);
	}
	/* key_off beyond 3 wraps (defensive) */
	uint8_t a[9], b[9];
	tl_ws_mask(a, src, 9, key, 5);
	tl_ws_mask(b, src, 9, key, 1);
	CHECK(memcmp(a, b, 9) == 0);
}

static void test_close_codes(void)
{
	for (unsigned c = 0; c < 70000; c++) {
		int want = (c >= 1000 && c <= 1003) || (c >= 1007 && c <= 1014) ||
			   (c >= 3000 && c <= 4999);
		if (tl_ws_close_code_ok(c) != want) {
			fprintf(stderr, "close code %u\n", c);
			CHECK(0);
		}
	}
	CHECK(tl_ws_close_code_ok(1000));
	CHECK(!tl_ws_close_code_ok(1004));
	CHECK(!tl_ws_close_code_ok(1005));
	CHECK(!tl_ws_close_code_ok(1006));
	CHECK(!tl_ws_close_code_ok(1015));
	CHECK(!tl_ws_close_code_ok(2999));
	CHECK(tl_ws_close_code_ok(4999));
	CHECK(!tl_ws_close_code_ok(5000));
	CHECK(!tl_ws_close_code_ok(~0u));
}

int main(void)
{
	test_parse_table();
	test_opcodes();
	test_write_hdr();
	test_mask();
	test_close_codes();
	CHECK_DONE("test_ws");
}
