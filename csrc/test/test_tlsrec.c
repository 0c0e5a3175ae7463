/* test_tlsrec.c - our TLS 1.3 receive record layer (tlsrec.c) against the
 * published trace of RFC 8448 ("Example Handshake Traces for TLS 1.3"),
 * section 3 "Simple 1-RTT Handshake" (AES-128-GCM, SHA-256): from the
 * server application traffic secret, the write key and iv
 * (HKDF-Expand-Label "key" / "iv"); then the three records the server
 * sends under them after the handshake, fed through tl_tlsrec_open from
 * receive slots whole and cut into pieces of every size that matters
 * (inside the header, the ciphertext, the tag, across records): the
 * NewSessionTicket is skipped, the application data is the RFC's 50
 * bytes, the close_notify ends the stream; one flipped ciphertext bit
 * fails the tag and reports nothing.
 *
 * Where the vectors come from: RFC 8448 section 3, the steps named above
 * each array (https://www.rfc-editor.org/rfc/rfc8448#section-3). The
 * values were transcribed from the trace as quoted in public test suites
 * (found with the code search: Erlang/OTP ssl's TLS 1.3 tests quote the
 * "{server} derive write traffic keys for application data" step and the
 * NewSessionTicket, and several suites quote the server's records; all
 * agree), then checked independently before this test was written: with
 * Python's `cryptography` AES-GCM, each record's tag verifies under this
 * key and iv at sequence numbers 0, 1, 2, and their inner plaintexts are
 * the NewSessionTicket below (type 22), 00..31 (type 23) and 01 00
 * (type 21). The client random in the keylog line is not the RFC's: the
 * layer ignores it. Every test runs twice: with our AES-GCM (gcm.h, where
 * this CPU runs it) and with the library's (tl_tlsrec.lib_gcm). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "transport/tlsrec.h"
#include "check.h"

/* {server} derive secret "tls13 s ap traffic": expanded (32 octets), as
 * the keylog line SSL_CTX_set_keylog_callback gives it. */
static const char keylog[] =
	"SERVER_TRAFFIC_SECRET_0 "
	"0000000000000000000000000000000000000000000000000000000000000000 "
	"a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643";

/* {server} derive write traffic keys for application data: key expanded
 * (16 octets), iv expanded (12 octets). */
static const uint8_t rfc_key[16] = {0x9f, 0x02, 0x28, 0x3b, 0x6c, 0x9c, 0x07, 0xef,
				    0xc2, 0x6b, 0xb9, 0xf2, 0xac, 0x92, 0xe3, 0x56};
static const uint8_t rfc_iv[12] = {0xcf, 0x78, 0x2b, 0x88, 0xdd, 0x83, 0x54, 0x9a, 0xad, 0xf1, 0xe9, 0x84};

/* {server} construct a NewSessionTicket handshake message:
 * NewSessionTicket (205 octets). */
static const char nst_hex[] = "04 00 00 c9 00 00 00 1e fa d6 aa"
			      "c5 02 00 00 00 b2 2c 03 5d 82 93 59 ee 5f f7 af 4e c9 00 00 00"
			      "00 26 2a 64 94 dc 48 6d 2c 8a 34 cb 33 fa 90 bf 1b 00 70 ad 3c"
			      "49 88 83 c9 36 7c 09 a2 be 78 5a bc 55 cd 22 60 97 a3 a9 82 11"
			      "72 83 f8 2a 03 a1 43 ef d3 ff 5d d3 6d 64 e8 61 be 7f d6 1d 28"
			      "27 db 27 9c ce 14 50 77 d4 54 a3 66 4d 4e 6d a4 d2 9e e0 37 25"
			      "a6 a4 da fc d0 fc 67 d2 ae a7 05 29 51 3e 3d a2 67 7f a5 90 6c"
			      "5b 3f 7d 8f 92 f2 28 bd a4 0d da 72 14 70 f9 fb f2 97 b5 ae a6"
			      "17 64 6f ac 5c 03 27 2e 97 07 27 c6 21 a7 91 41 ef 5f 7d e6 50"
			      "5e 5b fb c3 88 e9 33 43 69 40 93 93 4a e4 d3 57 00 08 00 2a 00"
			      "04 00 00 04 00";

