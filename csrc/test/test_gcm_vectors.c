/* test_gcm_vectors.c - published AES-GCM vectors through gcm.c and the
 * library: every row with a 96-bit IV and a 128-bit tag (AES-128 and
 * AES-256) of NIST's CAVS gcmDecrypt128.rsp and gcmDecrypt256.rsp (FAIL
 * rows included) and of Wycheproof's aes_gcm_test.json (valid and
 * invalid). Each row is opened whole, in place, and in random pieces
 * (tl_gcm_decrypt per piece, as the record layer feeds a record cut
 * across receive slots) by the native VAES build where the CPU has it, by
 * the emulated build (gcm_emul.h) everywhere, and by the library's EVP
 * AES-GCM as tlsrec.c calls it. A valid row must open to its plaintext,
 * an invalid one be refused, and no byte land past the end (guard bytes).
 * Files: argv[1..3], else $TL_VECTORS_DIR (./build.sh vectors fetches
 * them), else build/vectors. TL_TEST_GCM_NO_NATIVE=1 runs as on a CPU
 * without VAES. Which builds ran is appended to $TL_TEST_SUMMARY. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gcm_impls.h"

enum { GUARD = 32, MAXROW = 1 << 16 };

struct row {
	uint8_t key[32], iv[12], tag[16];
	size_t klen, ivlen, alen, n, tlen;
	uint8_t aad[1024], ct[MAXROW], pt[MAXROW];
	int valid; /* 1 valid, 0 invalid */
};

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint32_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 11);
}

static size_t unhex(const char *s, uint8_t *out, size_t cap)
{
	size_t n = 0;
	int hi = -1;

	for (; *s && *s != '"' && *s != '\r' && *s != '\n'; s++) {
		int v = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10 : -1;
		if (*s == ' ')
			continue;
		CHECK(v >= 0);
		if (hi < 0) {
			hi = v;
		} else {
			CHECK(n < cap);
			out[n++] = (uint8_t)(hi << 4 | v);
			hi = -1;
		}
	}
	CHECK(hi < 0);
	return n;
}

struct counts {
	int rows, valid, invalid, skipped;
};

static int native_on, emul_on;
static struct tl_gcm *gn, *ge;
static EVP_CIPHER_CTX *lib;
static uint8_t buf[MAXROW + 2 * GUARD];

/* check_open opens r with one opener in one way and checks the verdict,
 * the plaintext and the guards. who: 0 native, 1 emulated, 2 library. */
static void check_open(const struct row *r, int who, int inplace, const size_t *cuts, int ncut)
{
	uint8_t *out = buf + GUARD;
	const uint8_t *in = inplace ? out : r->ct;
	int v;

	memset(buf, 0x5a, sizeof(buf));
	if (inplace)
		memcpy(out, r->ct, r->n);
	if (who == 2)
		v = gcm_lib_open(lib, r->key, r->klen, r->iv, r->aad, r->alen, in, out, r->n, r->tag, cuts, ncut);
	else
		v = gcm_impl_open(who ? &gcm_emul : &gcm_native, who ? ge : gn, r->key, r->klen, r->iv, r->aad,
				  r->alen, in, out, r->n, r->tag, cuts, ncut);
	CHECK_EQ(v, r->valid ? 0 : -1);
	if (r->valid)
		CHECK(memcmp(out, r->pt, r->n) == 0);
	for (size_t i = 0; i < GUARD; i++) {
		CHECK_EQ(buf[i], 0x5a);
		CHECK_EQ(out[r->n + i], 0x5a);
	}
}

