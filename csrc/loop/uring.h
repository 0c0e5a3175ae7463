/* loop/uring.h - io_uring mechanics every file of the loop shares: the
 * user_data encoding of an operation (op, generation, slot) and
 * tl_uring_sqe. Inline only. */
#ifndef TALARIS_URING_H
#define TALARIS_URING_H

#include <liburing.h>
#include <stdint.h>

#include "loop/state.h"

/* Recv bundles (kernel 6.10+): liburing 2.3's headers predate them. */
#ifndef IORING_RECVSEND_BUNDLE
#define IORING_RECVSEND_BUNDLE (1U << 4)
#endif
#ifndef IORING_FEAT_RECVSEND_BUNDLE
#define IORING_FEAT_RECVSEND_BUNDLE (1U << 14)
#endif
/* Minimum-wait batching (kernel 6.12+): struct io_uring_getevents_arg's
 * pad is min_wait_usec there (loop/wait.c, wait_batched). */
#ifndef IORING_FEAT_MIN_TIMEOUT
#define IORING_FEAT_MIN_TIMEOUT (1U << 15)
#endif

/* TL_BUNDLE_SLOTS caps one bundle completion at this many receive slots
 * (sqe->len = TL_BUNDLE_SLOTS x BufSize: a per-recv cap, Linux 6.1x;
 * rx.c drops the cap if the kernel refuses it). Uncapped, a bundle takes
 * what the socket holds, up to 256 slots: one flooding connection then
 * took the whole ring in one completion, and a bundle that empties the
 * ring ends its multishot recv (re-armed: measured 2-7 re-arms and 1.5
 * fair holds per 1000 wss frames at 16 connections, against 0.1). */
#define TL_BUNDLE_SLOTS 64u

/* user_data layout: op (8 bits) | gen (32 bits) | slot (24 bits). The
 * generation makes a late completion for a reused slot harmless. */
enum {
	TL_OPK_CONNECT = 1, /* 0 is no op: a CQE carrying it is ignored */
	TL_OPK_RECV = 2,
	TL_OPK_SEND = 3,
	TL_OPK_CANCEL = 4,
	TL_OPK_EFD = 5,
	TL_OPK_RECV_HS = 7, /* a recv on the handshake buffer group */
	/* The op byte's bits above TL_OPK_MASK carry a recv's epoch
	 * (tl_conn.rx_epoch, modulo TL_OPK_EPOCHS): it moves on when the loop
	 * ends a recv itself (rx.c: RX_GONE, the kernel said it no longer had
	 * it; RX_STUCK, its end never came), so a completion of that recv
	 * coming after all is stale, not the end of a successor; 32 epochs,
	 * so a handle re-dialled after such an end does not come back to
	 * the epoch of a recv the kernel may still hold. */
	TL_OPK_MASK = 0x07,
	TL_OPK_EPOCH_SHIFT = 3,
	TL_OPK_EPOCHS = 32,
};
/* Every op kind under the mask, and the highest epoch with it, fit in the
 * op byte (the user_data's top 8 bits, tl_ud). */
_Static_assert(TL_OPK_RECV_HS <= TL_OPK_MASK && TL_OPK_EFD <= TL_OPK_MASK, "op kinds exceed TL_OPK_MASK");
_Static_assert((((TL_OPK_EPOCHS - 1) << TL_OPK_EPOCH_SHIFT) | TL_OPK_MASK) <= 0xff, "recv epochs overflow the op byte");
_Static_assert(TL_OPK_MASK < (1 << TL_OPK_EPOCH_SHIFT), "epoch bits overlap the op kind");

#define TL_SLOT_BITS 24
#define TL_MAX_SLOTS (1u << TL_SLOT_BITS)

static inline uint64_t tl_ud(unsigned op, uint32_t gen, uint32_t slot)
{
	return ((uint64_t)op << 56) | ((uint64_t)gen << TL_SLOT_BITS) | (slot & (TL_MAX_SLOTS - 1));
}
static inline unsigned tl_ud_op(uint64_t ud) { return (unsigned)(ud >> 56); }
static inline uint32_t tl_ud_gen(uint64_t ud) { return (uint32_t)(ud >> TL_SLOT_BITS); }
static inline uint32_t tl_ud_slot(uint64_t ud) { return (uint32_t)(ud & (TL_MAX_SLOTS - 1)); }

/* tl_uring_sqe returns a free submission entry of l's ring, submitting
 * what is queued when the SQ is full; NULL if there is still none. */
static inline struct io_uring_sqe *tl_uring_sqe(struct tl_loop *l)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&l->ring);
	if (!sqe) {
		/* SQ full: push what we have to make room. */
		io_uring_submit(&l->ring);
		sqe = io_uring_get_sqe(&l->ring);
	}
	return sqe;
}

#endif
