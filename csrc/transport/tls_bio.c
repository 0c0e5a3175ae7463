/* transport/tls_bio.c - the slot BIO: the library reads ciphertext straight
 * from the connection's slot queue (each slot back to the kernel once its
 * bytes are copied out) and writes records into its out buffer. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "transport/internal.h"

#include <string.h>

static int slot_bio_read(BIO *b, char *out, int outl)
{
	struct tl_tls *t = BIO_get_data(b);
	struct tl_loop *l = t->l;
	struct tl_conn *c = t->c;
	int got = 0;

	BIO_clear_retry_flags(b);
	while (got < outl) {
		const uint8_t *p;
		size_t n;
		if (tl_rxq_peek(&l->slots, &c->rxq, &p, &n) < 0)
			break;
		if (n > (size_t)(outl - got))
			n = (size_t)(outl - got);
		memcpy(out + got, p, n);
		if (t->rec_track && tl_tlsrec_shadow(&t->rec, p, n, t->scratch) < 0)
			tl_tls_rec_stop(t); /* the library reports what it makes of it */
		got += (int)n;
		/* Ciphertext is copied out, so the slot goes back at once. */
		tl_rxq_consume(&l->slots, &c->rxq, n, l->evq.head_cache);
	}
	if (got > 0) {
		t->consumed = 1;
		return got;
	}
	if (c->eof)
		return 0; /* transport EOF */
	BIO_set_retry_read(b);
	return -1;
}

static int slot_bio_write(BIO *b, const char *in, int inl)
{
	struct tl_tls *t = BIO_get_data(b);
	BIO_clear_retry_flags(b);
	if (tl_conn_out_append(t->c, (const uint8_t *)in, (size_t)inl) < 0)
		return -1;
	return inl;
}

static long slot_bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	(void)b;
	(void)num;
	(void)ptr;
	switch (cmd) {
	case BIO_CTRL_FLUSH:
		return 1;
	default:
		return 0;
	}
}

static int slot_bio_create(BIO *b)
{
	BIO_set_init(b, 1);
	return 1;
}

BIO_METHOD *tl_tls_slot_method;
pthread_once_t tl_tls_slot_method_once = PTHREAD_ONCE_INIT;

void tl_tls_make_slot_method(void)
{
	BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "talaris slot");
	if (!m)
		return;
	BIO_meth_set_read(m, slot_bio_read);
	BIO_meth_set_write(m, slot_bio_write);
	BIO_meth_set_ctrl(m, slot_bio_ctrl);
	BIO_meth_set_create(m, slot_bio_create);
	tl_tls_slot_method = m;
}