static void run_row(const struct row *r, struct counts *c, int ran[3])
{
	if (r->ivlen != 12 || r->tlen != 16 || (r->klen != 16 && r->klen != 32)) {
		c->skipped++;
		return;
	}
	c->rows++;
	if (r->valid)
		c->valid++;
	else
		c->invalid++;
	for (int who = 0; who < 3; who++) {
		if ((who == 0 && !native_on) || (who == 1 && !emul_on))
			continue;
		ran[who]++;
		check_open(r, who, 0, NULL, 0);
		check_open(r, who, 1, NULL, 0);
		for (int k = 0; k < 3; k++) {
			size_t cuts[8];
			int ncut = (int)(rnd() % 8);
			for (int i = 0; i < ncut; i++)
				cuts[i] = r->n ? rnd() % (r->n + 1) : 0;
			for (int i = 1; i < ncut; i++) /* insertion sort: ascending */
				for (int j = i; j > 0 && cuts[j - 1] > cuts[j]; j--) {
					size_t t = cuts[j];
					cuts[j] = cuts[j - 1];
					cuts[j - 1] = t;
				}
			check_open(r, who, k & 1, cuts, ncut);
		}
	}
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *s;
	long n;

	if (!f) {
		fprintf(stderr, "test_gcm_vectors: cannot open %s: run ./build.sh vectors (fetches the pinned vectors)\n",
			path);
		exit(1);
	}
	CHECK(fseek(f, 0, SEEK_END) == 0);
	n = ftell(f);
	CHECK(n > 0);
	rewind(f);
	s = malloc((size_t)n + 1);
	CHECK(s != NULL);
	CHECK_EQ(fread(s, 1, (size_t)n, f), n);
	s[n] = 0;
	fclose(f);
	return s;
}

static const char *after(const char *line, const char *key)
{
	size_t k = strlen(key);
	return strncmp(line, key, k) == 0 ? line + k : NULL;
}

/* CAVS .rsp: [Keylen = ..] [IVlen = ..] [Taglen = ..] sections (bits),
 * rows of Key, IV, CT, AAD, Tag, then PT = or FAIL. CRLF lines. */
static struct counts run_rsp(const char *path, int ran[3])
{
	static struct row r;
	struct counts c = {0, 0, 0, 0};
	char *s = slurp(path), *line, *save = NULL;
	size_t ivbits = 0, tagbits = 0;
	const char *v;

	for (line = strtok_r(s, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if ((v = after(line, "[IVlen = ")))
			ivbits = (size_t)atoi(v);
		else if ((v = after(line, "[Taglen = ")))
			tagbits = (size_t)atoi(v);
		else if (after(line, "Count = ")) {
			memset(r.key, 0, sizeof(r.key));
			r.ivlen = ivbits / 8;
			r.tlen = tagbits / 8;
		} else if ((v = after(line, "Key = ")))
			r.klen = unhex(v, r.key, sizeof(r.key));
		else if ((v = after(line, "IV = ")))
			r.ivlen = ivbits == 96 ? unhex(v, r.iv, sizeof(r.iv)) : 0;
		else if ((v = after(line, "CT = ")))
			r.n = unhex(v, r.ct, sizeof(r.ct));
		else if ((v = after(line, "AAD = ")))
			r.alen = unhex(v, r.aad, sizeof(r.aad));
		else if ((v = after(line, "Tag = "))) {
			if (tagbits == 128)
				CHECK_EQ(unhex(v, r.tag, sizeof(r.tag)), 16);
		} else if ((v = after(line, "PT = "))) {
			CHECK_EQ(unhex(v, r.pt, sizeof(r.pt)), r.n);
			r.valid = 1;
			run_row(&r, &c, ran);
		} else if (after(line, "FAIL")) {
			r.valid = 0;
			run_row(&r, &c, ran);
		}
	}
	free(s);
	return c;
}

/* Wycheproof's JSON is regular: one "name" : value per line, a group's
 * ivSize/keySize/tagSize before its tests, a test's fields in the order
 * key, iv, aad, msg, ct, tag, result. */
static struct counts run_json(const char *path, int ran[3])
{
	static struct row r;
	struct counts c = {0, 0, 0, 0};
	char *s = slurp(path), *line, *save = NULL;
	size_t ivbits = 0, tagbits = 0, keybits = 0;
	const char *v;

