/* ws/close.c - the end of a connection's input: a close frame received
 * (the echo, then the end of our sending side) and the end of the stream
 * (EOF), each turned into the connection's outcome. Sending the close
 * frame and failing a connection are ws/send.c's. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "ws/internal.h"
#include "base/pub.h"
#include "base/timer.h"
#include "loop/state.h"

#include <string.h>

int tl_conn_close_frame(struct tl_loop *l, struct tl_conn *c)
{
	const uint8_t *p = c->ctrl;
	size_t n = c->ctrl_len;
	unsigned code = 1005;

	if (n == 1)
		return fail_proto(l, c, TL_E_PROTOCOL, 1002, "close frame with a 1-byte payload");
	if (n >= 2) {
		code = ((unsigned)p[0] << 8) | p[1];
		if (!tl_ws_close_code_ok(code))
			return fail_proto(l, c, TL_E_PROTOCOL, 1002, "close frame with an invalid code");
		if (!tl_utf8_valid(p + 2, n - 2))
			return fail_proto(l, c, TL_E_UTF8, 1007, "close reason is not valid UTF-8");
		memcpy(c->reason, p + 2, n - 2);
		c->reason_len = (uint8_t)(n - 2);
	}
	c->close_code = (uint16_t)code;
	tl_conn_close_step(c, TL_CLOSE_RCVD);
	c->discard = 1; /* nothing after a close frame counts */
	if (!tl_conn_close_sent(c))
		tl_conn_send_close(l, c, (uint16_t)code, c->reason, c->reason_len);
	else if (c->close_queued)
		tl_conn_tx_cut(l, c); /* ours waited behind data: it goes now, the data nobody reads is dropped */
	if (c->state != TL_ST_CLOSING)
		tl_pub_set_state(l, c, TL_ST_CLOSING);
	if (c->fd < 0) { /* memory connection */
		c->todo |= TL_DO_TEARDOWN;
		return TL_FEED_DEAD;
	}
	/* Both close frames are out: the handshake is complete. End our
	 * sending side (TLS close_notify, then FIN) so the peer, which closes
	 * TCP first (RFC 6455 7.1.1), is not left waiting for it (Python's
	 * websockets over TLS waits for our close_notify). Bound the wait for
	 * its end; a close we started keeps its earlier deadline. */
	c->todo |= TL_DO_SHUT_WR;
	if (!c->deadline_ns)
		tl_timer_set_deadline(l, c, tl_conn_close_timeout(l, c));
	return TL_FEED_DEAD; /* stop parsing: input is discarded from here */
}

void tl_conn_late_input(struct tl_conn *c)
{
	if (!tl_conn_close_rcvd(c) || c->late_rx)
		return;
	c->late_rx = 1;
	if (c->shut_wr == TL_SHUT_DONE)
		c->todo |= TL_DO_TEARDOWN;
}

void tl_conn_on_eof(struct tl_loop *l, struct tl_conn *c)
{
	if (c->fail_err) {
		c->todo |= TL_DO_TEARDOWN;
	} else if (tl_conn_close_rcvd(c)) {
		c->todo |= TL_DO_TEARDOWN; /* clean: EventClose */
	} else if (c->refusing) {
		tl_conn_refusal_end(l, c); /* a close-delimited body ended, or the server hung up */
	} else if (c->state < TL_ST_OPEN) {
		tl_conn_fail(l, c, TL_E_LOST, c->eof_errno, 0,
			     c->eof_errno ? strerror(c->eof_errno) : "the server closed TCP during the handshake");
	} else {
		/* (A failed send may have taken the socket's error: report it.) */
		int e = c->eof_errno ? c->eof_errno : c->send_errno;
		tl_conn_fail(l, c, TL_E_LOST, e, 1006, e ? strerror(e) : "the server closed TCP (EOF)");
	}
}
