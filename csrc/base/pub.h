/* base/pub.h - what the loop publishes about a connection for Go (pub.c): its
 * state, its error detail and its send accounting, in the connection's
 * struct tl_conn_pub (talaris.h), with the release stores and futex wakes
 * Go's Dial and SendContext wait on. Calls only timer.c. */
#ifndef TALARIS_PUB_H
#define TALARIS_PUB_H

#include <stdint.h>

struct tl_loop;
struct tl_conn;

/* tl_pub_set_state sets c's state and publishes it to Go (release store,
 * futex wake for a waiting Dial, and a SendContext's tx_seq). Entering
 * TL_ST_OPEN also counts the open (re-opens for a reconnect policy) and
 * starts c's heartbeat (tl_timer_hb_start). */
void tl_pub_set_state(struct tl_loop *l, struct tl_conn *c, int st);

/* tl_pub_claim_open decides, before c's open is published, between the
 * loop and a Dial that gave up (tl_conn_pub.dial_claim, TL_CLAIM_*).
 * Returns 0 when c may open (the loop's claim, or an earlier one), -1
 * when its Dial abandoned it: the caller must fail it instead (its
 * caller never had the Conn). */
int tl_pub_claim_open(struct tl_loop *l, struct tl_conn *c);

/* tl_pub_detail stores msg (copied, truncated; NULL: empty) as c's public
 * error detail. */
void tl_pub_detail(struct tl_loop *l, struct tl_conn *c, const char *msg);

/* tl_pub_tx_retire adds units send units to c's retired count (written to
 * the socket, or dropped) and publishes it in tl_conn_pub.tx_done, waking
 * a SendContext that sleeps on tx_seq. No-op for 0 units. */
void tl_pub_tx_retire(struct tl_loop *l, struct tl_conn *c, uint64_t units);

/* tl_pub_tx_drop retires units send units that will never reach the
 * socket (an abort, a close timeout, the server's close, a reconnect's
 * drop): tx_done as tl_pub_tx_retire, and tl_conn_pub.tx_dropped and the
 * pool's send_dropped count them (messages: units / TL_UNIT_MSG). */
void tl_pub_tx_drop(struct tl_loop *l, struct tl_conn *c, uint64_t units);

#endif
