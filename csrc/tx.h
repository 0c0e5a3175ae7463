/* tx.h - the send side of a connection (tx.c). */
#ifndef TALARIS_TX_H
#define TALARIS_TX_H

struct tl_loop;
struct tl_conn;
struct tl_outbuf;

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

#endif
