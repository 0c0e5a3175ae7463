/* test_socks.c - the SOCKS5 reply parser (codec/socks.c): each reply's exact
 * length, its code, what makes it malformed, and the prefix contract: every
 * prefix of a complete reply is MORE, and bytes after it never change the
 * verdict or the length (they belong to the tunnel). Also the CONNECT reply
 * heads the proxy handshake reads with codec/http.c: a 2xx of HTTP/1.0 or
 * 1.1 ends at its head; bytes after it are not the head's. */
#include <stdint.h>
#include <string.h>

#include "codec/http.h"
#include "codec/socks.h"
#include "check.h"

struct row {
	const char *name;
	int step;
	const uint8_t *b;
	size_t n;
	int want;     /* length, TL_SOCKS_MORE or TL_SOCKS_BAD on the whole buffer */
	uint8_t code; /* when want > 0 */
};

static const uint8_t m_ok[] = {5, 0}, m_auth[] = {5, 2}, m_none[] = {5, 0xFF}, m_v4[] = {4, 0};
static const uint8_t a_ok[] = {1, 0}, a_no[] = {1, 1}, a_v5[] = {5, 0};
static const uint8_t r_v4[] = {5, 0, 0, 1, 127, 0, 0, 1, 0x1f, 0x90};
static const uint8_t r_v6[] = {5, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 80};
static const uint8_t r_name[] = {5, 0, 0, 3, 9, 'l', 'o', 'c', 'a', 'l', 'h', 'o', 's', 't', 0, 0};
static const uint8_t r_refused[] = {5, 5, 0, 1, 0, 0, 0, 0, 0, 0};
static const uint8_t r_rsv[] = {5, 0, 1, 1, 0, 0, 0, 0, 0, 0};
static const uint8_t r_atyp[] = {5, 0, 0, 2, 0, 0, 0, 0, 0, 0};
static const uint8_t r_empty_name[] = {5, 0, 0, 3, 0, 0, 0};
static const uint8_t r_v4hdr[] = {4, 90, 0, 1};

#define R(name, step, arr, want, code) {name, step, arr, sizeof(arr), want, code}

static const struct row rows[] = {
	R("method none", TL_SOCKS_METHOD, m_ok, 2, 0),
	R("method userpass", TL_SOCKS_METHOD, m_auth, 2, 2),
	R("method refused", TL_SOCKS_METHOD, m_none, 2, 0xFF),
	R("method socks4", TL_SOCKS_METHOD, m_v4, TL_SOCKS_BAD, 0),
	R("auth ok", TL_SOCKS_AUTH, a_ok, 2, 0),
	R("auth refused", TL_SOCKS_AUTH, a_no, 2, 1),
	R("auth version", TL_SOCKS_AUTH, a_v5, TL_SOCKS_BAD, 0),
	R("reply ipv4", TL_SOCKS_REPLY, r_v4, 10, 0),
	R("reply ipv6", TL_SOCKS_REPLY, r_v6, 22, 0),
	R("reply name", TL_SOCKS_REPLY, r_name, 16, 0),
	R("reply refused", TL_SOCKS_REPLY, r_refused, 10, 5),
	R("reply rsv", TL_SOCKS_REPLY, r_rsv, TL_SOCKS_BAD, 0),
	R("reply atyp", TL_SOCKS_REPLY, r_atyp, TL_SOCKS_BAD, 0),
	R("reply empty name", TL_SOCKS_REPLY, r_empty_name, TL_SOCKS_BAD, 0),
	R("reply socks4", TL_SOCKS_REPLY, r_v4hdr, TL_SOCKS_BAD, 0),
	R("unknown step", 7, m_ok, TL_SOCKS_BAD, 0),
};

static void test_rows(void)
{
	uint8_t buf[TL_SOCKS_MAX_REPLY + 64], code;

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		const struct row *r = &rows[i];
		CHECK_CTX(r->name);
		CHECK_EQ(tl_socks_parse(r->step, r->b, r->n, &code), r->want);
		if (r->want > 0)
			CHECK_EQ(code, r->code);
		/* Every prefix: MORE before a verdict, the same verdict after. */
		for (size_t k = 0; k < r->n; k++) {
			int got = tl_socks_parse(r->step, r->b, k, &code);
			CHECK(got == TL_SOCKS_MORE || (r->want == TL_SOCKS_BAD && got == TL_SOCKS_BAD));
			if (r->want > 0)
				CHECK_EQ(code, 0);
		}
		/* Trailing bytes (the tunnel's first) change nothing. */
		memcpy(buf, r->b, r->n);
		memset(buf + r->n, 0x16, 64);
		CHECK_EQ(tl_socks_parse(r->step, buf, r->n + 64, &code), r->want);
	}
	CHECK_CTX("");
}

/* The longest reply: a 255-byte name. */
static void test_longest(void)
{
	uint8_t b[TL_SOCKS_MAX_REPLY + 1], code;

	memset(b, 'a', sizeof(b));
	b[0] = 5, b[1] = 0, b[2] = 0, b[3] = 3, b[4] = 255;
	CHECK_EQ(tl_socks_parse(TL_SOCKS_REPLY, b, TL_SOCKS_MAX_REPLY - 1, &code), TL_SOCKS_MORE);
	CHECK_EQ(tl_socks_parse(TL_SOCKS_REPLY, b, sizeof(b), &code), TL_SOCKS_MAX_REPLY);
}

/* CONNECT replies as transport/proxy.c reads them (no key: a 2xx is
 * TL_HTTP_ERR_STATUS with its status and head_len). */
static void test_connect_heads(void)
{
	static const char ok10[] = "HTTP/1.0 200 Connection established\r\n\r\n\x16\x03\x03";
	static const char ok11[] = "HTTP/1.1 200 OK\r\nVia: p\r\n\r\nHTTP/1.1 101";
	static const char auth[] = "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n\r\n";
	static const char junk[] = "\x05\x00";
	tl_http_response rs;

	CHECK_EQ(tl_http_parse_response(ok10, sizeof(ok10) - 1, NULL, NULL, 0, &rs), TL_HTTP_ERR_STATUS);
	CHECK_EQ(rs.status, 200);
	CHECK_EQ(rs.head_len, sizeof(ok10) - 1 - 3);
	CHECK_EQ(tl_http_parse_response(ok11, sizeof(ok11) - 1, NULL, NULL, 0, &rs), TL_HTTP_ERR_STATUS);
	CHECK_EQ(rs.status, 200);
	CHECK_EQ(rs.head_len, strlen("HTTP/1.1 200 OK\r\nVia: p\r\n\r\n"));
	for (size_t k = 0; k < rs.head_len; k++)
		CHECK_EQ(tl_http_parse_response(ok11, k, NULL, NULL, 0, &rs), TL_HTTP_NEED_MORE);
	CHECK_EQ(tl_http_parse_response(auth, sizeof(auth) - 1, NULL, NULL, 0, &rs), TL_HTTP_ERR_STATUS);
	CHECK_EQ(rs.status, 407);
	CHECK_EQ(tl_http_parse_response(junk, 2, NULL, NULL, 0, &rs), TL_HTTP_ERR_SYNTAX);
}

int main(void)
{
	test_rows();
	test_longest();
	test_connect_heads();
	CHECK_DONE("test_socks");
}
