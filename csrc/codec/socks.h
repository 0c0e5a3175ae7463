/* codec/socks.h - the SOCKS5 client's replies (RFC 1928, RFC 1929): a
 * bounded, allocation-free parser of the three replies a client reads. Go
 * builds the requests (dial_linux.go); the loop's proxy handshake
 * (transport/proxy.c) reads the replies with this. */
#ifndef TALARIS_SOCKS_H
#define TALARIS_SOCKS_H

#include <stddef.h>
#include <stdint.h>

/* The replies, in the order a client reads them. */
enum {
	TL_SOCKS_METHOD = 0, /* method selection: VER(5) METHOD, 2 bytes */
	TL_SOCKS_AUTH = 1,   /* username/password status (RFC 1929): VER(1) STATUS, 2 bytes */
	TL_SOCKS_REPLY = 2,  /* CONNECT reply: VER(5) REP RSV(0) ATYP BND.ADDR BND.PORT: 10, 22 or 7 + name bytes */
};

/* Results other than a length. */
enum {
	TL_SOCKS_MORE = -1, /* a prefix of the reply: feed more bytes */
	TL_SOCKS_BAD = -2,  /* not that reply (version, reserved byte, address type) */
};

/* TL_SOCKS_MAX_REPLY is the longest reply: a CONNECT reply with a
 * 255-byte domain name. */
#define TL_SOCKS_MAX_REPLY (4 + 1 + 255 + 2)

/* tl_socks_parse parses b[0..n) as the start of reply step (TL_SOCKS_*).
 * Returns the reply's length (bytes consumed: what follows belongs to the
 * next step or the tunnel), TL_SOCKS_MORE or TL_SOCKS_BAD. *code gets
 * METHOD, STATUS or REP once the reply is complete (0 otherwise). Reads
 * at most TL_SOCKS_MAX_REPLY bytes of b; a verdict other than MORE on a
 * prefix is the verdict on every longer buffer. An unknown step is BAD. */
int tl_socks_parse(int step, const uint8_t *b, size_t n, uint8_t *code);

#endif
