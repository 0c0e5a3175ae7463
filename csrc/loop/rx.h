/* loop/rx.h - the receive side of a connection (rx.c): its states (c->rx) and
 * the inputs of tl_rx_step, the one function that changes them. */
#ifndef TALARIS_RX_H
#define TALARIS_RX_H

#include <stdint.h>

struct tl_loop;
struct tl_conn;

/* Receive side of a connection (tl_conn.rx); transitions in rx_step. */
enum {
	TL_RX_OFF = 0,  /* no recv, none wanted: not connected, ended (eof), memory, or dying */
	TL_RX_ARMED,    /* a multishot recv is in the kernel */
	TL_RX_WANT,     /* ended (-ENOBUFS, with data, regrouped, no SQE): re-arm when a slot is free */
	TL_RX_PAUSING,  /* in the kernel, cancel sent: stalled holding its share of slots */
	TL_RX_REARMING, /* in the kernel, cancel sent to switch groups (or a pause resumed early) */
	TL_RX_PAUSED,   /* ended by a pause; re-armed when the connection resumes */
};

/* Inputs of rx_step. */
enum { RX_ARM, RX_END, RX_PAUSE, RX_RESUME, RX_REGROUP, RX_TICK, RX_TEARDOWN, RX_LOST, RX_REVIVE, RX_GONE, RX_STUCK };



/* tl_rx_ud returns the user_data of c's recv (its buffer group's op). */
uint64_t tl_rx_ud(const struct tl_conn *c);

/* tl_rx_in_kernel says a multishot recv of c is in the kernel (its final
 * CQE, one without IORING_CQE_F_MORE, is still to come). */
int tl_rx_in_kernel(const struct tl_conn *c);

/* tl_rx_cancel asks the kernel to cancel target, c's recv (tl_rx_ud) or
 * its connect; the CANCEL completion follows, and a cancelled recv's
 * final CQE. Counts it in c->cancel_inflight and notes c->probe.ticks for
 * the probe (loop/probe.c). Returns 0, or -1 when no SQE was free. */
int tl_rx_cancel(struct tl_loop *l, struct tl_conn *c, uint64_t target);

/* tl_rx_step applies input ev (RX_*) to c's receive side: every
 * transition of c->rx is here (the table is in rx.c). res is the recv's
 * result for RX_END. It may submit a recv or a cancel; when no SQE is free
 * the state says what is still to do (TL_RX_WANT, retried by the loop). */
void tl_rx_step(struct tl_loop *l, struct tl_conn *c, int ev, int res);

#endif
