/* loop/tx.h - the send side of a connection (tx.c). */
#ifndef TALARIS_TX_H
#define TALARIS_TX_H

struct tl_loop;
struct tl_conn;
struct tl_outbuf;

#include <stddef.h>
#include <stdint.h>

/* tl_tx_submit puts one send of ob->p[c->sent_off..ob->len) in the SQ
 * and marks c's send in flight. Returns 0, or -1 when no SQE was free: the
 * bytes stay and l->tx_retry makes the loop flush again next iteration. */
int tl_tx_submit(struct tl_loop *l, struct tl_conn *c, struct tl_outbuf *ob);

/* tl_tx_flush submits c's output unless a send is in flight: first the
 * rest of a buffer a short send left, else the collecting buffer, topped
 * up from the send queue (tl_conn_tx_refill) and, for wss, with the framed
 * plaintext encrypted into it (tl_tls_seal); with nothing left and the
 * close handshake done, shutdown(SHUT_WR). A failure (no memory, TLS) is
 * left in c->todo: callers above the send side use tl_life_flush. */
void tl_tx_flush(struct tl_loop *l, struct tl_conn *c);

/* tl_tx_shut_wr ends c's sending side once its close handshake is
 * complete: TLS close_notify after the last frame, then shutdown(SHUT_WR)
 * when every queued byte has left (tl_tx_flush). The peer sees the end at
 * once and closes its side; the close timeout bounds the wait for that.
 * Once per connection; no-op for memory or dying connections. Like
 * tl_tx_flush it may leave a failure in c->todo. */
void tl_tx_shut_wr(struct tl_loop *l, struct tl_conn *c);

/* Direct sends (tl_conn_pub.tx_own, ring.h): a Go sender may write an
 * open plain connection's socket itself while the loop has nothing to
 * write there. tl_tx_flush offers the socket when c's output is done and
 * takes it back before it submits a send; while Go holds it, c is parked
 * (tx_defer, counted in l->tx_deferred) and Go hands it back, waking the
 * loop if it sleeps. */

/* tl_tx_seize takes c's socket back for good before the lifecycle closes
 * it: no Go sender writes it afterwards, and the rest of a frame Go handed
 * off under the old epoch is dropped when it arrives. Returns 1, or 0
 * while a Go sender still writes it (c is parked: close it once handed
 * back). */
int tl_tx_seize(struct tl_loop *l, struct tl_conn *c);

/* tl_tx_handed_back reports (once) that parked c's socket came back from
 * Go: the caller goes on with c's output (tl_life_flush) or its end
 * (tl_life_maybe_finish). A handoff waits for its rest instead. */
int tl_tx_handed_back(struct tl_loop *l, struct tl_conn *c);

/* tl_tx_deferred_ready reports whether any parked connection's socket
 * came back (the loop's last look before it sleeps: Go hands the socket
 * over, then reads loop_sleeping; seq_cst on both sides, Dekker style). */
int tl_tx_deferred_ready(struct tl_loop *l);

/* tl_tx_direct_rest takes the rest of a direct send that Go's write did
 * not finish (TL_CMD_DIRECT; copies p): when c's socket is still in the
 * handoff Go left under epoch, the bytes go out before anything else of
 * c; otherwise (that socket is gone) they are dropped. Their send units
 * (units: Go's count, ring.h) are retired once written or dropped. Returns 1 when c is ending and
 * may have waited for the socket (the caller runs tl_life_maybe_finish),
 * else 0; a failure is left in c->todo. */
int tl_tx_direct_rest(struct tl_loop *l, struct tl_conn *c, uint16_t epoch, const uint8_t *p, size_t n,
		      uint64_t units);

#endif
