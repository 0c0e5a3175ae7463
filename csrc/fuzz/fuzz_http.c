/* fuzz_http.c - the upgrade response parser: no crash or over-read on any
 * input, results in range, OK results consistent with the buffer, and the
 * stateless-reparse contract: a verdict reached on a prefix is the verdict
 * on the whole, and trailing frame bytes never change it. The same bytes
 * also go through the chunked-body end finder (tl_http_chunked_end).
 *
 * Input: byte 0 picks the offered subprotocol list, the rest is the
 * response. The key is fixed so seeds can carry a valid accept value. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec/http.h"

static const char key[] = "dGhlIHNhbXBsZSBub25jZQ==";
static const char *const offers[] = {"", "chat", "chat, superchat", " a ,b,, c "};

static int parse(const char *b, size_t n, const char *offer, tl_http_response *r)
{
	int got = tl_http_parse_response(b, n, key, offer, strlen(offer), r);
	if (got < TL_HTTP_ERR_TRANSFER || got > TL_HTTP_OK)
		abort();
	return got;
}

/* contains: s[0..n) occurs in the NUL-terminated hay. */
static int contains(const char *hay, const char *s, size_t n)
{
	for (size_t i = 0; hay[i]; i++)
		if (strncmp(hay + i, s, n) == 0 && strlen(hay + i) >= n)
			return 1;
	return 0;
}

static int final_verdict(int r)
{
	return r != TL_HTTP_NEED_MORE;
}

static int semantic(int r)
{
	return r == TL_HTTP_OK || r <= TL_HTTP_ERR_STATUS;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const char *offer = offers[data[0] % 4];
	size_t n = size - 1;
	/* exact-size heap copy so ASan sees any read past the end */
	char *b = malloc(n + 8);
	if (!b)
		abort();
	memcpy(b, data + 1, n);

	tl_http_response r;
	int got = parse(b, n, offer, &r);

	if (semantic(got)) {
		if (r.head_len < 4 || r.head_len > n || r.head_len > TL_HTTP_MAX_HEAD)
			abort();
		if (memcmp(b + r.head_len - 4, "\r\n\r\n", 4) != 0)
			abort();
		if (got != TL_HTTP_ERR_STATUS && r.status != 101)
			abort();
		if (got == TL_HTTP_ERR_STATUS && r.status == 101)
			abort();
	} else if (r.head_len != 0) {
		abort();
	}
	if (got == TL_HTTP_OK && r.protocol_len) {
		if (r.protocol < b || r.protocol + r.protocol_len > b + r.head_len)
			abort();
		if (!contains(offer, r.protocol, r.protocol_len))
			abort();
	} else if (r.protocol_len || r.protocol) {
		abort();
	}
	if (r.status < 0 || r.status > 999)
		abort();

	/* Prefix property on a handful of cut points (all of them for short
	 * inputs): a non-NEED_MORE verdict on a prefix equals the whole's. */
	size_t cuts[8] = {0, 1, n / 3, n / 2, n ? n - 1 : 0,
			  r.head_len ? r.head_len - 1 : 0, r.head_len, n};
	for (size_t k = 0; k < 8 + (n <= 200 ? n : 0); k++) {
		size_t m = k < 8 ? cuts[k] : k - 8;
		tl_http_response pr;
		if (m > n)
			continue;
		char *pb = malloc(m ? m : 1);
		if (!pb)
			abort();
		memcpy(pb, b, m);
		int pg = parse(pb, m, offer, &pr);
		free(pb);
		if (final_verdict(pg) && pg != got)
			abort();
		if (semantic(got) && m < r.head_len && pg != TL_HTTP_NEED_MORE)
			abort();
		if (semantic(got) && m >= r.head_len && (pg != got || pr.head_len != r.head_len))
			abort();
	}

	/* The same bytes as a refusal's chunked body: a verdict in range, and
	 * a verdict on a prefix (end found, or not framing) holds for the
	 * whole; more bytes only ever end a wait. */
	{
		int ce = tl_http_chunked_end(b, n);
		if (ce < -1 || ce > 1)
			abort();
		for (size_t k = 0; k < 8; k++) {
			int pc = cuts[k] <= n ? tl_http_chunked_end(b, cuts[k]) : 0;
			if (pc != 0 && pc != ce)
				abort();
		}
	}

	/* More bytes after a verdict change nothing. */
	if (final_verdict(got)) {
		memcpy(b + n, "\x81\x02hi\r\n\r\n", 8);
		tl_http_response er;
		int eg = parse(b, n + 8, offer, &er);
		if (eg != got || er.head_len != r.head_len || er.status != r.status)
			abort();
	}
	free(b);
	return 0;
}
