/* test_rx.c - the receive side's state machine (tl_rx_step, rx.c) on the
 * results a kernel can give, under ASan/UBSan. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "loop/loop.h"
#include "loop/rx.h"
#include "check.h"
#include "config.h"

/* test_cap_refused: a kernel with recv bundles that refuses a per-recv cap
 * on multishot recvs ends each recv armed with one with -EINVAL at once.
 * When several connections armed theirs before the first refusal came
 * back, every such refusal is the cap's, not a connection loss: each goes
 * back to TL_RX_WANT (re-armed without the cap), none gets EOF. (Before:
 * the first refusal turned the cap off for the loop and the later ones
 * counted as errors: those connections failed with EINVAL.) A recv armed
 * without the cap that ends with -EINVAL is an error as before. */
static void test_cap_refused(void)
{
	struct tl_config cfg = test_config(3, 1024);
	struct tl_loop *l = tl_loop_new_detached(&cfg);

	CHECK(l != NULL);
	l->bundle_len = 64 * 4096;
	for (int i = 0; i < 3; i++) {
		struct tl_conn *c = &l->conns[i];
		c->rx = TL_RX_ARMED; /* as RX_ARM leaves a bundle recv of an open connection */
		c->rx_hs = 0;
		c->rx_cap = i < 2;
	}
	tl_rx_step(l, &l->conns[0], RX_END, -EINVAL);
	CHECK_EQ(l->bundle_len, 0);
	tl_rx_step(l, &l->conns[1], RX_END, -EINVAL);
	tl_rx_step(l, &l->conns[2], RX_END, -EINVAL);
	for (int i = 0; i < 2; i++) {
		CHECK_EQ(l->conns[i].eof, 0);
		CHECK_EQ(l->conns[i].rx, TL_RX_WANT);
	}
	CHECK_EQ(l->conns[2].eof, 1);
	CHECK_EQ(l->conns[2].eof_errno, EINVAL);
	CHECK_EQ(l->conns[2].rx, TL_RX_OFF);
	CHECK_EQ(l->rx_want, 2);
	for (int i = 0; i < 2; i++)
		tl_rx_step(l, &l->conns[i], RX_TEARDOWN, 0);
	CHECK_EQ(l->rx_want, 0);
	tl_loop_free(l);
}

int main(void)
{
	test_cap_refused();
	printf("test_rx: %lu checks passed\n", check_passed);
	return 0;
}
