/* test_http.c - upgrade request writer, accept key, and the response
 * parser's verdict on legal variants and every error class, one-shot and
 * fed byte by byte. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "codec/http.h"
#include "check.h"

/* RFC 6455 section 1.3. (The section's accept value is
 * s3pPLMBiTxaQ9kYGzzhZRbK+xOo=; confirmed with `openssl sha1 | base64`.) */
#define KEY "dGhlIHNhbXBsZSBub25jZQ=="
#define ACCEPT "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
/* accept for a different key, to be wrong in a well-formed way */
#define OTHER_ACCEPT "HSmrc0sMlYUkAGmm5OPpG2HaGWk="

static void test_accept(void)
{
	char out[TL_WS_ACCEPT_LEN + 1];

	tl_ws_accept(KEY, strlen(KEY), out);
	CHECK(strcmp(out, ACCEPT) == 0);
	tl_ws_accept("x3JJHMbDL1EzLkh9GBhXDw==", 24, out);
	CHECK(strcmp(out, OTHER_ACCEPT) == 0);
	tl_ws_accept("AAAAAAAAAAAAAAAAAAAAAA==", 24, out);
	CHECK(strcmp(out, "ICX+Yqv66kxgM0FcWaLWlFLwTAI=") == 0);
	/* oversized keys cannot be ours: empty result, never a match */
	static char big[200];
	memset(big, 'A', sizeof big);
	tl_ws_accept(big, sizeof big, out);
	CHECK(out[0] == '\0');
}

static int is_b64(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
	       c == '+' || c == '/';
}

static void test_make_key(void)
{
	char a[TL_WS_KEY_LEN + 1], b[TL_WS_KEY_LEN + 1];

	CHECK_EQ(tl_ws_make_key(a), 0);
	CHECK_EQ(tl_ws_make_key(b), 0);
	CHECK_EQ(strlen(a), TL_WS_KEY_LEN);
	for (int i = 0; i < 22; i++)
		CHECK(is_b64(a[i]));
	CHECK(a[22] == '=' && a[23] == '=');
	/* 16 bytes leave the low 4 bits of the 22nd sextet zero */
	CHECK(strchr("AQgw", a[21]) != NULL);
	CHECK(strcmp(a, b) != 0);
}

static void test_write_request(void)
{
	static const char want1[] =
		"GET /ws?x=1 HTTP/1.1\r\n"
		"Host: example.com:9443\r\n"
		"Upgrade: websocket\r\n"
		"Connection: Upgrade\r\n"
		"Sec-WebSocket-Key: " KEY "\r\n"
		"Sec-WebSocket-Version: 13\r\n"
		"Sec-WebSocket-Protocol: chat, superchat\r\n"
		"Origin: https://example.com\r\n"
		"X-Token: abc\r\n"
		"\r\n";
	static const char want2[] =
		"GET / HTTP/1.1\r\n"
		"Host: h\r\n"
		"Upgrade: websocket\r\n"
		"Connection: Upgrade\r\n"
		"Sec-WebSocket-Key: " KEY "\r\n"
		"Sec-WebSocket-Version: 13\r\n"
		"\r\n";
	const char *hdrs = "Origin: https://example.com\r\nX-Token: abc\r\n";
	tl_http_request rq = {
		.host = "example.com:9443", .host_len = 16,
		.path = "/ws?x=1", .path_len = 7,
		.headers = hdrs, .headers_len = strlen(hdrs),
		.protocols = "chat, superchat", .protocols_len = 15,
		.key = KEY,
	};
	char out[512];

	size_t n = tl_http_write_request(out, sizeof out, &rq);
	CHECK_EQ(n, sizeof want1 - 1);
	CHECK(memcmp(out, want1, n) == 0);
	/* every cap short of the length fails cleanly; exactly the length fits */
	for (size_t cap = 0; cap < n; cap++)
		CHECK_EQ(tl_http_write_request(out, cap, &rq), 0);
	CHECK_EQ(tl_http_write_request(out, n, &rq), n);
	CHECK(memcmp(out, want1, n) == 0);

	tl_http_request rq2 = {.host = "h", .host_len = 1, .key = KEY};
	n = tl_http_write_request(out, sizeof out, &rq2);
	CHECK_EQ(n, sizeof want2 - 1);
	CHECK(memcmp(out, want2, n) == 0);

	/* our own request is a well-formed head for our own parser's rules:
	 * CRLF only, ends with one empty line */
	CHECK(memcmp(out + n - 4, "\r\n\r\n", 4) == 0);
}

