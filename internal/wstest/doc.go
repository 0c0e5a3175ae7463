// Package wstest runs real WebSocket servers on loopback for integration
// tests of WebSocket clients, talaris' C-backed client in particular.
//
// # Servers
//
// [NewGorilla] (github.com/gorilla/websocket) and [NewCoder]
// (github.com/coder/websocket) build a [Server] with the same endpoints;
// [Server.Start] listens on 127.0.0.1 and sets [Server.URL]
// (ws://127.0.0.1:port); [Server.StartTLS] serves the same over TLS
// (wss://127.0.0.1:port). Endpoints, configured with query parameters:
//
//	/stream?n=N&size=S&op=binary|text&frag=K&ping=1&rst=1
//	    Sends N messages, message i being PayloadOp(op, i, S). frag=K>1
//	    sends each message as K fragments and ping=1 puts a ping "p<i>"
//	    between fragments (before each message when frag<=1); both are
//	    written as raw frames on the underlying connection. Then sends
//	    close 1000 "done" and waits for the client's close.
//	/echo
//	    Echoes every message with its opcode and answers a close with a
//	    close.
//	/close?code=C&reason=R&after=N
//	    After reading N messages (default 0) sends a close with code C
//	    (default 1000, 0 for an empty body, invalid codes allowed) and
//	    reason R, then completes the handshake.
//	/drop?n=N&size=S&op=..&rst=1&trunc=1&partial=1
//	    Sends N stream messages, then closes TCP without a close frame
//	    (with rst=1 as a reset). Over TLS ([Server.StartTLS]) the TLS
//	    connection is closed with close_notify, unless trunc=1: then TCP
//	    is closed under TLS without it (partial=1: after half a record).
//	/collect
//	    Records every message (see Server.Collected, Server.OnMessage).
//	/subproto
//	    Accepts subprotocol "v1.talaris" if offered, sends the chosen
//	    protocol ("" if none) as its first text message, then echoes.
//
// # Raw server
//
// [RawServer] performs the opening handshake itself and then hands a
// [RawConn] to a user function that writes arbitrary bytes (invalid frames,
// non-minimal lengths, chopped writes, resets) and reads the client's frames.
//
// # Payloads
//
// [Payload], [TextPayload] and [AppendPayload] generate deterministic
// message bodies; [Checker] verifies that a stream of them arrives complete
// and in order.
package wstest
