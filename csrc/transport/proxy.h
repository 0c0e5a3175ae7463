/* transport/proxy.h - a dial through an HTTP CONNECT or SOCKS5 proxy
 * (proxy.c): after TCP connect to the proxy, the loop writes the proxy's
 * requests and reads its replies from the connection's slot queue, bounded,
 * before the session (TLS, the upgrade) starts through the tunnel. */
#ifndef TALARIS_PROXY_H
#define TALARIS_PROXY_H

struct tl_loop;
struct tl_conn;

/* TL_PROXY_MAX_HEAD bounds a CONNECT reply's head (status line and
 * headers); a longer one fails the dial (TL_PROXY_TOO_LARGE). */
#define TL_PROXY_MAX_HEAD 8192

/* tl_proxy_start begins c's proxy handshake on its connected socket when
 * its dial names a proxy: the first request goes into c's out buffer
 * (c->todo asks for the flush) and c->px is set. Returns 1 when it
 * started, 0 when the dial has no proxy, -1 after failing c. */
int tl_proxy_start(struct tl_loop *l, struct tl_conn *c);

/* tl_proxy_drive reads the proxy's replies from c's slot queue, exactly
 * their bytes (what follows stays queued for the session), and writes
 * the next request. Returns TL_FEED_OK: still under way (c->px set), or
 * the tunnel stands (c->px is 0: the caller starts the session and reads
 * the rest of the queue); TL_FEED_DEAD: c failed (TL_E_PROXY). A pending
 * EOF before the end of the replies fails c (TL_PROXY_LOST). */
int tl_proxy_drive(struct tl_loop *l, struct tl_conn *c);

/* tl_proxy_timeout fails c, whose handshake deadline passed during its
 * proxy handshake, with TL_E_PROXY (TL_PROXY_TIMEOUT). */
void tl_proxy_timeout(struct tl_loop *l, struct tl_conn *c);

#endif