/* {server} send handshake record (the NewSessionTicket, the first record
 * under the application keys): complete record (227 octets). */
static const char nst_record_hex[] = "17 03 03 00 de 3a 6b 8f 90 41 4a 97"
				     "d6 95 9c 34 87 68 0d e5 13 4a 2b 24 0e 6c ff ac 11 6e 95 d4 1d"
				     "6a f8 f6 b5 80 dc f3 d1 1d 63 c7 58 db 28 9a 01 59 40 25 2f 55"
				     "71 3e 06 1d c1 3e 07 88 91 a3 8e fb cf 57 53 ad 8e f1 70 ad 3c"
				     "73 53 d1 6d 9d a7 73 b9 ca 7f 2b 9f a1 b6 c0 d4 a3 d0 3f 75 e0"
				     "9c 30 ba 1e 62 97 2a c4 6f 75 f7 b9 81 be 63 43 9b 29 99 ce 13"
				     "06 46 15 13 98 91 d5 e4 c5 b4 06 f1 6e 3f c1 81 a7 7c a4 75 84"
				     "00 25 db 2f 0a 77 f8 1b 5a b0 5b 94 c0 13 46 75 5f 69 23 2c 86"
				     "51 9d 86 cb ee ac 87 aa c3 47 d1 43 f9 60 5d 64 f6 50 db 4d 02"
				     "3e 70 e9 52 ca 49 fe 51 37 12 1c 74 bc 26 97 68 7e 24 87 46 d6"
				     "df 35 30 05 f3 bc e1 86 96 12 9c 81 53 55 6b 3b 6c 67 79 b3 7b"
				     "f1 59 85 68 4f";

/* {server} send application_data record: complete record (72 octets);
 * its payload (50 octets) is 00 01 02 ... 31. */
static const char data_record_hex[] = "17 03 03 00 43 2e 93 7e 11 ef 4a c7"
				      "40 e5 38 ad 36 00 5f c4 a4 69 32 fc 32 25 d0 5f 82 aa 1b 36 e3"
				      "0e fa f9 7d 90 e6 df fc 60 2d cb 50 1a 59 a8 fc c4 9c 4b f2 e5"
				      "f0 a2 1c 00 47 c2 ab f3 32 54 0d d0 32 e1 67 c2 95 5d";
#define RFC_DATA_LEN 50

/* {server} send alert record (close_notify, 01 00): complete record
 * (24 octets). */
static const char alert_record_hex[] = "17 03 03 00 13 b5 8f d6 71 66 eb f5"
				       "99 d2 47 20 cf be 7e fa 7a 88 64 a9";

/* unhex appends the hex bytes of s (spaces ignored) at out; returns how
 * many. */
static size_t unhex(const char *s, uint8_t *out)
{
	size_t n = 0;
	int hi = -1;

	for (; *s; s++) {
		int v;
		if (*s == ' ')
			continue;
		v = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10 : -1;
		CHECK(v >= 0);
		if (hi < 0) {
			hi = v;
		} else {
			out[n++] = (uint8_t)(hi << 4 | v);
			hi = -1;
		}
	}
	CHECK(hi < 0);
	return n;
}

/* lib_gcm: the pass opens with the library's AES-GCM (tl_tlsrec.lib_gcm),
 * else with gcm.h where this CPU runs it. */
static int lib_gcm;

static void start(struct tl_tlsrec *r)
{
	memset(r, 0, sizeof(*r));
	r->lib_gcm = (uint8_t)lib_gcm;
	CHECK_EQ(tl_tlsrec_keylog(r, keylog), 1);
	CHECK_EQ(r->secret_len, 32);
	CHECK_EQ(tl_tlsrec_start(r, TL_TLS_AES_128_GCM_SHA256, 0), 0);
	CHECK(tl_tlsrec_active(r));
	CHECK_EQ(r->gcm != NULL, !lib_gcm && tl_gcm_supported());
}

