/* loop/api.c - the rest of the C API on a loop (talaris.h): the shared
 * memory Go maps (rings, connection records, stats), where a payload
 * lies, a dial's parameters copied in, a refused response's head, stop
 * and free. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/internal.h"
#include "transport/tls_verify.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct tl_evring *tl_loop_evring(struct tl_loop *l) { return l->evq.r; }
struct tl_cmdring *tl_loop_cmdring(struct tl_loop *l) { return l->cmdq.r; }
struct tl_conn_pub *tl_loop_conns(struct tl_loop *l) { return l->pub; }
struct tl_pool_stats *tl_loop_stats(struct tl_loop *l) { return l->stats; }

int tl_loop_payload_origin(const struct tl_loop *l, const void *p)
{
	const uint8_t *b = p;
	if (b >= l->evq.arena && b < l->evq.arena + l->evq.arena_size)
		return TL_ORIGIN_ARENA;
	switch (tl_slots_origin(&l->slots, b)) {
	case TL_SLOTS_RECV:
		return TL_ORIGIN_SLOT;
	case TL_SLOTS_PT:
		return TL_ORIGIN_PLAINTEXT;
	}
	return TL_ORIGIN_OTHER;
}

int tl_dial_prepare(struct tl_loop *l, uint32_t slot, const struct tl_dial_params *p)
{
	struct tl_dial *d;

	if (slot >= l->cfg.max_conns || p->addr_len > sizeof(p->addr) || p->local_len > sizeof(p->local) ||
	    p->nalt > 64 || (p->nalt && !p->alt))
		return -EINVAL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	memcpy(&d->addr, &p->addr, sizeof(d->addr));
	d->addr_len = p->addr_len;
	memcpy(&d->local, &p->local, sizeof(d->local));
	d->local_len = p->local_len;
	if (p->nalt) {
		d->alt = malloc(p->nalt * sizeof(*d->alt));
		if (!d->alt)
			goto fail;
		memcpy(d->alt, p->alt, p->nalt * sizeof(*d->alt));
		d->nalt = p->nalt;
	}
	d->tls = p->tls;
	d->insecure = p->insecure;
	d->handshake_timeout_ns = p->handshake_timeout_ns ? p->handshake_timeout_ns : l->cfg.handshake_timeout_ns;
	d->close_timeout_ns = p->close_timeout_ns;
	d->ping_interval_ns = p->ping_interval_ns;
	d->read_timeout_ns = p->read_timeout_ns;
	d->rc_enabled = p->rc_enabled && p->rc_min_ns && p->rc_max_ns >= p->rc_min_ns;
	d->rc_max_attempts = p->rc_max_attempts;
	d->rc_min_ns = p->rc_min_ns;
	d->rc_max_ns = p->rc_max_ns;
#define DUP(f)                                              \
	do {                                                \
		d->f = tl_dupn(p->f ? p->f : "", p->f##_len); \
		d->f##_len = p->f##_len;                    \
		if (!d->f)                                  \
			goto fail;                          \
	} while (0)
	DUP(host);
	DUP(path);
	DUP(headers);
	DUP(protocols);
	DUP(server_name);
	DUP(ca_file);
	DUP(ca_pem);
	DUP(subscribe);
	if (p->proxy) {
		if (p->proxy != TL_PROXY_KIND_HTTP && p->proxy != TL_PROXY_KIND_SOCKS5)
			goto bad;
		d->proxy = p->proxy;
		DUP(proxy_req);
		DUP(proxy_auth);
	}
#undef DUP
	if (p->tls && !(d->tlsx = tl_tlsv_dial_copy(p)))
		goto fail;
	tl_life_free_dial(l->dials[slot]);
	l->dials[slot] = d;
	return 0;
fail:
	tl_life_free_dial(d);
	return -ENOMEM;
bad:
	tl_life_free_dial(d);
	return -EINVAL;
}

size_t tl_loop_fail_head(struct tl_loop *l, uint32_t slot, uint32_t gen, char *buf, size_t cap)
{
	struct tl_conn *c;
	size_t n;

	if (!l->conns || slot >= l->cfg.max_conns)
		return 0;
	c = &l->conns[slot];
	if (c->gen != gen || !c->fail_head)
		return 0;
	n = c->fail_head_len < cap ? c->fail_head_len : cap;
	memcpy(buf, c->fail_head, n);
	return n;
}

void tl_loop_stop(struct tl_loop *l)
{
	uint64_t one = 1;

	if (l->cfg.inline_loop && l->ring_ok) {
		tl_loop_inline_stop(l);
		return;
	}
	if (!l->started)
		return;
	__atomic_store_n(&l->stop_req, 1, __ATOMIC_SEQ_CST);
	if (write(l->efd, &one, sizeof(one)) < 0) {
		/* the loop checks stop_req before every wait anyway */
	}
	pthread_join(l->thread, NULL);
	l->started = 0;
}

void tl_loop_free(struct tl_loop *l)
{
	if (!l)
		return;
	if (l->started)
		tl_loop_stop(l);
	if (l->conns) {
		for (uint32_t i = 0; i < l->cfg.max_conns; i++) {
			struct tl_conn *c = &l->conns[i];
			if (c->fd >= 0)
				close(c->fd);
			tl_tls_free(c);
			tl_life_free_dial(c->dial);
			free(c->hs);
			tl_conn_free_bufs(c);
		}
	}
	if (l->dials)
		for (uint32_t i = 0; i < l->cfg.max_conns; i++)
			tl_life_free_dial(l->dials[i]);
	tl_slots_free(&l->slots, l->ring_ok ? &l->ring : NULL);
	if (l->ring_ok)
		io_uring_queue_exit(&l->ring);
	tl_tls_shared_free(&l->ts);
	if (l->efd >= 0)
		close(l->efd);
	tl_evq_free(&l->evq);
	tl_cmdq_free(&l->cmdq);
	if (l->stats)
		munmap(l->stats, sizeof(*l->stats));
	if (l->pub)
		munmap(l->pub, sizeof(*l->pub) * l->cfg.max_conns);
	free(l->conns);
	free(l->dials);
	pthread_mutex_destroy(&l->mu);
	pthread_cond_destroy(&l->cv);
	free(l);
}