#define H101 "HTTP/1.1 101 Switching Protocols\r\n"
#define UPG "Upgrade: websocket\r\n"
#define CONN "Connection: Upgrade\r\n"
#define ACC "Sec-WebSocket-Accept: " ACCEPT "\r\n"
#define END "\r\n"

struct rcase {
	const char *name;
	const char *resp;
	const char *offer;
	int ret;
	int status;       /* expected out->status */
	const char *proto; /* expected agreed protocol, NULL for none */
};

static const struct rcase rcases[] = {
	/* legal variants */
	{"canonical", H101 UPG CONN ACC END, "", TL_HTTP_OK, 101, NULL},
	{"header order", H101 ACC CONN UPG END, "", TL_HTTP_OK, 101, NULL},
	{"case variants", H101 "upgrade: WebSocket\r\nCONNECTION: uPgRaDe\r\nsec-websocket-accept: " ACCEPT "\r\n" END,
	 "", TL_HTTP_OK, 101, NULL},
	{"conn list", H101 UPG "Connection: keep-alive, Upgrade\r\n" ACC END, "", TL_HTTP_OK, 101, NULL},
	{"conn list first", H101 UPG "Connection: Upgrade , keep-alive\r\n" ACC END, "", TL_HTTP_OK, 101, NULL},
	{"conn list empties", H101 UPG "Connection: ,, upgrade,\r\n" ACC END, "", TL_HTTP_OK, 101, NULL},
	{"conn two lines", H101 UPG "Connection: keep-alive\r\nConnection: Upgrade\r\n" ACC END, "", TL_HTTP_OK, 101, NULL},
	{"upgrade list", H101 "Upgrade: h2c, websocket\r\n" CONN ACC END, "", TL_HTTP_OK, 101, NULL},
	{"OWS", H101 "Upgrade:websocket\r\nConnection: \t Upgrade \t \r\nSec-WebSocket-Accept:  " ACCEPT "  \r\n" END,
	 "", TL_HTTP_OK, 101, NULL},
	{"empty reason with SP", "HTTP/1.1 101 \r\n" UPG CONN ACC END, "", TL_HTTP_OK, 101, NULL},
	{"empty reason no SP", "HTTP/1.1 101\r\n" UPG CONN ACC END, "", TL_HTTP_OK, 101, NULL},
	{"obs-text reason", "HTTP/1.1 101 \xC3\xA9t\xC3\xA9\r\n" UPG CONN ACC END, "", TL_HTTP_OK, 101, NULL},
	{"extra headers", H101 "Server: x/1.0\r\nDate: Mon, 01 Jan 2024 00:00:00 GMT\r\n" UPG CONN ACC
	 "X-Empty:\r\n" END, "", TL_HTTP_OK, 101, NULL},
	{"protocol chosen", H101 UPG CONN ACC "Sec-WebSocket-Protocol: chat\r\n" END, "superchat, chat",
	 TL_HTTP_OK, 101, "chat"},
	{"protocol first offered", H101 UPG CONN ACC "Sec-WebSocket-Protocol: superchat\r\n" END, "superchat,chat",
	 TL_HTTP_OK, 101, "superchat"},
	{"protocol offered, none chosen", H101 UPG CONN ACC END, "chat", TL_HTTP_OK, 101, NULL},
	{"content-length ignored", H101 UPG CONN ACC "Content-Length: 0\r\n" END, "", TL_HTTP_OK, 101, NULL},

	/* status */
	{"200", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" END, "", TL_HTTP_ERR_STATUS, 200, NULL},
	{"301", "HTTP/1.1 301 Moved Permanently\r\nLocation: /x\r\n" END, "", TL_HTTP_ERR_STATUS, 301, NULL},
	{"401", "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic\r\n" END, "", TL_HTTP_ERR_STATUS, 401, NULL},
	{"426", "HTTP/1.1 426 Upgrade Required\r\n" UPG CONN END, "", TL_HTTP_ERR_STATUS, 426, NULL},
	{"100", "HTTP/1.1 100 Continue\r\n" END, "", TL_HTTP_ERR_STATUS, 100, NULL},
	{"401 with accept", "HTTP/1.1 401 No\r\n" UPG CONN ACC END, "", TL_HTTP_ERR_STATUS, 401, NULL},
	/* An HTTP/1.0 refusal is its status (Go's TLS server answering plaintext). */
	{"HTTP/1.0 400", "HTTP/1.0 400 Bad Request\r\n" END, "", TL_HTTP_ERR_STATUS, 400, NULL},

	/* Upgrade / Connection */
	{"no upgrade", H101 CONN ACC END, "", TL_HTTP_ERR_UPGRADE, 101, NULL},
	{"upgrade h2c", H101 "Upgrade: h2c\r\n" CONN ACC END, "", TL_HTTP_ERR_UPGRADE, 101, NULL},
	{"upgrade websockets", H101 "Upgrade: websockets\r\n" CONN ACC END, "", TL_HTTP_ERR_UPGRADE, 101, NULL},
	{"upgrade empty", H101 "Upgrade:\r\n" CONN ACC END, "", TL_HTTP_ERR_UPGRADE, 101, NULL},
	{"no connection", H101 UPG ACC END, "", TL_HTTP_ERR_CONNECTION, 101, NULL},
	{"connection keep-alive", H101 UPG "Connection: keep-alive\r\n" ACC END, "", TL_HTTP_ERR_CONNECTION, 101, NULL},
	{"connection upgrades", H101 UPG "Connection: upgrades\r\n" ACC END, "", TL_HTTP_ERR_CONNECTION, 101, NULL},
	{"connection up grade", H101 UPG "Connection: up grade\r\n" ACC END, "", TL_HTTP_ERR_CONNECTION, 101, NULL},

	/* Accept */
	{"no accept", H101 UPG CONN END, "", TL_HTTP_ERR_ACCEPT, 101, NULL},
	{"two accepts", H101 UPG CONN ACC ACC END, "", TL_HTTP_ERR_ACCEPT, 101, NULL},
	{"wrong accept", H101 UPG CONN "Sec-WebSocket-Accept: " OTHER_ACCEPT "\r\n" END, "", TL_HTTP_ERR_ACCEPT, 101, NULL},
	{"accept wrong case", H101 UPG CONN "Sec-WebSocket-Accept: S3PPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" END, "",
	 TL_HTTP_ERR_ACCEPT, 101, NULL},
	{"accept extra char", H101 UPG CONN "Sec-WebSocket-Accept: " ACCEPT "x\r\n" END, "", TL_HTTP_ERR_ACCEPT, 101, NULL},
	{"accept truncated", H101 UPG CONN "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo\r\n" END, "",
	 TL_HTTP_ERR_ACCEPT, 101, NULL},
	{"accept empty", H101 UPG CONN "Sec-WebSocket-Accept:\r\n" END, "", TL_HTTP_ERR_ACCEPT, 101, NULL},
	{"accept is the key", H101 UPG CONN "Sec-WebSocket-Accept: " KEY "\r\n" END, "", TL_HTTP_ERR_ACCEPT, 101, NULL},

	/* extensions, transfer-encoding */
	{"extension", H101 UPG CONN ACC "Sec-WebSocket-Extensions: permessage-deflate\r\n" END, "",
	 TL_HTTP_ERR_EXTENSION, 101, NULL},
	{"extension empty", H101 UPG CONN ACC "sec-websocket-extensions:\r\n" END, "", TL_HTTP_ERR_EXTENSION, 101, NULL},
	{"transfer-encoding", H101 UPG CONN ACC "Transfer-Encoding: chunked\r\n" END, "", TL_HTTP_ERR_TRANSFER, 101, NULL},
	{"transfer-encoding identity", H101 UPG CONN ACC "transfer-encoding: identity\r\n" END, "",
	 TL_HTTP_ERR_TRANSFER, 101, NULL},

	/* subprotocol */
	{"unrequested protocol", H101 UPG CONN ACC "Sec-WebSocket-Protocol: chat\r\n" END, "", TL_HTTP_ERR_PROTOCOL, 101, NULL},
	{"protocol not offered", H101 UPG CONN ACC "Sec-WebSocket-Protocol: mqtt\r\n" END, "chat, superchat",
	 TL_HTTP_ERR_PROTOCOL, 101, NULL},
	{"protocol case differs", H101 UPG CONN ACC "Sec-WebSocket-Protocol: Chat\r\n" END, "chat", TL_HTTP_ERR_PROTOCOL, 101, NULL},
	{"protocol prefix", H101 UPG CONN ACC "Sec-WebSocket-Protocol: cha\r\n" END, "chat", TL_HTTP_ERR_PROTOCOL, 101, NULL},
	{"protocol list", H101 UPG CONN ACC "Sec-WebSocket-Protocol: chat, superchat\r\n" END, "chat, superchat",
	 TL_HTTP_ERR_PROTOCOL, 101, NULL},
	{"protocol two lines", H101 UPG CONN ACC "Sec-WebSocket-Protocol: chat\r\nSec-WebSocket-Protocol: chat\r\n" END,
	 "chat", TL_HTTP_ERR_PROTOCOL, 101, NULL},
	{"protocol empty", H101 UPG CONN ACC "Sec-WebSocket-Protocol:\r\n" END, "chat", TL_HTTP_ERR_PROTOCOL, 101, NULL},

	/* syntax */
	{"HTTP/1.0 101", "HTTP/1.0 101 Switching Protocols\r\n" UPG CONN ACC END, "", TL_HTTP_ERR_SYNTAX, 0, NULL},
	{"lowercase version", "http/1.1 101 Switching Protocols\r\n" UPG CONN ACC END, "", TL_HTTP_ERR_SYNTAX, 0, NULL},
	{"ICY", "ICY 200 OK\r\n" END, "", TL_HTTP_ERR_SYNTAX, 0, NULL},
	{"two spaces", "HTTP/1.1  101 X\r\n" END, "", TL_HTTP_ERR_SYNTAX, 0, NULL},
	{"4-digit status", "HTTP/1.1 1010 X\r\n" END, "", TL_HTTP_ERR_SYNTAX, 0, NULL},
	{"2-digit status", "HTTP/1.1 10 X\r\n" END, "", TL_HTTP_ERR_SYNTAX, 0, NULL},
	{"alpha status", "HTTP/1.1 1a1 X\r\n" END, "", TL_HTTP_ERR_SYNTAX, 0, NULL},
	{"bare LF status", "HTTP/1.1 101 Switching Protocols\n" UPG CONN ACC END, "", TL_HTTP_ERR_SYNTAX, 0, NULL},
	{"bare LF header", H101 "Upgrade: websocket\n" CONN ACC END, "", TL_HTTP_ERR_SYNTAX, 101, NULL},
	{"bare LF end", H101 UPG CONN ACC "\n", "", TL_HTTP_ERR_SYNTAX, 101, NULL},
	{"CR CR LF", H101 "Upgrade: websocket\r\r\n" CONN ACC END, "", TL_HTTP_ERR_SYNTAX, 101, NULL},
	{"lone CR in value", H101 "Upgrade: web\rsocket\r\n" CONN ACC END, "", TL_HTTP_ERR_SYNTAX, 101, NULL},
	{"CR X at end", H101 UPG CONN ACC "\rX", "", TL_HTTP_ERR_SYNTAX, 101, NULL},
	{"obs-fold", H101 UPG "Connection: keep-alive,\r\n Upgrade\r\n" ACC END, "", TL_HTTP_ERR_SYNTAX, 101, NULL},
	{"obs-fold tab", H101 UPG CONN "\tx\r\n" ACC END, "", TL_HTTP_ERR_SYNTAX, 101, NULL},
	{"space before colon", H101 "Upgrade : websocket\r\n" CONN ACC END, "", TL_HTTP_ERR_SYNTAX, 101, NULL},
	{"empty name", H101 ": x\r\n" UPG CONN ACC END, "", TL_HTTP_ERR_SYNTAX, 101, NULL},
	{"no colon", H101 "Upgrade websocket\r\n" CONN ACC END, "", TL_HTTP_ERR_SYNTAX, 101, NULL},
	{"bad name char", H101 "Up(grade): websocket\r\n" CONN ACC END, "", TL_HTTP_ERR_SYNTAX, 101, NULL},
	{"DEL in value", H101 "X: a\x7F" "b\r\n" UPG CONN ACC END, "", TL_HTTP_ERR_SYNTAX, 101, NULL},
	{"ctl in reason", "HTTP/1.1 101 Swi\x01tching\r\n" UPG CONN ACC END, "", TL_HTTP_ERR_SYNTAX, 0, NULL},
	{"syntax in 401", "HTTP/1.1 401 No\r\nX y\r\n" END, "", TL_HTTP_ERR_SYNTAX, 401, NULL},
};

/* run_case runs the parser on the whole case, on every prefix, and with
 * frame bytes appended, and checks they agree. */
static void run_case(const char *name, const char *resp, size_t n, const char *offer, int ret,
		     int status, const char *proto, int incremental)
{
	static char buf[TL_HTTP_MAX_HEAD * 2 + 64];
	tl_http_response r;

	CHECK_CTX(name);
	CHECK_ROW(n + 8 <= sizeof buf);
	memcpy(buf, resp, n);

	int got = tl_http_parse_response(buf, n, KEY, offer, strlen(offer), &r);
	CHECK_ROW_EQ(got, ret);
	CHECK_ROW_EQ(r.status, status);
	if (ret != TL_HTTP_ERR_SYNTAX && ret != TL_HTTP_ERR_TOO_LARGE && ret != TL_HTTP_NEED_MORE)
		CHECK_ROW_EQ(r.head_len, n);
	if (ret == TL_HTTP_OK && proto) {
		CHECK_ROW_EQ(r.protocol_len, strlen(proto));
		CHECK_ROW(memcmp(r.protocol, proto, r.protocol_len) == 0);
		CHECK_ROW(r.protocol >= buf && r.protocol < buf + n);
	} else {
		CHECK_ROW_EQ(r.protocol_len, 0);
	}

	/* Frame bytes right behind the head change nothing. */
	memcpy(buf + n, "\x81\x02hi\x88\x00", 6);
	got = tl_http_parse_response(buf, n + 6, KEY, offer, strlen(offer), &r);
	CHECK_ROW_EQ(got, ret);
	if (ret != TL_HTTP_ERR_SYNTAX && ret != TL_HTTP_ERR_TOO_LARGE && ret != TL_HTTP_NEED_MORE)
		CHECK_ROW_EQ(r.head_len, n);

	if (!incremental)
		return;
	/* Byte by byte: stays NEED_MORE until it reaches the same verdict;
	 * semantic verdicts only once the whole head is in. */
	size_t m;
	for (m = 0; m <= n; m++) {
		got = tl_http_parse_response(buf, m, KEY, offer, strlen(offer), &r);
		if (got != TL_HTTP_NEED_MORE)
			break;
	}
	CHECK_ROW_EQ(got, ret);
	if (ret != TL_HTTP_ERR_SYNTAX && ret != TL_HTTP_ERR_TOO_LARGE)
		CHECK_ROW_EQ(m, n);
	CHECK_ROW_EQ(r.status, status);
}

static void test_responses(void)
{
	for (size_t k = 0; k < sizeof rcases / sizeof rcases[0]; k++) {
		const struct rcase *c = &rcases[k];
		run_case(c->name, c->resp, strlen(c->resp), c->offer, c->ret, c->status, c->proto, 1);
	}
}

/* The status is visible as soon as the status line is, so a caller that
 * gives up early can still report it. */
static void test_status_early(void)
{
	const char *s = "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bas";
	tl_http_response r;

	CHECK_EQ(tl_http_parse_response(s, strlen(s), KEY, "", 0, &r), TL_HTTP_NEED_MORE);
	CHECK_EQ(r.status, 401);
	CHECK_EQ(r.head_len, 0);
	CHECK_EQ(tl_http_parse_response(s, 25, KEY, "", 0, &r), TL_HTTP_NEED_MORE);
	CHECK_EQ(r.status, 0);
	CHECK_EQ(tl_http_parse_response(s, 0, KEY, "", 0, &r), TL_HTTP_NEED_MORE);
	CHECK_EQ(tl_http_parse_response(NULL, 0, KEY, "", 0, &r), TL_HTTP_NEED_MORE);
}

static char big[TL_HTTP_MAX_HEAD * 2];

static size_t build_lines(int extra_lines, int terminate)
{
	size_t n = 0;
	n += (size_t)sprintf(big + n, "%s", H101 UPG CONN ACC);
	for (int i = 0; i < extra_lines; i++)
		n += (size_t)sprintf(big + n, "X-Bomb-%d: %d\r\n", i, i);
	if (terminate)
		n += (size_t)sprintf(big + n, "\r\n");
	return n;
}

static void test_header_bomb(void)
{
	tl_http_response r;

	/* TL_HTTP_MAX_HEADERS header lines: the limit, accepted */
	size_t n = build_lines(TL_HTTP_MAX_HEADERS - 3, 1);
	run_case("max lines", big, n, "", TL_HTTP_OK, 101, NULL, 1);

	/* one more: refused, and refused before the head ends */
	n = build_lines(TL_HTTP_MAX_HEADERS - 2, 1);
	run_case("max+1 lines", big, n, "", TL_HTTP_ERR_TOO_LARGE, 101, NULL, 1);
	size_t unterminated = build_lines(TL_HTTP_MAX_HEADERS - 2, 0);
	CHECK_EQ(tl_http_parse_response(big, unterminated, KEY, "", 0, &r), TL_HTTP_ERR_TOO_LARGE);
	/* ... on that line's first byte */
	size_t line64_end = build_lines(TL_HTTP_MAX_HEADERS - 3, 0);
	CHECK_EQ(tl_http_parse_response(big, line64_end, KEY, "", 0, &r), TL_HTTP_NEED_MORE);
	CHECK_EQ(tl_http_parse_response(big, line64_end + 1, KEY, "", 0, &r), TL_HTTP_ERR_TOO_LARGE);

	/* a long bomb of tiny lines never reaches the end */
	n = 0;
	n += (size_t)sprintf(big, "HTTP/1.1 101 X\r\n");
	for (int i = 0; i < 1000; i++)
		n += (size_t)sprintf(big + n, "a:\r\n");
	CHECK_EQ(tl_http_parse_response(big, n, KEY, "", 0, &r), TL_HTTP_ERR_TOO_LARGE);
}

/* Builds a valid 101 whose head is exactly total bytes via a padding
 * header. */
static size_t build_sized(size_t total, int terminate)
{
	static const char pre[] = H101 UPG CONN ACC "X-Pad: ";
	size_t n = sizeof pre - 1;
	size_t pad = total - n - 2 - 2;

	memcpy(big, pre, n);
	memset(big + n, 'p', pad);
	n += pad;
	memcpy(big + n, "\r\n\r\n", 4);
	return terminate ? n + 4 : n;
}

static void test_head_size(void)
{
	tl_http_response r;

	size_t n = build_sized(TL_HTTP_MAX_HEAD, 1);
	CHECK_EQ(n, TL_HTTP_MAX_HEAD);
	run_case("16 KiB head", big, n, "", TL_HTTP_OK, 101, NULL, 0);

	n = build_sized(TL_HTTP_MAX_HEAD + 1, 1);
	CHECK_EQ(n, TL_HTTP_MAX_HEAD + 1);
	run_case("16 KiB + 1 head", big, n, "", TL_HTTP_ERR_TOO_LARGE, 101, NULL, 0);
	/* it fails on byte 16385, before the terminator arrives */
	CHECK_EQ(tl_http_parse_response(big, TL_HTTP_MAX_HEAD, KEY, "", 0, &r), TL_HTTP_NEED_MORE);
	CHECK_EQ(tl_http_parse_response(big, TL_HTTP_MAX_HEAD + 1, KEY, "", 0, &r), TL_HTTP_ERR_TOO_LARGE);

	/* one endless header line: NEED_MORE up to the bound, then TOO_LARGE */
	memcpy(big, "HTTP/1.1 101 X\r\nX: ", 19);
	memset(big + 19, 'v', sizeof big - 19);
	CHECK_EQ(tl_http_parse_response(big, TL_HTTP_MAX_HEAD, KEY, "", 0, &r), TL_HTTP_NEED_MORE);
	CHECK_EQ(tl_http_parse_response(big, TL_HTTP_MAX_HEAD + 1, KEY, "", 0, &r), TL_HTTP_ERR_TOO_LARGE);
	CHECK_EQ(tl_http_parse_response(big, sizeof big, KEY, "", 0, &r), TL_HTTP_ERR_TOO_LARGE);

	/* an endless reason phrase likewise */
	memcpy(big, "HTTP/1.1 101 ", 13);
	memset(big + 13, 'r', sizeof big - 13);
	CHECK_EQ(tl_http_parse_response(big, TL_HTTP_MAX_HEAD, KEY, "", 0, &r), TL_HTTP_NEED_MORE);
	CHECK_EQ(tl_http_parse_response(big, TL_HTTP_MAX_HEAD + 1, KEY, "", 0, &r), TL_HTTP_ERR_TOO_LARGE);

	/* a syntax error inside the bound wins over the size */
	memcpy(big, "HTTP/1.1 101 X\r\nX:\x01", 19);
	CHECK_EQ(tl_http_parse_response(big, sizeof big, KEY, "", 0, &r), TL_HTTP_ERR_SYNTAX);
}

/* Bytes fed in two uneven pieces, the way reads arrive: same verdict. */
static void test_incremental_chunks(void)
{
	static const char resp[] = H101 UPG "Connection: keep-alive, Upgrade\r\n" ACC
		"Sec-WebSocket-Protocol: chat\r\n" END "\x81\x05hello";
	const size_t head = sizeof resp - 1 - 7;
	tl_http_response r;

	for (size_t a = 0; a < sizeof resp - 1; a++) {
		int got = tl_http_parse_response(resp, a, KEY, "chat", 4, &r);
		CHECK_EQ(got, a < head ? TL_HTTP_NEED_MORE : TL_HTTP_OK);
		if (got == TL_HTTP_OK) {
			CHECK_EQ(r.head_len, head);
			CHECK_EQ(r.protocol_len, 4);
			CHECK(memcmp(r.protocol, "chat", 4) == 0);
		}
	}
}

/* test_retry_after: the Retry-After of a refusal in delta-seconds
 * (any case, OWS trimmed), clamped to a day; absent, an HTTP-date or
 * junk give -1; an incomplete head gives -1 too. */
static void test_retry_after(void)
{
	static const struct {
		const char *hdr;
		int64_t want;
	} cases[] = {
		{"Retry-After: 1\r\n", 1},
		{"retry-after:   120  \r\n", 120},
		{"RETRY-AFTER: 0\r\n", 0},
		{"Retry-After: 99999999999999999999\r\n", 86400},
		{"Retry-After: Wed, 21 Oct 2015 07:28:00 GMT\r\n", -1},
		{"Retry-After: 1x\r\n", -1},
		{"Retry-After:\r\n", -1},
		{"X-Retry-After: 5\r\n", -1},
		{"", -1},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char buf[256];
		tl_http_response r;
		int n = snprintf(buf, sizeof(buf), "HTTP/1.1 429 Too Many Requests\r\n%sContent-Length: 0\r\n\r\n",
				 cases[i].hdr);
		CHECK(tl_http_parse_response(buf, (size_t)n, KEY, "", 0, &r) == TL_HTTP_ERR_STATUS);
		CHECK(r.status == 429);
		CHECK(r.retry_after == cases[i].want);
		CHECK(tl_http_parse_response(buf, (size_t)n - 2, KEY, "", 0, &r) == TL_HTTP_NEED_MORE);
		CHECK(r.retry_after == -1);
	}
}

/* test_body_framing: a refusal's Content-Length (any case, OWS trimmed,
 * clamped to 2^31; junk or absent -1) and a chunked Transfer-Encoding,
 * which an incomplete head does not report yet. */
static void test_body_framing(void)
{
	static const struct {
		const char *hdr;
		int64_t len;
		int chunked;
	} cases[] = {
		{"Content-Length: 17\r\n", 17, 0},
		{"content-length:  0 \r\n", 0, 0},
		{"Content-Length: 99999999999999999999\r\n", (int64_t)1 << 31, 0},
		{"Content-Length: 1e3\r\n", -1, 0},
		{"Transfer-Encoding: chunked\r\n", -1, 1},
		{"Transfer-Encoding: gzip, Chunked\r\n", -1, 1},
		{"Transfer-Encoding: gzip\r\n", -1, 0},
		{"", -1, 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char buf[256];
		tl_http_response r;
		int n = snprintf(buf, sizeof(buf), "HTTP/1.1 503 Service Unavailable\r\n%s\r\n", cases[i].hdr);
		CHECK(tl_http_parse_response(buf, (size_t)n, KEY, "", 0, &r) == TL_HTTP_ERR_STATUS);
		CHECK(r.content_length == cases[i].len);
		CHECK(r.chunked == cases[i].chunked);
		CHECK(tl_http_parse_response(buf, (size_t)n - 2, KEY, "", 0, &r) == TL_HTTP_NEED_MORE);
		CHECK(r.content_length == -1 && r.chunked == 0);
	}
}

/* test_chunked_end: the end of a chunked body is found after any chunk
 * sizes (case, leading zeros), extensions, trailers and data that looks
 * like an end; every proper prefix needs more; junk is not framing. */
static void test_chunked_end(void)
{
	static const char *complete[] = {
		"0\r\n\r\n",
		"5\r\nhello\r\n0\r\n\r\n",
		"5\r\nhello\r\n0;why=maint\r\n\r\n",
		"5;a=b\r\nhello\r\n0\r\nX-Reason: maint\r\nX-Other: 1\r\n\r\n",
		"005\r\nhello\r\n000\r\n\r\n",
		"A\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n",
		"11\r\nline1\r\n0\r\n\r\nline3\r\n0\r\n\r\n", /* data holding "\r\n0\r\n\r\n" */
	};
	for (size_t i = 0; i < sizeof(complete) / sizeof(complete[0]); i++) {
		size_t n = strlen(complete[i]);
		CHECK(tl_http_chunked_end(complete[i], n) == 1);
		for (size_t k = 0; k < n; k++)
			CHECK(tl_http_chunked_end(complete[i], k) == 0);
	}
	/* a one-byte trailer line is a field, not the empty line */
	CHECK(tl_http_chunked_end("0\r\nX\n", 5) == 0);
	CHECK(tl_http_chunked_end("0\r\nX\n\n", 6) == 1);
	CHECK(tl_http_chunked_end("zz\r\n", 4) == -1);
	CHECK(tl_http_chunked_end("5\r\nhelloXX0\r\n\r\n", 16) == -1);
	CHECK(tl_http_chunked_end("ffffffffffffffffff\r\n", 20) == -1);
	CHECK(tl_http_chunked_end("ffffffff\r\nabc", 13) == 0);
}

static void test_strerror(void)
{
	for (int c = -9; c <= 1; c++) {
		const char *s = tl_http_strerror(c);
		CHECK(s != NULL && s[0] != '\0');
		CHECK(strstr(s, "unknown") == NULL);
	}
	CHECK(strstr(tl_http_strerror(-100), "unknown") != NULL);
	CHECK(strstr(tl_http_strerror(TL_HTTP_ERR_STATUS), "101") != NULL);
}

int main(void)
{
	test_accept();
	test_make_key();
	test_write_request();
	test_responses();
	test_status_early();
	test_header_bomb();
	test_head_size();
	test_incremental_chunks();
	test_retry_after();
	test_body_framing();
	test_chunked_end();
	test_strerror();
	CHECK_DONE("test_http");
}
