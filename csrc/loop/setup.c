/* loop/setup.c - making a loop: its memory (rings, arena, tables), its
 * io_uring (created on the thread that submits: SINGLE_ISSUER) and
 * provided buffers, its thread (named, pinned) or, for an inline loop,
 * the caller's thread. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop/internal.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

/* prefault writes n bytes at p into memory now (Tuning.Prefault), so the
 * receive path and the pump never take a first-touch fault on them. A
 * kernel without MADV_POPULATE_WRITE (before 5.14) gets a write per page. */
static void prefault(void *p, size_t n)
{
#ifdef MADV_POPULATE_WRITE
	if (madvise(p, n, MADV_POPULATE_WRITE) == 0)
		return;
#endif
	long page = sysconf(_SC_PAGESIZE);
	for (size_t off = 0; off < n; off += (size_t)page)
		((volatile uint8_t *)p)[off] = 0;
}

static int setup_ring(struct tl_loop *l)
{
	struct io_uring_params p;
	int ret;

	memset(&p, 0, sizeof(p));
	p.flags = l->cfg.ring_flags | IORING_SETUP_CQSIZE;
	p.cq_entries = l->cfg.cq_entries;
	if (p.flags & IORING_SETUP_SQPOLL) {
		p.sq_thread_idle = l->cfg.sq_thread_idle_ms;
		if (l->cfg.sq_thread_cpu >= 0) {
			p.flags |= IORING_SETUP_SQ_AFF;
			p.sq_thread_cpu = (uint32_t)l->cfg.sq_thread_cpu;
		}
	}
	ret = io_uring_queue_init_params(l->cfg.sq_entries, &l->ring, &p);
	if (ret < 0) {
		snprintf(l->setup_msg, sizeof(l->setup_msg), "io_uring_queue_init_params(flags=%#x): %s", p.flags,
			 strerror(-ret));
		return ret;
	}
	l->ring_ok = 1;
	l->recv_bundle = l->cfg.recv_bundle && (p.features & IORING_FEAT_RECVSEND_BUNDLE);
	l->bundle_len = l->recv_bundle ? TL_BUNDLE_SLOTS * l->cfg.buf_size : 0;
	/* min_wait_usec: never fewer than 2 completions to wait for (1
	 * would end the wait at the first, as without it) */
	l->mw_ok = l->cfg.min_wait_ns >= 1000 && l->cfg.min_wait_nr >= 2 && (p.features & IORING_FEAT_MIN_TIMEOUT);
	/* Registered ring fd: fewer fd lookups per enter. Best effort. */
	l->ring_reg = io_uring_register_ring_fd(&l->ring) == 1;
	{
		unsigned workers[2] = {2, 2};
		io_uring_register_iowq_max_workers(&l->ring, workers);
	}
	if (l->cfg.loop_cpu >= 0) {
		cpu_set_t set;
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		CPU_ZERO(&set);
		for (long i = 0; i < ncpu && i < CPU_SETSIZE; i++)
			if (i != l->cfg.loop_cpu)
				CPU_SET(i, &set);
		if (CPU_COUNT(&set) > 0)
			io_uring_register_iowq_aff(&l->ring, sizeof(set), &set);
	}
	ret = tl_slots_register(&l->slots, &l->ring, l->cfg.buf_size, l->cfg.buf_count);
	if (ret < 0) {
		snprintf(l->setup_msg, sizeof(l->setup_msg), "provided buffer ring (%u x %u): %s", l->cfg.buf_count,
			 l->cfg.buf_size, strerror(-ret));
		return ret;
	}
	if (l->cfg.prefault)
		prefault(l->slots.main.base, l->slots.main.base_bytes);
	return 0;
}

/* name_loop_thread names the calling thread "talaris-loop" (its comm in
 * /proc/self/task/<tid>/comm), so tools and `talaris bench` can tell the loop
 * thread from the Go runtime's threads when they split CPU time per thread.
 * Best effort: a failure only leaves the inherited name. */
static void name_loop_thread(void)
{
	(void)pthread_setname_np(pthread_self(), "talaris-loop");
}

static void *loop_main(void *arg)
{
	struct tl_loop *l = arg;
	int ret;

	name_loop_thread();
	if (l->cfg.loop_cpu >= 0) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(l->cfg.loop_cpu, &set);
		ret = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
		if (ret) {
			snprintf(l->setup_msg, sizeof(l->setup_msg), "pin loop to CPU %d: %s", l->cfg.loop_cpu,
				 strerror(ret));
			ret = -ret;
			goto report;
		}
	}
	/* SINGLE_ISSUER makes the creating thread the submitter: create here. */
	ret = setup_ring(l);
report:
	pthread_mutex_lock(&l->mu);
	l->setup_state = ret < 0 ? ret : 1;
	pthread_cond_broadcast(&l->cv);
	pthread_mutex_unlock(&l->mu);
	if (ret < 0)
		return NULL;
	tl_loop_run(l);
	return NULL;
}

/* map_zero maps n zeroed bytes, populated up front: the hot path must not
 * take a page fault the first time it touches a ring or arena line. */
