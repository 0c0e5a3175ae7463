/* tls.c - placeholder until the TLS data path lands: wss:// dials fail. */
#include "loop.h"

#include <errno.h>

int tl_tls_start(struct tl_loop *l, struct tl_conn *c)
{
	tl_conn_fail(l, c, TL_E_TLS, EPROTONOSUPPORT, 0, "TLS not built");
	return -1;
}
int tl_tls_drive(struct tl_loop *l, struct tl_conn *c)
{
	(void)l;
	(void)c;
	return -2;
}
int tl_tls_write(struct tl_loop *l, struct tl_conn *c, const uint8_t *p, size_t n)
{
	(void)l;
	(void)c;
	(void)p;
	(void)n;
	return -1;
}
void tl_tls_free(struct tl_conn *c) { (void)c; }
void tl_tls_global_free(struct tl_loop *l) { (void)l; }
const char *tl_tls_backend(void) { return "none"; }
