/* fuzz_proxy.c - the proxy handshake's reply parsers: tl_socks_parse for
 * each step and the CONNECT reply head through tl_http_parse_response with
 * no key, as transport/proxy.c calls them. No crash or over-read; a length
 * is within the buffer and the bound; the prefix contract: a verdict on a
 * prefix is the verdict (and length) on the whole.
 *
 * Input: byte 0 picks the step (0-2 SOCKS5, 3 the CONNECT head), the rest
 * is the proxy's bytes. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "codec/http.h"
#include "codec/socks.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	int step = data[0] % 4;
	const uint8_t *b = data + 1;
	size_t n = size - 1;

	if (step < 3) {
		uint8_t code;
		int whole = tl_socks_parse(step, b, n, &code);
		if (whole == 0 || whole < TL_SOCKS_BAD || whole > TL_SOCKS_MAX_REPLY || (whole > 0 && (size_t)whole > n))
			abort();
		for (size_t k = 0; k < n; k++) {
			int got = tl_socks_parse(step, b, k, &code);
			if (got != TL_SOCKS_MORE && got != whole)
				abort();
		}
		return 0;
	}
	tl_http_response rs, rk;
	int whole = tl_http_parse_response((const char *)b, n, NULL, NULL, 0, &rs);
	if (whole == TL_HTTP_OK)
		abort(); /* no key: never an upgrade */
	if (whole == TL_HTTP_ERR_STATUS && (rs.head_len == 0 || rs.head_len > n))
		abort();
	for (size_t k = n > 64 ? n - 64 : 0; k < n; k++) {
		int got = tl_http_parse_response((const char *)b, k, NULL, NULL, 0, &rk);
		if (got != TL_HTTP_NEED_MORE && (got != whole || (got == TL_HTTP_ERR_STATUS && rk.head_len != rs.head_len)))
			abort();
	}
	return 0;
}
