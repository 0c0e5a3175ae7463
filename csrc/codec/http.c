/* codec/http.c - the HTTP/1.1 upgrade codec (RFC 6455 section 4.1, RFC 9110/9112
 * syntax).
 *
 * The response parser is a stateless re-parse of the whole buffer on every
 * call: a head is at most TL_HTTP_MAX_HEAD bytes and arrives in one or two
 * reads, so keeping no state is cheaper than being wrong about it. It
 * enforces syntax and both size bounds in byte order as it scans, which
 * gives two properties the tests and fuzzers rely on:
 *   - a server that never finishes its head (or sends a header bomb) is
 *     rejected as soon as a bound is crossed, not when it stops sending;
 *   - a result other than TL_HTTP_NEED_MORE on a prefix is the result on
 *     every longer buffer, so byte-by-byte feeding equals one-shot parsing.
 * Semantic checks (status, Upgrade, Accept, ...) run once the head is
 * complete, so they can only be reported then. */
#include "codec/http.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/sha.h>

#define WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
#define WS_GUID_LEN (sizeof WS_GUID - 1)

/* Longest key tl_ws_accept hashes; real keys are TL_WS_KEY_LEN. Bounded so
 * the SHA-1 input fits on the stack and no allocation is needed. */
#define WS_KEY_MAX 128

static const char b64_alphabet[64] =
	"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* b64_encode writes the padded base64 of in[0..n) to out and returns its
 * length, 4 * ceil(n / 3). No NUL. */
static size_t b64_encode(char *out, const uint8_t *in, size_t n)
{
	size_t o = 0, i = 0;

	for (; n - i >= 3; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
		out[o++] = b64_alphabet[v >> 18];
		out[o++] = b64_alphabet[(v >> 12) & 63];
		out[o++] = b64_alphabet[(v >> 6) & 63];
		out[o++] = b64_alphabet[v & 63];
	}
	if (n - i == 1) {
		uint32_t v = (uint32_t)in[i] << 16;
		out[o++] = b64_alphabet[v >> 18];
		out[o++] = b64_alphabet[(v >> 12) & 63];
		out[o++] = '=';
		out[o++] = '=';
	} else if (n - i == 2) {
		uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8;
		out[o++] = b64_alphabet[v >> 18];
		out[o++] = b64_alphabet[(v >> 12) & 63];
		out[o++] = b64_alphabet[(v >> 6) & 63];
		out[o++] = '=';
	}
	return o;
}

int tl_ws_make_key(char key[TL_WS_KEY_LEN + 1])
{
	uint8_t raw[16];
	size_t got = 0;

	while (got < sizeof raw) {
		ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		got += (size_t)r;
	}
	b64_encode(key, raw, sizeof raw);
	key[TL_WS_KEY_LEN] = '\0';
	return 0;
}

void tl_ws_accept(const char *key, size_t key_len, char out[TL_WS_ACCEPT_LEN + 1])
{
	uint8_t in[WS_KEY_MAX + WS_GUID_LEN];
	uint8_t md[SHA_DIGEST_LENGTH];

	if (key_len > WS_KEY_MAX) {
		/* Cannot be a key we sent; an empty result matches no header. */
		out[0] = '\0';
		return;
	}
	memcpy(in, key, key_len);
	memcpy(in + key_len, WS_GUID, WS_GUID_LEN);
	SHA1(in, key_len + WS_GUID_LEN, md);
	b64_encode(out, md, sizeof md);
	out[TL_WS_ACCEPT_LEN] = '\0';
}

/* ---- request writer ---- */

struct wbuf {
	char *p;
	size_t cap, len;
	int overflow;
};

static void put(struct wbuf *w, const char *s, size_t n)
{
	if (w->overflow || w->cap - w->len < n) {
		w->overflow = 1;
		return;
	}
	memcpy(w->p + w->len, s, n);
	w->len += n;
}

#define PUTS(w, lit) put((w), (lit), sizeof(lit) - 1)

size_t tl_http_write_request(char *out, size_t cap, const tl_http_request *rq)
{
	struct wbuf w = {out, cap, 0, 0};

	PUTS(&w, "GET ");
	if (rq->path_len)
		put(&w, rq->path, rq->path_len);
	else
		PUTS(&w, "/");
	PUTS(&w, " HTTP/1.1\r\nHost: ");
	put(&w, rq->host, rq->host_len);
	PUTS(&w, "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: ");
	put(&w, rq->key, TL_WS_KEY_LEN);
	PUTS(&w, "\r\nSec-WebSocket-Version: 13\r\n");
	if (rq->protocols_len) {
		PUTS(&w, "Sec-WebSocket-Protocol: ");
		put(&w, rq->protocols, rq->protocols_len);
		PUTS(&w, "\r\n");
	}
	if (rq->headers_len)
		put(&w, rq->headers, rq->headers_len);
	PUTS(&w, "\r\n");
	if (w.overflow)
		return 0;
	if (w.len < cap)
		out[w.len] = '\0'; /* convenience only; the length is the contract */
	return w.len;
}

