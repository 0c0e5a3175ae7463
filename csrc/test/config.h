/* config.h - the loop configuration the detached-loop C tests share. */
#ifndef TALARIS_TEST_CONFIG_H
#define TALARIS_TEST_CONFIG_H

#include "talaris.h"

/* test_config returns a small configuration for tl_loop_new_detached:
 * max_conns connections, 64 receive buffers of 4 KiB, an event ring of
 * ev_size events, a 1 MiB arena, 256 KiB messages; deadlines of 1 ns
 * (nothing in these tests waits on them). Callers change what their test
 * needs. */
static inline struct tl_config test_config(uint32_t max_conns, uint32_t ev_size)
{
	struct tl_config cfg = {
		.sq_entries = 8, .cq_entries = 16, .sq_thread_cpu = -1, .buf_size = 4096, .buf_count = 64,
		.loop_cpu = -1, .event_ring_size = ev_size, .arena_size = 1 << 20, .cmd_ring_size = 4096,
		.max_conns = max_conns, .max_message = 1 << 18, .handshake_timeout_ns = 1, .close_timeout_ns = 1,
		.max_send_queue = 1 << 20,
	};
	return cfg;
}

#endif
