// Package talaris is a Linux WebSocket client for latency-sensitive Go
// services (market data, order entry) whose hot path runs in C: an
// io_uring loop on its own pinned thread receives with multishot recv into
// a registered provided-buffer ring, decrypts TLS through an in-memory BIO,
// parses RFC 6455 frames and hands payload pointers to Go through a batched
// single-producer/single-consumer ring. Go configures the loop and consumes
// from it; it never touches a socket on the hot path.
//
// # Usage
//
//	p, err := talaris.NewPool(talaris.Config{})
//	if err != nil { ... }
//	defer p.Close()
//	c, err := p.Dial(ctx, "wss://feed.example:443/ws", nil)
//	if err != nil { ... }
//	c.SendText([]byte(`{"op":"subscribe","channel":"trades"}`))
//	for {
//		_, err := p.PumpData(func(c talaris.Conn, op talaris.Opcode, payload []byte) {
//			handle(payload) // payload is valid only inside this call
//		})
//		if err != nil { break }
//	}
//
// # Configuration
//
// The zero Config is usable: every zero field takes the default written
// beside it, and the C loop is always given the resulting explicit values.
// A Pool's limits (connections, ring, arena and message sizes) are fixed
// when it is created; a Pool that cannot work is refused with
// ErrInvalidConfig.
//
// # Threading model
//
// Each Pool owns one C loop thread (pinned with Config.LoopCPU) and one
// io_uring instance. Exactly one goroutine pumps a Pool at a time (Pump,
// PumpData, PumpSpin, PumpNowait); a second concurrent pump gets
// ErrConcurrentPump. For the lowest latency, lock the pumping goroutine to
// its OS thread and pin it to another CPU (PinCurrentThreadTo). Dial,
// DialAsync, Send*, Ping, Pong and Close may be called from any goroutine,
// including from inside a pump callback; they copy their data into a
// command ring the loop drains.
//
// # Memory lifetime
//
// A payload slice given to a callback points into a C arena, not the Go
// heap. It stays valid until the callback returns; the loop reuses the
// memory only after the pump has released the whole batch. Copy what you
// keep. Nothing is allocated per message on either side and the pump makes
// no cgo call per message.
//
// # Back-pressure
//
// A slow consumer never loses data: when the event ring or arena is full,
// the loop stops parsing that connection's input, keeps the received
// buffers, and when the buffer ring runs dry the kernel stops receiving,
// so TCP slows the sender. Everything resumes when the pump catches up.
//
// # Sending
//
// SendText, SendBinary, Ping, Pong and Close copy their data into the
// command ring and return; they block only while that ring is full. The
// loop holds a connection's sends back while its unsent bytes would pass
// Config.MaxSendQueue, so a peer that stops reading can fill the ring:
// Config says for how long a Send then waits.
//
// # Connection lifecycle
//
// A Conn goes Connecting, TLS, Upgrading, Open, Closing and ends with one
// final event: EventClose (the close handshake completed) or EventError.
// After it the handle is dead and its slot is reused.
//
// With DialOptions.Reconnect the end of a connection is not final unless
// the policy gives up: the loop delivers EventReconnecting (Err says why,
// Delay how long it waits), waits on a timer of its own, re-dials the same
// slot (the Conn handle stays valid and equal to itself), sends
// DialOptions.Subscribe first and delivers EventOpen with Reconnects
// counting the re-opens. In the gap State reports StateConnecting (or a
// later handshake state) and Send*, Ping and Pong return ErrWouldBlock:
// the application resubscribes through Subscribe and resyncs its state
// when the EventReconnecting/EventOpen pair arrives. Conn.Close stops the
// reconnecting (during the wait it ends the handle at once with an
// EventError wrapping ErrClosed); Pool.Close ends every handle.
// ReconnectPolicy documents the backoff, Retry-After and MaxAttempts.
//
// # Errors
//
// Errors returned by this package and Event.Err wrap exported sentinels
// (ErrTLSUnknownCA, ErrBadStatus, ErrProtocol, ErrConnectionLost, ...);
// test them with errors.Is. Failures during a connection's life end it
// with a final EventError carrying the RFC 6455 close code that applied
// (1002 protocol error, 1007 invalid UTF-8, 1009 too big, 1006 lost); a
// completed close handshake ends it with EventClose.
//
// # TLS
//
// wss:// uses BoringSSL (Debian's android-libboringssl-dev) by default, or
// OpenSSL 3 when built with the tag talaris_openssl. Certificates are
// verified against the system store with SNI and host name checks, and
// ALPN offers http/1.1; TLSOptions changes the roots or, for tests only,
// skips verification.
//
// # Platforms
//
// The C core needs Linux (io_uring, kernel 6.1 or newer) and cgo. Elsewhere
// the same API compiles and returns ErrUnsupported.
package talaris
