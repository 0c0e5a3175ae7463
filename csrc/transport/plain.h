/* transport/plain.h - the plain (ws://) transport (plain.c): the frame parser reads
 * the connection's received slots in place. The same shape as the TLS
 * transport (tls.h): the loop calls tl_plain_drive or tl_tls_drive, which
 * read the slot queue (tl_rxq) and feed ws/frames.c, and acts on the result. */
#ifndef TALARIS_PLAIN_H
#define TALARIS_PLAIN_H

struct tl_loop;
struct tl_conn;

/* tl_plain_drive offers c's queued input to the parser, slot by slot,
 * until it is used up, c stalls or c is ending: first what a stall left
 * half published, then (memory connection) its stashed injected input,
 * then the slot queue. Input after a failure or a close is dropped.
 * Returns TL_FEED_OK or TL_FEED_STALL (offer the rest again when space
 * returns); requests for the loop are left in c->todo. A pending EOF and
 * the flush are the caller's. */
int tl_plain_drive(struct tl_loop *l, struct tl_conn *c);

#endif
