/* test_gcm_selftest.c - gcm.c's power-on self-test: it passes on both
 * builds (native where the CPU has VAES, emulated everywhere) and what it
 * costs, clocked; a spoiled expected answer (tl_gcm_selftest_hook, any of
 * its rows) fails it, and the fallback engages: tl_gcm_supported 0,
 * tl_gcm_new NULL, tl_gcm_selftest_failed 1, and the record layer keyed
 * after that opens with the library (tl_tlsrec.gcm NULL); forgetting the
 * spoil brings the own GCM back. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "transport/tlsrec.h"
#include "check.h"
#include "gcm_impls.h"

static const char keylog[] = "SERVER_TRAFFIC_SECRET_0 "
			     "0000000000000000000000000000000000000000000000000000000000000000 "
			     "a11af9f05531f856ad47116b45a950328204b4f44bfb6b3a4b4f1f3fcb631643";

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* cost runs the self-test (hook(-1): forget, spoil nothing) reps times and
 * returns the fastest run in microseconds. */
static double cost(int (*supported)(void), void (*hook)(int), int reps)
{
	double best = 1e18;

	for (int i = 0; i < reps; i++) {
		double t0;
		hook(-1);
		t0 = now_us();
		CHECK_EQ(supported(), 1);
		t0 = now_us() - t0;
		if (t0 < best)
			best = t0;
	}
	return best;
}

static void spoil_all(const char *name, int (*supported)(void), void (*hook)(int), int (*failed)(void),
		      struct tl_gcm *(*new_)(void))
{
	int rows = 0;

	for (int row = 0; row < 54; row++, rows++) { /* 2 key sizes x 9 lengths x 3 AAD lengths */
		hook(row);
		CHECK_EQ(failed(), 0); /* not run yet */
		CHECK_EQ(supported(), 0);
		CHECK(new_() == NULL);
		CHECK_EQ(failed(), 1);
	}
	hook(54); /* past the last row: nothing spoiled */
	CHECK_EQ(supported(), 1);
	CHECK_EQ(failed(), 0);
	hook(-1);
	printf("test_gcm_selftest: %s: each of %d spoiled rows turned the own GCM off\n", name, rows);
}

/* summary prints line and appends it to $TL_TEST_SUMMARY (cgo.mk prints
 * that file at the end of its test run). */
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

int main(void)
{
	char line[160];
	double us;
	int native = tl_gcm_supported();

	CHECK(tl_gcm_emul_supported());
	CHECK_EQ(tl_gcm_emul_selftest_failed(), 0);
	us = cost(tl_gcm_emul_supported, tl_gcm_emul_selftest_hook, 20);
	snprintf(line, sizeof(line), "gcm: emulated build: power-on self-test passed, %.0f us (fastest of 20)", us);
	summary(line);
	spoil_all("emulated", tl_gcm_emul_supported, tl_gcm_emul_selftest_hook, tl_gcm_emul_selftest_failed,
		  tl_gcm_emul_new);
	if (!native) {
		summary("gcm: native VAES build: power-on self-test SKIPPED (CPU lacks VAES)");
		return 0;
	}
	CHECK_EQ(tl_gcm_selftest_failed(), 0);
	us = cost(tl_gcm_supported, tl_gcm_selftest_hook, 20);
	snprintf(line, sizeof(line), "gcm: native VAES build: power-on self-test passed, %.0f us (fastest of 20)", us);
	summary(line);
	spoil_all("native VAES", tl_gcm_supported, tl_gcm_selftest_hook, tl_gcm_selftest_failed, tl_gcm_new);
	/* The record layer under a failed self-test: keyed, the library opens. */
	for (int spoil = 0; spoil < 2; spoil++) {
		struct tl_tlsrec r;

		tl_gcm_selftest_hook(spoil ? 17 : -1);
		memset(&r, 0, sizeof(r));
		CHECK_EQ(tl_tlsrec_keylog(&r, keylog), 1);
		CHECK_EQ(tl_tlsrec_start(&r, TL_TLS_AES_128_GCM_SHA256, 0), 0);
		CHECK(tl_tlsrec_active(&r));
		CHECK_EQ(r.gcm != NULL, !spoil);
		CHECK_EQ(tl_gcm_selftest_failed(), spoil);
		tl_tlsrec_free(&r);
	}
	tl_gcm_selftest_hook(-1);
	summary("gcm: a failed self-test (forced) keys the record layer with the library's AES-GCM");
	printf("test_gcm_selftest: %lu checks passed\n", check_passed);
	return 0;
}