static void *map_zero(size_t n)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

static int pow2(uint64_t v) { return v && !(v & (v - 1)); }

/* loop_alloc makes a loop's memory (rings, arena, tables) without a thread
 * or io_uring. */
static struct tl_loop *loop_alloc(const struct tl_config *cfg, int *err, char *errbuf, size_t errcap)
{
	struct tl_loop *l;

	*err = 0;
	if (!pow2(cfg->event_ring_size) || !pow2(cfg->arena_size) || !pow2(cfg->cmd_ring_size) ||
	    !pow2(cfg->buf_size) || !pow2(cfg->buf_count) || cfg->max_conns == 0 || cfg->max_conns > TL_MAX_SLOTS ||
	    cfg->max_message == 0 || cfg->max_message > cfg->arena_size / 2 || cfg->cmd_ring_size < 4096) {
		*err = -EINVAL;
		snprintf(errbuf, errcap, "sizes must be powers of two, max message <= arena/2, cmd ring >= 4096");
		return NULL;
	}
	l = calloc(1, sizeof(*l));
	if (!l)
		goto nomem;
	l->cfg = *cfg;
	/* 0: no fairness limit (the Decoder's single connection). */
	if (!l->cfg.conn_max_events)
		l->cfg.conn_max_events = UINT32_MAX;
	if (!l->cfg.conn_max_bytes)
		l->cfg.conn_max_bytes = UINT64_MAX;
	/* A quarter of the ring (or arena) pending: every share applies,
	 * floods among themselves too (ws/frames.c, fair_pressed). */
	l->fair_epoch = 2;
	l->fair_press_events = cfg->event_ring_size / 4;
	l->fair_press_bytes = cfg->arena_size / 4;
	l->sample_left = cfg->sample_every;
	l->efd = -1;
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	l->stats = map_zero(sizeof(*l->stats));
	l->conns = calloc(cfg->max_conns, sizeof(*l->conns));
	l->pub = map_zero(sizeof(*l->pub) * cfg->max_conns);
	l->dials = calloc(cfg->max_conns, sizeof(*l->dials));
	if (!l->stats || !l->conns || !l->pub || !l->dials)
		goto nomem_free;
	if (tl_slots_alloc(&l->slots, cfg->buf_count) < 0)
		goto nomem_free;
	if (tl_evq_init(&l->evq, cfg->event_ring_size, cfg->arena_size, l->stats, cfg->sample_every != 0,
			cfg->max_conns) < 0)
		goto nomem_free;
	if (cfg->prefault)
		prefault(l->evq.arena, l->evq.arena_size);
	if (tl_cmdq_init(&l->cmdq, cfg->cmd_ring_size) < 0)
		goto nomem_free;
	for (uint32_t i = 0; i < cfg->max_conns; i++) {
		l->conns[i].fd = -1;
		l->conns[i].slot = i;
		tl_rxq_init(&l->conns[i].rxq);
		l->conns[i].cur_q = -1;
	}
	return l;

nomem_free:
	tl_loop_free(l);
nomem:
	*err = -ENOMEM;
	snprintf(errbuf, errcap, "out of memory");
	return NULL;
}

struct tl_loop *tl_loop_new_detached(const struct tl_config *cfg)
{
	int err;
	char msg[128];
	return loop_alloc(cfg, &err, msg, sizeof(msg));
}

struct tl_loop *tl_loop_new(const struct tl_config *cfg, int *err, char *errbuf, size_t errcap)
{
	struct tl_loop *l = loop_alloc(cfg, err, errbuf, errcap);
	int ret;

	if (!l)
		return NULL;
	l->efd = eventfd(0, EFD_CLOEXEC);
	if (l->efd < 0) {
		*err = -errno;
		snprintf(errbuf, errcap, "eventfd: %s", strerror(errno));
		tl_loop_free(l);
		return NULL;
	}
	l->cmdq.r->efd = l->efd;
	if (cfg->inline_loop) {
		/* No thread: this one creates (SINGLE_ISSUER: and alone
		 * submits to) the ring and runs the loop, tl_loop_inline_run. */
		l->thread = pthread_self();
		ret = setup_ring(l);
		if (ret < 0) {
			*err = ret;
			snprintf(errbuf, errcap, "%s", l->setup_msg);
			tl_loop_free(l);
			return NULL;
		}
		return l;
	}
	ret = pthread_create(&l->thread, NULL, loop_main, l);
	if (ret) {
		*err = -ret;
		snprintf(errbuf, errcap, "pthread_create: %s", strerror(ret));
		tl_loop_free(l);
		return NULL;
	}
	l->started = 1;
	pthread_mutex_lock(&l->mu);
	while (l->setup_state == 0)
		pthread_cond_wait(&l->cv, &l->mu);
	pthread_mutex_unlock(&l->mu);
	if (l->setup_state < 0) {
		*err = l->setup_state;
		snprintf(errbuf, errcap, "%s", l->setup_msg);
		pthread_join(l->thread, NULL);
		l->started = 0;
		tl_loop_free(l);
		return NULL;
	}
	return l;
}