/* test_keys: the iv the layer derived is the RFC's; so is its key, seen
 * through the cipher it keyed: GCM encrypts as a counter mode, so the
 * layer's context turning 32 zero bytes into the same keystream as a
 * context keyed with the RFC's key, under the same nonce, means the same
 * AES key (the records below check the two again, through the tags). */
static void test_keys(void)
{
	static const uint8_t zeros[32];
	uint8_t want[32], got[32];
	struct tl_tlsrec r;
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	int outl = 0;

	start(&r);
	CHECK(memcmp(r.iv, rfc_iv, sizeof(rfc_iv)) == 0);
	CHECK(c != NULL);
	CHECK_EQ(EVP_EncryptInit_ex(c, EVP_aes_128_gcm(), NULL, rfc_key, rfc_iv), 1);
	CHECK_EQ(EVP_EncryptUpdate(c, want, &outl, zeros, sizeof(zeros)), 1);
	CHECK_EQ(outl, sizeof(zeros));
	EVP_CIPHER_CTX_free(c);
	CHECK_EQ(EVP_DecryptInit_ex(r.ctx, NULL, NULL, NULL, rfc_iv), 1);
	CHECK_EQ(EVP_DecryptUpdate(r.ctx, got, &outl, zeros, sizeof(zeros)), 1);
	CHECK_EQ(outl, sizeof(zeros));
	CHECK(memcmp(want, got, sizeof(want)) == 0);
	tl_tlsrec_free(&r);
	CHECK(!tl_tlsrec_active(&r));
}

/* The server's flight after the handshake, in order, and what the layer
 * must make of it. */
static uint8_t flight[512], nst[205];
static size_t flight_len, nst_end, data_end;

/* run feeds flight (with bit flip_bit flipped, or none when negative) to a
 * fresh layer in pieces of cut bytes, each piece in its own receive slot
 * pushed when the layer has opened everything before it (ciphertext
 * arrives as it does from the kernel), and checks each outcome: the
 * NewSessionTicket skipped (its plaintext the RFC's), the data the RFC's,
 * then close_notify; with a bit flipped in the data record, an error
 * instead of it and nothing reported. Every slot comes back. */