	for (line = strtok_r(s, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		while (*line == ' ')
			line++;
		if ((v = after(line, "\"ivSize\" : ")))
			ivbits = (size_t)atoi(v);
		else if ((v = after(line, "\"keySize\" : ")))
			keybits = (size_t)atoi(v);
		else if ((v = after(line, "\"tagSize\" : ")))
			tagbits = (size_t)atoi(v);
		else if ((v = after(line, "\"key\" : \""))) {
			r.klen = keybits == 128 || keybits == 256 ? unhex(v, r.key, sizeof(r.key)) : 0;
			r.ivlen = ivbits / 8;
			r.tlen = tagbits / 8;
		} else if ((v = after(line, "\"iv\" : \""))) {
			if (ivbits == 96)
				CHECK_EQ(unhex(v, r.iv, sizeof(r.iv)), 12);
		} else if ((v = after(line, "\"aad\" : \"")))
			r.alen = unhex(v, r.aad, sizeof(r.aad));
		else if ((v = after(line, "\"msg\" : \"")))
			unhex(v, r.pt, sizeof(r.pt));
		else if ((v = after(line, "\"ct\" : \"")))
			r.n = unhex(v, r.ct, sizeof(r.ct));
		else if ((v = after(line, "\"tag\" : \""))) {
			if (tagbits == 128)
				CHECK_EQ(unhex(v, r.tag, sizeof(r.tag)), 16);
		} else if ((v = after(line, "\"result\" : \""))) {
			if (strncmp(v, "acceptable", 10) == 0) {
				c.skipped++; /* neither verdict is wrong */
				continue;
			}
			r.valid = strncmp(v, "valid", 5) == 0;
			CHECK(r.valid || strncmp(v, "invalid", 7) == 0);
			run_row(&r, &c, ran);
		}
	}
	free(s);
	return c;
}

static void summary(const char *line)
{
	const char *p = getenv("TL_TEST_SUMMARY");
	FILE *f;

	printf("%s\n", line);
	if (p && *p && (f = fopen(p, "a"))) {
		fprintf(f, "%s\n", line);
		fclose(f);
	}
}

int main(int argc, char **argv)
{
	const char *dir = getenv("TL_VECTORS_DIR");
	static const char *names[3] = {"gcmDecrypt128.rsp", "gcmDecrypt256.rsp", "aes_gcm_test.json"};
	const char *env = getenv("TL_TEST_GCM_NO_NATIVE");
	char paths[3][4096];
	int total[3] = {0, 0, 0};

	if (!dir || !*dir)
		dir = "build/vectors";
	for (int i = 0; i < 3; i++) {
		if (argc == 4)
			snprintf(paths[i], sizeof(paths[i]), "%s", argv[i + 1]);
		else
			snprintf(paths[i], sizeof(paths[i]), "%s/%s", dir, names[i]);
	}
	native_on = tl_gcm_supported() && !(env && *env == '1');
	emul_on = tl_gcm_emul_supported();
	CHECK(!tl_gcm_selftest_failed() && !tl_gcm_emul_selftest_failed());
	gn = native_on ? tl_gcm_new() : NULL;
	ge = emul_on ? tl_gcm_emul_new() : NULL;
	lib = EVP_CIPHER_CTX_new();
	CHECK((!native_on || gn) && (!emul_on || ge) && lib);
	for (int i = 0; i < 3; i++) {
		int ran[3] = {0, 0, 0};
		struct counts c = i < 2 ? run_rsp(paths[i], ran) : run_json(paths[i], ran);

		CHECK(c.rows > 0 && c.valid > 0 && c.invalid > 0);
		printf("test_gcm_vectors: %s: %d rows (%d valid, %d invalid; %d with another IV, tag or key size "
		       "skipped): native VAES %d, emulated %d, library %d\n",
		       names[i], c.rows, c.valid, c.invalid, c.skipped, ran[0], ran[1], ran[2]);
		for (int k = 0; k < 3; k++)
			total[k] += ran[k];
	}
	{
		char line[160];
		snprintf(line, sizeof(line), "gcm: native VAES build: %s (%d vector rows)",
			 native_on ? "ran" : "SKIPPED (CPU lacks VAES)", total[0]);
		summary(line);
		snprintf(line, sizeof(line), "gcm: emulated build: %s (%d vector rows)",
			 emul_on ? "ran" : "SKIPPED (CPU lacks AVX2/AES-NI/PCLMULQDQ)", total[1]);
		summary(line);
		snprintf(line, sizeof(line), "gcm: library EVP AES-GCM: ran (%d vector rows)", total[2]);
		summary(line);
	}
	tl_gcm_free(gn);
	tl_gcm_emul_free(ge);
	EVP_CIPHER_CTX_free(lib);
	printf("test_gcm_vectors: %lu checks passed\n", check_passed);
	return 0;
}
