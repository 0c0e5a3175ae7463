/* check.h - the smallest assertion kit that is still useful: a failed check
 * prints file:line and the expression (and both values for the _EQ forms)
 * and exits 1, so `make -f cgo.mk test` stops at the first broken rule.
 * Each test is one translation unit, hence the static counter. */
#ifndef TALARIS_TEST_CHECK_H
#define TALARIS_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static unsigned long check_passed __attribute__((unused));

#define CHECK(cond)                                                              \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__,   \
				__LINE__, #cond);                                \
			exit(1);                                                 \
		}                                                                \
		check_passed++;                                                  \
	} while (0)

/* CHECK_EQ compares two integers and shows both on failure; what lets a
 * table-driven test say which row broke is the optional context printed
 * by CHECK_CTX before it. */
#define CHECK_EQ(a, b)                                                           \
	do {                                                                     \
		long long check_a_ = (long long)(a), check_b_ = (long long)(b);  \
		if (check_a_ != check_b_) {                                      \
			fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n", \
				__FILE__, __LINE__, #a, #b, check_a_, check_b_); \
			exit(1);                                                 \
		}                                                                \
		check_passed++;                                                  \
	} while (0)

/* CHECK_CTX sets a row description printed with any later failure. */
static const char *check_ctx __attribute__((unused)) = "";
#define CHECK_CTX(s) (check_ctx = (s))

#define CHECK_ROW(cond)                                                          \
	do {                                                                     \
		if (!(cond)) {                                                   \
			fprintf(stderr, "%s:%d: CHECK failed for [%s]: %s\n",    \
				__FILE__, __LINE__, check_ctx, #cond);           \
			exit(1);                                                 \
		}                                                                \
		check_passed++;                                                  \
	} while (0)

#define CHECK_ROW_EQ(a, b)                                                       \
	do {                                                                     \
		long long check_a_ = (long long)(a), check_b_ = (long long)(b);  \
		if (check_a_ != check_b_) {                                      \
			fprintf(stderr, "%s:%d: CHECK_EQ failed for [%s]: %s == %s (%lld vs %lld)\n", \
				__FILE__, __LINE__, check_ctx, #a, #b, check_a_, check_b_); \
			exit(1);                                                 \
		}                                                                \
		check_passed++;                                                  \
	} while (0)

#define CHECK_DONE(name)                                                         \
	do {                                                                     \
		printf("%s: %lu checks passed\n", (name), check_passed);         \
		return 0;                                                        \
	} while (0)

#endif