static void run(size_t cut, long flip_bit)
{
	struct tl_slots s;
	struct tl_rxq q;
	struct tl_tlsrec r;
	uint8_t in[sizeof(flight)];
	/* The callers' least room (2^14), allocated exactly so that ASan
	 * sees a write past it. */
	uint8_t *dst = malloc(1u << 14);
	size_t at = 0, n = 0;
	int step = 0, done = 0;
	char ctx[64];

	snprintf(ctx, sizeof(ctx), "cut %zu, flip %ld", cut, flip_bit);
	CHECK_CTX(ctx);
	CHECK_ROW(dst != NULL);
	memcpy(in, flight, flight_len);
	if (flip_bit >= 0)
		in[flip_bit / 8] ^= (uint8_t)(1u << (flip_bit % 8));
	CHECK_ROW_EQ(tl_slots_alloc(&s, 64), 0);
	CHECK_ROW_EQ(tl_slots_pt_map(&s), 0);
	tl_rxq_init(&q);
	start(&r);
	while (!done) {
		int rc;
		if (at < flight_len) {
			size_t k = flight_len - at < cut ? flight_len - at : cut;
			int32_t id = tl_slots_pt_get(&s);
			CHECK_ROW(id >= 0);
			memcpy(tl_slots_ptr(&s, (uint32_t)id), in + at, k);
			s.len[id] = (uint32_t)k;
			s.next[id] = -1;
			tl_rxq_push_chain(&s, &q, (uint32_t)id, (uint32_t)id, 1);
			at += k;
		}
		/* Everything queued is opened before more comes. */
		while ((rc = tl_tlsrec_open(&r, &s, &q, 0, dst, 1u << 14, &n)) != TL_REC_MORE) {
			switch (step++) {
			case 0: /* the NewSessionTicket: skipped, nothing reported */
				CHECK_ROW_EQ(rc, TL_REC_AGAIN);
				CHECK_ROW_EQ(r.seq, 1);
				/* Its plaintext was opened at dst, read there and
				 * wiped: no handshake plaintext stays in the slot. */
				CHECK_ROW(memcmp(dst, nst, sizeof(nst)) != 0);
				for (size_t z = 0; z <= sizeof(nst); z++)
					CHECK_ROW_EQ(dst[z], 0);
				CHECK_ROW(tl_tlsrec_boundary(&r));
				/* the ticket's bytes are read: its slots are back */
				CHECK_ROW(at >= nst_end);
				break;
			case 1:
				if (flip_bit >= 0) {
					CHECK_ROW_EQ(rc, TL_REC_ERR);
					CHECK_ROW(strstr(r.err, "bad record MAC") != NULL);
					/* The unverified plaintext written at dst is gone. */
					for (size_t z = 0; z < 32; z++)
						CHECK_ROW_EQ(dst[z], 0);
					done = 1;
					break;
				}
				CHECK_ROW_EQ(rc, TL_REC_DATA);
				CHECK_ROW_EQ(n, RFC_DATA_LEN);
				for (size_t i = 0; i < RFC_DATA_LEN; i++)
					CHECK_ROW_EQ(dst[i], i);
				CHECK_ROW_EQ(r.seq, 2);
				CHECK_ROW(at >= data_end);
				break;
			case 2: /* close_notify: the end, and the last byte */
				CHECK_ROW_EQ(rc, TL_REC_EOF);
				CHECK_ROW_EQ(r.seq, 3);
				CHECK_ROW_EQ(at, flight_len);
				done = 1;
				break;
			default:
				CHECK_ROW(!"a record past close_notify");
			}
			if (done)
				break;
		}
		/* Nothing is reported before its record's last byte came. */
		CHECK_ROW(step == 0 || at >= nst_end);
		CHECK_ROW(step <= 1 || at >= data_end);
		CHECK_ROW(done || at < flight_len || rc == TL_REC_MORE);
		if (!done && at == flight_len)
			CHECK_ROW(!"the flight ended before close_notify");
	}
	if (flip_bit < 0) {
		/* The stream ended with its last byte: nothing left queued. */
		CHECK_ROW(tl_rxq_empty(&q));
	}
	tl_rxq_drain(&s, &q, 0);
	CHECK_ROW_EQ(s.pt_nfree, s.pt_count);
	tl_tlsrec_free(&r);
	tl_slots_free(&s, NULL);
	free(dst);
	CHECK_CTX("");
}

/* run_all runs every test of this file once (with the lib_gcm set). */
static void run_all(void)
{
	test_keys();
	/* Whole; a byte at a time; cuts inside the 5-byte header, at the
	 * tag's size and one past it, at the data record's length (so pieces
	 * straddle records), and a record and a half. */
	static const size_t cuts[] = {1, 2, 3, 5, 7, 16, 17, 64, 72, 100, 227, 340, sizeof(flight)};
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++)
		run(cuts[i], -1);
	/* One bit of the data record's ciphertext, of its first and last
	 * byte and of its tag: the tag fails, the data is not reported. */
	const long flips[] = {(long)(nst_end + 5) * 8, (long)(nst_end + 5 + 20) * 8 + 3,
				     (long)(data_end - 17) * 8 + 7, (long)(data_end - 1) * 8};
	for (size_t i = 0; i < sizeof(flips) / sizeof(flips[0]); i++) {
		run(sizeof(flight), flips[i]);
		run(1, flips[i]);
	}
}

int main(void)
{
	size_t n;

	flight_len = unhex(nst_record_hex, flight);
	CHECK_EQ(flight_len, 227);
	nst_end = flight_len;
	n = unhex(data_record_hex, flight + flight_len);
	CHECK_EQ(n, 72);
	flight_len += n;
	data_end = flight_len;
	n = unhex(alert_record_hex, flight + flight_len);
	CHECK_EQ(n, 24);
	flight_len += n;
	CHECK_EQ(unhex(nst_hex, nst), sizeof(nst));

	for (lib_gcm = 0; lib_gcm <= 1; lib_gcm++)
		run_all();
	CHECK_DONE("test_tlsrec");
}
