/* codec/ws.h - RFC 6455 frame codec: header parse and encode, masking, close code
 * rules. Pure functions over caller buffers; the per-connection state
 * machine that uses them lives in ws/. */
#ifndef TALARIS_WS_H
#define TALARIS_WS_H

#include <stddef.h>
#include <stdint.h>

enum {
	TL_OP_CONT = 0x0,
	TL_OP_TEXT = 0x1,
	TL_OP_BINARY = 0x2,
	TL_OP_CLOSE = 0x8,
	TL_OP_PING = 0x9,
	TL_OP_PONG = 0xA,
};

/* Header parse results (negative) */
enum {
	TL_WS_NEED_MORE = 0,      /* not a full header yet */
	TL_WS_ERR_RSV = -1,       /* a reserved bit is set (no extension negotiated) */
	TL_WS_ERR_OPCODE = -2,    /* reserved opcode 3-7 or 0xB-0xF */
	TL_WS_ERR_MASKED = -3,    /* server frames must not be masked */
	TL_WS_ERR_CTRL_FRAG = -4, /* control frame without FIN */
	TL_WS_ERR_CTRL_LEN = -5,  /* control frame payload > 125 */
	TL_WS_ERR_LEN64 = -6,     /* 64-bit length with the most significant bit set */
};

typedef struct tl_ws_hdr {
	uint64_t len;     /* payload length */
	uint8_t fin;      /* 1 if FIN */
	uint8_t rsv;      /* RSV1..3 as bits 2..0 */
	uint8_t opcode;   /* 0..15 */
	uint8_t masked;   /* 1 if MASK bit */
	uint8_t mask[4];  /* valid when masked */
} tl_ws_hdr;

/* tl_ws_parse_hdr decodes the frame header at p[0..n). Returns the header
 * length (2..14) when complete and valid for a client receiving from a
 * server, TL_WS_NEED_MORE when more bytes are needed, or a TL_WS_ERR_* code.
 * Non-minimal length encodings are accepted (policy, see docs). Reads no
 * byte past p[n-1].
 *
 * Nothing is judged before 2 bytes are in; then the checks run in this
 * order (the same as the Go reference ws.ParseHeader): RSV, OPCODE,
 * MASKED, CTRL_FRAG, CTRL_LEN, and LEN64 as soon as byte 2 is in. So a
 * prefix never reports a different error than the whole header.
 * A control frame using the 16/64-bit length form is TL_WS_ERR_CTRL_LEN
 * even if the extended value is <= 125. *h is written only when the
 * result is > 0 (rsv and masked are then always 0, mask zeroed). */
int tl_ws_parse_hdr(const uint8_t *p, size_t n, tl_ws_hdr *h);

/* TL_WS_MAX_HDR is the longest header a client writes (2 + 8 + 4). */
#define TL_WS_MAX_HDR 14

/* tl_ws_write_hdr writes a masked client frame header for a payload of len
 * bytes with minimal length encoding into out (at least TL_WS_MAX_HDR
 * bytes). Returns the header length (6, 8 or 14). opcode is taken mod 16
 * and len should be < 2^63; neither is checked (caller's frames). */
size_t tl_ws_write_hdr(uint8_t *out, int fin, int opcode, uint64_t len, const uint8_t key[4]);

/* tl_ws_mask XORs n bytes of src with key into dst, starting at key offset
 * key_off (0..3, larger values wrap mod 4); dst may equal src, other
 * overlaps are not allowed. No alignment is required of either buffer.
 * To mask a payload in pieces, pass key_off = bytes already masked & 3. */
void tl_ws_mask(uint8_t *dst, const uint8_t *src, size_t n, const uint8_t key[4], size_t key_off);

/* tl_ws_close_code_ok returns 1 if code may appear in a received close frame
 * (1000-1003, 1007-1011, 1012-1014, 3000-4999), else 0. */
int tl_ws_close_code_ok(unsigned code);

#endif
