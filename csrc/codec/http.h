/* codec/http.h - the HTTP/1.1 upgrade codec: a request writer and a bounded,
 * allocation-free response parser (picohttpparser's shape, our own code). */
#ifndef TALARIS_HTTP_H
#define TALARIS_HTTP_H

#include <stddef.h>
#include <stdint.h>

#define TL_HTTP_MAX_HEAD 16384  /* bytes of status line + headers accepted */
#define TL_HTTP_MAX_HEADERS 256 /* header lines accepted (CDNs and proxies add dozens) */
#define TL_WS_KEY_LEN 24        /* base64 of 16 random bytes */
#define TL_WS_ACCEPT_LEN 28     /* base64 of a SHA-1 */

/* tl_ws_make_key fills key (TL_WS_KEY_LEN bytes + NUL) with base64 of 16
 * bytes from the kernel CSPRNG (getrandom). Returns 0, or -1 if getrandom
 * failed (errno set; key contents then unspecified). */
int tl_ws_make_key(char key[TL_WS_KEY_LEN + 1]);

/* tl_ws_accept computes Sec-WebSocket-Accept for key into out
 * (TL_WS_ACCEPT_LEN bytes + NUL): base64(SHA-1(key + RFC 6455 GUID)).
 * key need not be NUL-terminated. A key longer than 128 bytes cannot be
 * one we sent; out is then the empty string, which matches no header. */
void tl_ws_accept(const char *key, size_t key_len, char out[TL_WS_ACCEPT_LEN + 1]);

/* tl_http_request describes one upgrade request. Strings need not be
 * NUL-terminated; headers is a block of complete "Name: value\r\n" lines
 * (may be empty) already checked by the caller for CR/LF injection;
 * protocols is a comma-separated offer list or empty. */
typedef struct tl_http_request {
	const char *host; size_t host_len;       /* Host header value, port included when not default */
	const char *path; size_t path_len;       /* request-target, "/" when empty */
	const char *headers; size_t headers_len;
	const char *protocols; size_t protocols_len;
	const char *key;                          /* TL_WS_KEY_LEN chars */
} tl_http_request;

/* tl_http_write_request writes the request into out (cap bytes). Returns
 * its length, or 0 if cap is too small (out then holds a partial request).
 * A NUL is appended when there is room for it; it is not counted. */
size_t tl_http_write_request(char *out, size_t cap, const tl_http_request *rq);

/* Response parse results */
enum {
	TL_HTTP_OK = 1,              /* complete, valid 101 upgrade */
	TL_HTTP_NEED_MORE = 0,       /* incomplete: feed more bytes */
	TL_HTTP_ERR_SYNTAX = -1,     /* not an HTTP/1.1 response, bad header line */
	TL_HTTP_ERR_TOO_LARGE = -2,  /* head over TL_HTTP_MAX_HEAD or more than TL_HTTP_MAX_HEADERS lines */
	TL_HTTP_ERR_STATUS = -3,     /* status is not 101 (status field holds it) */
	TL_HTTP_ERR_UPGRADE = -4,    /* Upgrade header missing or not "websocket" */
	TL_HTTP_ERR_CONNECTION = -5, /* Connection header missing or lacks the "upgrade" token */
	TL_HTTP_ERR_ACCEPT = -6,     /* Sec-WebSocket-Accept missing, duplicated or wrong */
	TL_HTTP_ERR_PROTOCOL = -7,   /* subprotocol not offered, or more than one */
	TL_HTTP_ERR_EXTENSION = -8,  /* any Sec-WebSocket-Extensions (we offer none) */
	TL_HTTP_ERR_TRANSFER = -9,   /* Transfer-Encoding present */
};

/* tl_http_response is the parse result. protocol points into the parsed
 * buffer (not NUL-terminated). */
typedef struct tl_http_response {
	int status;                 /* status code, once the status line parsed */
	size_t head_len;            /* bytes of the head incl. the final CRLFCRLF; frame bytes follow */
	const char *protocol; size_t protocol_len; /* agreed subprotocol, len 0 if none */
	int64_t retry_after;        /* Retry-After in seconds (delta-seconds form), -1 if absent or not a number */
	int64_t content_length;     /* Content-Length (clamped to 2^31), -1 if absent or not a number */
	int chunked;                /* Transfer-Encoding names chunked */
} tl_http_response;

/* tl_http_parse_response parses buf[0..len) as the server's reply to an
 * upgrade request with key and the offered protocols (comma-separated, may
 * be empty). Stateless: call again with the grown buffer when it returns
 * TL_HTTP_NEED_MORE. Bytes past head_len belong to the WebSocket stream.
 * Never reads past buf[len-1] and never allocates. key is TL_WS_KEY_LEN
 * chars (NUL not needed), as sent in the request.
 *
 * Syntax (CRLF only, no obs-fold, tchar names, no space before ':') and
 * both size bounds are checked as bytes arrive, so SYNTAX and TOO_LARGE
 * may be returned before the head is complete; every other verdict only
 * once it is, in this order: STATUS, TRANSFER, UPGRADE, CONNECTION,
 * ACCEPT, EXTENSION, PROTOCOL. A verdict other than NEED_MORE on a prefix
 * is the verdict on any longer buffer. out is always written: status once
 * the status line is complete (else 0), head_len once the head is
 * complete (else 0), protocol only with TL_HTTP_OK (else NULL, 0),
 * retry_after once the head is complete (else -1; an HTTP-date value
 * counts as absent; values are clamped to 86400), content_length and
 * chunked once the head is complete (else -1 and 0): how a refusal's body
 * is framed. */
int tl_http_parse_response(const char *buf, size_t len, const char *key,
			   const char *protocols, size_t protocols_len,
			   tl_http_response *out);

/* tl_http_chunked_end reports whether b[0..n) holds the end of a chunked
 * body: chunks (hex size, any case and leading zeros, extensions after ';'
 * ignored, then the data and its CRLF), the last chunk (size 0) and the
 * trailer section's empty line. Returns 1 when the end is in b, 0 when more
 * bytes are needed, -1 when b is not chunked framing (nothing more is
 * worth waiting for). One pass over at most n bytes; never allocates. */
int tl_http_chunked_end(const char *b, size_t n);

/* tl_http_strerror names a TL_HTTP_* code: a static string, never NULL
 * ("unknown ..." for codes outside the enum). */
const char *tl_http_strerror(int code);

#endif
