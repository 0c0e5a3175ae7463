/* bench_ws.c - ns per operation for the codec's hot calls, on the shapes a
 * market-data feed produces: small text frames with short JSON bodies.
 * Single-threaded, no sanitizers; numbers are indicative on a shared box
 * (take the best of a few runs). */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "codec/http.h"
#include "codec/utf8.h"
#include "codec/ws.h"

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static volatile uint64_t sink;

/* A stream of headers back to back: 7-bit, 16-bit and 64-bit forms. */
static void bench_hdr(void)
{
	static uint8_t buf[4096];
	size_t n = 0, frames = 0;

	while (n + 10 <= sizeof buf) {
		switch (frames % 4) {
		case 0: buf[n++] = 0x81; buf[n++] = 40; break;
		case 1: buf[n++] = 0x82; buf[n++] = 8; break;
		case 2: buf[n++] = 0x81; buf[n++] = 126; buf[n++] = 0x01; buf[n++] = 0x00; break;
		default:
			buf[n++] = 0x82; buf[n++] = 127;
			memcpy(buf + n, "\0\0\0\0\0\1\0\0", 8); n += 8; break;
		}
		frames++;
	}
	const int rounds = 20000;
	uint64_t acc = 0, parsed = 0;
	double best = 1e30;
	for (int rep = 0; rep < 3; rep++) {
		double t0 = now_ns();
		for (int r = 0; r < rounds; r++) {
			size_t at = 0;
			tl_ws_hdr h;
			while (at < n) {
				int hl = tl_ws_parse_hdr(buf + at, n - at, &h);
				if (hl <= 0)
					break;
				acc += h.len;
				at += (size_t)hl;
				parsed++;
			}
		}
		double dt = (now_ns() - t0) / ((double)rounds * (double)frames);
		if (dt < best)
			best = dt;
	}
	sink = acc + parsed;
	printf("ws header parse      %7.2f ns/header   (mixed 2/4/10-byte headers)\n", best);
}

static void bench_utf8(const char *label, const char *text, int rounds)
{
	size_t n = strlen(text);
	double best = 1e30;
	uint64_t ok = 0;

	for (int rep = 0; rep < 3; rep++) {
		double t0 = now_ns();
		for (int r = 0; r < rounds; r++)
			ok += (uint64_t)tl_utf8_valid((const uint8_t *)text, n);
		double dt = (now_ns() - t0) / rounds;
		if (dt < best)
			best = dt;
	}
	sink = ok;
	printf("utf8 %-15s %7.2f ns/text      (%zu bytes, %.2f GB/s)\n", label, best, n, (double)n / best);
}

static void bench_mask(size_t n)
{
	static uint8_t buf[65536 + 8];
	const uint8_t key[4] = {1, 2, 3, 4};
	int rounds = (int)(200000000 / (n + 16));
	double best = 1e30;

	for (int rep = 0; rep < 3; rep++) {
		double t0 = now_ns();
		for (int r = 0; r < rounds; r++)
			tl_ws_mask(buf + 1, buf + 1, n, key, (size_t)r & 3);
		double dt = (now_ns() - t0) / rounds;
		if (dt < best)
			best = dt;
	}
	sink = buf[1];
	printf("ws mask %6zu B      %7.2f ns/call      (%.2f GB/s, unaligned)\n", n, best, (double)n / best);
}

static void bench_http(void)
{
	static const char resp[] = "HTTP/1.1 101 Switching Protocols\r\n"
				   "Upgrade: websocket\r\n"
				   "Connection: Upgrade\r\n"
				   "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"
				   "Date: Mon, 01 Jan 2024 00:00:00 GMT\r\n"
				   "Server: nginx\r\n\r\n";
	const int rounds = 200000;
	tl_http_response r;
	int okc = 0;
	double t0 = now_ns();

	for (int i = 0; i < rounds; i++)
		okc += tl_http_parse_response(resp, sizeof resp - 1, "dGhlIHNhbXBsZSBub25jZQ==", "", 0, &r) == TL_HTTP_OK;
	double dt = (now_ns() - t0) / rounds;
	sink = (uint64_t)okc;
	printf("http 101 parse       %7.1f ns/response (%zu bytes, incl. SHA-1)\n", dt, sizeof resp - 1);
}

int main(void)
{
	bench_hdr();
	bench_utf8("json ascii", "{\"id\":1234567,\"px\":\"27123.50\",\"qty\":\"0.013\",\"side\":\"buy\"}", 5000000);
	bench_utf8("json short", "{\"id\":42}", 10000000);
	bench_utf8("json nonascii", "{\"sym\":\"\xE2\x82\xAC/USD\",\"note\":\"\xE6\x9D\xB1\xE4\xBA\xAC\",\"px\":\"1.0852\"}", 5000000);
	bench_mask(64);
	bench_mask(4096);
	bench_http();
	return 0;
}