/* ---- response parser ---- */

/* tchar (RFC 9110 5.6.2): the only bytes a header name or a token may hold. */
static const uint8_t tchar[256] = {
	['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1,
	['*'] = 1, ['+'] = 1, ['-'] = 1, ['.'] = 1, ['^'] = 1, ['_'] = 1,
	['`'] = 1, ['|'] = 1, ['~'] = 1,
	['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1,
};

static inline int is_ows(uint8_t c) { return c == ' ' || c == '\t'; }

/* field-content and reason-phrase bytes: HTAB, SP, VCHAR, obs-text. CR,
 * LF, NUL and the other controls are excluded, which is what turns a bare
 * LF or a lone CR into a syntax error. */
static inline int is_field(uint8_t c) { return c == '\t' || (c >= 0x20 && c != 0x7F); }

static inline uint8_t lower(uint8_t c) { return (c >= 'A' && c <= 'Z') ? (uint8_t)(c | 0x20) : c; }

/* ieq compares s[0..n) with the lowercase literal lit, ignoring case. */
static int ieq(const uint8_t *s, size_t n, const char *lit)
{
	size_t i;

	for (i = 0; i < n; i++) {
		if (lit[i] == '\0' || lower(s[i]) != (uint8_t)lit[i])
			return 0;
	}
	return lit[i] == '\0';
}

/* has_token reports whether the comma-separated list v[0..n) holds tok
 * (lowercase) as one whole element, ignoring case and OWS around elements.
 * Empty elements are legal list syntax and skipped. */
static int has_token(const uint8_t *v, size_t n, const char *tok)
{
	size_t i = 0;

	while (i < n) {
		size_t s, e;

		while (i < n && (is_ows(v[i]) || v[i] == ','))
			i++;
		s = i;
		while (i < n && v[i] != ',')
			i++;
		e = i;
		while (e > s && is_ows(v[e - 1]))
			e--;
		if (e > s && ieq(v + s, e - s, tok))
			return 1;
	}
	return 0;
}

/* in_offer reports whether p[0..n) is exactly (case-sensitive) one element
 * of the comma-separated offer list. */
static int in_offer(const uint8_t *p, size_t n, const char *offer, size_t offer_len)
{
	const uint8_t *o = (const uint8_t *)offer;
	size_t i = 0;

	while (i < offer_len) {
		size_t s, e;

		while (i < offer_len && (is_ows(o[i]) || o[i] == ','))
			i++;
		s = i;
		while (i < offer_len && o[i] != ',')
			i++;
		e = i;
		while (e > s && is_ows(o[e - 1]))
			e--;
		if (e - s == n && n > 0 && memcmp(o + s, p, n) == 0)
			return 1;
	}
	return 0;
}

struct seen {
	int upgrade_ok, connection_ok, extensions, transfer, chunked;
	unsigned accepts, protocols;
	const uint8_t *accept; size_t accept_len;
	const uint8_t *protocol; size_t protocol_len;
	int64_t retry_after;
	int64_t content_length;
};

/* digits parses v as a decimal number clamped to max; -1 when v is empty
 * or not all digits. */
static int64_t digits(const uint8_t *v, size_t n, int64_t max)
{
	int64_t r = 0;
	if (n == 0)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (v[i] < '0' || v[i] > '9')
			return -1;
		if (r < max)
			r = r * 10 + (v[i] - '0');
	}
	return r > max ? max : r;
}

/* retry_seconds parses a Retry-After delta-seconds value, clamped to a
 * day; -1 when v is not all digits (an HTTP-date, say). */
static int64_t retry_seconds(const uint8_t *v, size_t n) { return digits(v, n, 86400); }

static void classify(struct seen *s, const uint8_t *name, size_t nl, const uint8_t *v, size_t vl)
{
	/* Dispatch on length first: almost every header is none of these. */
	switch (nl) {
	case 7:
		if (ieq(name, nl, "upgrade") && has_token(v, vl, "websocket"))
			s->upgrade_ok = 1;
		break;
	case 10:
		if (ieq(name, nl, "connection") && has_token(v, vl, "upgrade"))
			s->connection_ok = 1;
		break;
	case 11:
		if (ieq(name, nl, "retry-after"))
			s->retry_after = retry_seconds(v, vl);
		break;
	case 14:
		if (ieq(name, nl, "content-length"))
			s->content_length = digits(v, vl, (int64_t)1 << 31);
		break;
	case 17:
		if (ieq(name, nl, "transfer-encoding")) {
			s->transfer = 1;
			if (has_token(v, vl, "chunked"))
				s->chunked = 1;
		}
		break;
	case 20:
		if (ieq(name, nl, "sec-websocket-accept")) {
			s->accepts++;
			s->accept = v;
			s->accept_len = vl;
		}
		break;
	case 22:
		if (ieq(name, nl, "sec-websocket-protocol")) {
			s->protocols++;
			s->protocol = v;
			s->protocol_len = vl;
		}
		break;
	case 24:
		if (ieq(name, nl, "sec-websocket-extensions"))
			s->extensions = 1;
		break;
	}
}

int tl_http_parse_response(const char *buf, size_t len, const char *key,
			   const char *protocols, size_t protocols_len,
			   tl_http_response *out)
{
	static const char prefix[] = "HTTP/1.1 ";
	const uint8_t *p = (const uint8_t *)buf;
	/* Only the first TL_HTTP_MAX_HEAD bytes may hold the head; running
	 * out of them with more bytes available means the bound is crossed. */
	size_t lim = len < TL_HTTP_MAX_HEAD ? len : TL_HTTP_MAX_HEAD;
	int starved = len > TL_HTTP_MAX_HEAD ? TL_HTTP_ERR_TOO_LARGE : TL_HTTP_NEED_MORE;
	struct seen s;
	unsigned nhdr = 0;
	size_t i;
	int status, http10 = 0;

	out->status = 0;
	out->head_len = 0;
	out->protocol = NULL;
	out->protocol_len = 0;
	out->retry_after = -1;
	out->content_length = -1;
	out->chunked = 0;
	memset(&s, 0, sizeof s);
	s.retry_after = -1;
	s.content_length = -1;

	/* status-line = HTTP-version SP status-code SP [reason-phrase] CRLF;
	 * the SP before an empty reason is also tolerated as missing. An
	 * HTTP/1.0 line is read too, so that a refusal from an HTTP/1.0
	 * server (Go's TLS server answers a plaintext request with one) is
	 * reported as the status it is; it can never be the upgrade. */
	for (i = 0; i < sizeof prefix - 1; i++) {
		if (i >= lim)
			return starved;
		if (i == 7 && p[i] == '0')
			http10 = 1;
		else if (p[i] != (uint8_t)prefix[i])
			return TL_HTTP_ERR_SYNTAX;
	}
	status = 0;
	for (; i < sizeof prefix - 1 + 3; i++) {
		if (i >= lim)
			return starved;
		if (p[i] < '0' || p[i] > '9')
			return TL_HTTP_ERR_SYNTAX;
		status = status * 10 + (p[i] - '0');
	}
	if (i >= lim)
		return starved;
	if (p[i] == ' ') {
		i++;
		while (i < lim && is_field(p[i]))
			i++;
		if (i >= lim)
			return starved;
	}
	if (p[i] != '\r')
		return TL_HTTP_ERR_SYNTAX;
	if (i + 1 >= lim)
		return starved;
	if (p[i + 1] != '\n')
		return TL_HTTP_ERR_SYNTAX;
	i += 2;
	if (http10 && status == 101)
		return TL_HTTP_ERR_SYNTAX; /* a protocol switch is HTTP/1.1 only */
	out->status = status;

	for (;;) {
		size_t ns, ne, vs, ve;

		if (i >= lim)
			return starved;
		if (p[i] == '\r') {
			if (i + 1 >= lim)
				return starved;
			if (p[i + 1] != '\n')
				return TL_HTTP_ERR_SYNTAX;
			i += 2;
			break;
		}
		/* A line over TL_HTTP_MAX_HEADERS is refused on its first byte. */
		if (nhdr == TL_HTTP_MAX_HEADERS)
			return TL_HTTP_ERR_TOO_LARGE;
		nhdr++;

		/* field-name ":" OWS field-value OWS CRLF. A line starting with
		 * SP/HTAB (obs-fold), an empty name and whitespace before the
		 * colon all fail the tchar scan. */
		ns = i;
		while (i < lim && tchar[p[i]])
			i++;
		if (i >= lim)
			return starved;
		if (p[i] != ':' || i == ns)
			return TL_HTTP_ERR_SYNTAX;
		ne = i++;
		while (i < lim && is_ows(p[i]))
			i++;
		vs = i;
		while (i < lim && is_field(p[i]))
			i++;
		if (i >= lim)
			return starved;
		if (p[i] != '\r')
			return TL_HTTP_ERR_SYNTAX;
		if (i + 1 >= lim)
			return starved;
		if (p[i + 1] != '\n')
			return TL_HTTP_ERR_SYNTAX;
		ve = i;
		while (ve > vs && is_ows(p[ve - 1]))
			ve--;
		i += 2;
		classify(&s, p + ns, ne - ns, p + vs, ve - vs);
	}
	out->head_len = i;
	out->retry_after = s.retry_after;
	out->content_length = s.content_length;
	out->chunked = s.chunked;

	if (status != 101)
		return TL_HTTP_ERR_STATUS;
	/* A 101 has no body; framing it would desynchronise the stream. */
	if (s.transfer)
		return TL_HTTP_ERR_TRANSFER;
	if (!s.upgrade_ok)
		return TL_HTTP_ERR_UPGRADE;
	if (!s.connection_ok)
		return TL_HTTP_ERR_CONNECTION;
	if (s.accepts != 1 || s.accept_len != TL_WS_ACCEPT_LEN || key == NULL)
		return TL_HTTP_ERR_ACCEPT;
	{
		char want[TL_WS_ACCEPT_LEN + 1];

		tl_ws_accept(key, TL_WS_KEY_LEN, want);
		if (memcmp(want, s.accept, TL_WS_ACCEPT_LEN) != 0)
			return TL_HTTP_ERR_ACCEPT;
	}
	if (s.extensions)
		return TL_HTTP_ERR_EXTENSION;
	if (s.protocols) {
		size_t k;

		if (s.protocols != 1 || s.protocol_len == 0)
			return TL_HTTP_ERR_PROTOCOL;
		for (k = 0; k < s.protocol_len; k++) {
			if (!tchar[s.protocol[k]])
				return TL_HTTP_ERR_PROTOCOL;
		}
		if (!in_offer(s.protocol, s.protocol_len, protocols, protocols_len))
			return TL_HTTP_ERR_PROTOCOL;
		out->protocol = (const char *)s.protocol;
		out->protocol_len = s.protocol_len;
	}
	return TL_HTTP_OK;
}

static int hexval(uint8_t ch)
{
	if (ch >= '0' && ch <= '9')
		return ch - '0';
	ch |= 0x20;
	return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

int tl_http_chunked_end(const char *buf, size_t n)
{
	const uint8_t *b = (const uint8_t *)buf;
	size_t i = 0;

	for (;;) {
		uint64_t size = 0;
		size_t digits = 0;
		int v;

		while (i < n && (v = hexval(b[i])) >= 0) {
			if (size >> 56)
				return -1; /* no body is that long */
			size = size * 16 + (uint64_t)v;
			digits++;
			i++;
		}
		if (i == n)
			return 0;
		if (digits == 0)
			return -1;
		/* chunk extensions (";name=value") and the CRLF end the line */
		while (i < n && b[i] != '\n')
			i++;
		if (i == n)
			return 0;
		i++;
		if (size == 0) {
			/* trailer fields, one per line, until the empty line */
			for (;;) {
				size_t start = i;
				while (i < n && b[i] != '\n')
					i++;
				if (i == n)
					return 0;
				i++;
				/* the empty line: "\r\n", or a bare "\n" */
				if (i - start == 1 || (i - start == 2 && b[start] == '\r'))
					return 1;
			}
		}
		if (size > n - i)
			return 0;
		i += (size_t)size;
		if (n - i < 2)
			return 0;
		if (b[i] != '\r' || b[i + 1] != '\n')
			return -1;
		i += 2;
	}
}

const char *tl_http_strerror(int code)
{
	switch (code) {
	case TL_HTTP_OK: return "ok";
	case TL_HTTP_NEED_MORE: return "incomplete response head";
	case TL_HTTP_ERR_SYNTAX: return "malformed HTTP response";
	case TL_HTTP_ERR_TOO_LARGE: return "response head too large (over 16 KiB or 256 header lines)";
	case TL_HTTP_ERR_STATUS: return "unexpected HTTP status (want 101)";
	case TL_HTTP_ERR_UPGRADE: return "missing or wrong Upgrade header";
	case TL_HTTP_ERR_CONNECTION: return "missing or wrong Connection header";
	case TL_HTTP_ERR_ACCEPT: return "missing, duplicated or wrong Sec-WebSocket-Accept";
	case TL_HTTP_ERR_PROTOCOL: return "server chose a subprotocol not offered";
	case TL_HTTP_ERR_EXTENSION: return "server sent Sec-WebSocket-Extensions (none offered)";
	case TL_HTTP_ERR_TRANSFER: return "Transfer-Encoding in upgrade response";
	}
	return "unknown HTTP upgrade error";
}
