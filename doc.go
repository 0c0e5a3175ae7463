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
//	err = p.RunData(ctx, func(c talaris.Conn, op talaris.Opcode, payload []byte) {
//		handle(payload) // payload is valid only inside this call
//	}) // until ctx ends (ctx.Err()) or p is closed (nil)
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
// Each Pool owns one C loop thread (pinned with Config.LoopCPUs) and one
// io_uring instance, or with Config.Loops = N, N of them (pinned with
// Config.LoopCPUs), each serving its own share of the connections: a
// connection lives on one loop for its whole life, so its events keep
// their order, and one pump drains every loop's ring. Exactly one goroutine pumps a Pool at a time (Run,
// RunData, Pump, PumpData, PumpNowait, ...); a second concurrent pump gets
// ErrConcurrentPump. For the lowest latency, lock the pumping goroutine to
// its OS thread (Run does) and pin it to another CPU (PinCurrentThreadTo). The price
// of the lock is CPU, not latency: a pump that is not locked passes
// through Go's scheduler once per 8 ms while it sleeps and wakes often,
// which keeps the runtime's monitor thread (sysmon) asleep; on a locked
// one that pass would hand its thread's P away and back, so it is not
// made, and the monitor takes the pump's P every 10 ms and wakes often
// after (docs/notes/2026-12-tls-receive-path.md has the costs measured). Dial,
// DialAsync, Send*, Ping, Pong and Close may be called from any goroutine,
// including from inside a pump callback; they copy their data into a
// command ring the loop drains.
//
// # Waiting
//
// When there is nothing to do, the loop and the pump wait as Config.Wait
// says. The default, WaitAdaptive, spins (yielding the CPU as it goes) only while traffic is recent: the
// pump while events have been arriving within Config.SpinTime of each
// other, the loop for the answer a callback sends to what it just
// delivered while such answers have come within SpinTime; a send made
// then needs no wake-up of the loop. After a send, both spin up to
// Config.Tuning.ReplySpin (300us) for its answer while answers come that fast,
// so an order's acknowledgement finds them awake. An idle Pool sleeps on
// both sides.
// WaitSpin never sleeps (one core each), WaitBlock never spins.
//
// Config.Tuning.InlineLoop (opt-in, Loops must be 1) runs the loop without a
// thread of its own: the goroutine that created the Pool runs it inside
// Pump*, Run*, Dial, blocking sends and Close, one cgo call per batch of events.
// A reply then wakes one thread instead of two, but the Pool makes
// progress only while that goroutine is in one of those calls; another
// goroutine's Pump* or Run* returns ErrNotLoopThread.
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
// The ring is shared fairly: a connection holds at most its share of it
// (256 events or 4 MiB of payload not yet passed by the pump) before the loop holds its input back the same way,
// so one connection's flood queues at most that much ahead of another
// connection's message (an order's answer) instead of a whole ring. A
// connection alone on its Pool keeps the whole ring.
//
// # Sending
//
// SendText, SendBinary, Ping, Pong and Close copy their data into the
// command ring and return; the loop takes every command off that ring as
// soon as it runs and keeps each connection's unsent frames in that
// connection's own queue, so a peer that stops reading never delays
// another connection's sends, dials, pings or closes.
//
// A direct send skips the loop: a text or binary message of up to 64 KiB
// on an open ws:// connection with nothing queued, whose socket the loop
// is not writing, is framed, masked and written by the calling goroutine
// (one send(2) on the non-blocking socket, as a Go WebSocket client
// does), and what the socket does not take goes to the loop, in order.
// The loop's own frames (pongs, the close) and queued sends never mix
// with it. wss:// always sends
// through the loop, which alone uses the TLS session.
//
// Back-pressure is per connection and decided in Go, without a round
// trip: a send that would take the connection's unsent bytes
// (ConnStats.SendQueued) past Config.MaxSendQueue returns ErrWouldBlock at
// once and queues nothing (a message larger than the whole queue goes
// when the queue is empty). SendContext waits for room instead, until its
// context ends; the loop wakes it (a futex) as queued bytes reach the
// socket, when the connection ends and when the Pool closes.
// ConnStats.SendQueueFull counts the refusals and waits. After Close,
// sends return ErrClosed.
//
// # Orders: what is accepted is sent, or counted
//
// A message a Send* call returned nil for is written to the socket before
// the close frame of a later Close or Pool.Close, as gorilla and coder
// do; the close timeout bounds that drain and the wait for the server's
// close frame. Conn.Flush(ctx) returns once every message accepted before
// it has been handed to the socket. Conn.SendBatch queues several messages
// all or none and writes them with one send. A message that never
// reaches the socket (the close timed out, the server closed first, an
// Abort, a drop) is counted: ConnStats.SendDropped, Metrics.SendDropped
// (talaris_send_dropped_total) and Event.SendDropped on the final event
// or EventReconnecting. Nothing accepted on one connection is ever sent
// on the next one of a reconnecting handle: from the drop until the next
// EventOpen every send returns ErrReconnecting at once (it does not match
// ErrWouldBlock; a SendContext waiting for room returns it too). The
// idiom for an order gateway:
//
//	case talaris.EventReconnecting: // orders accepted and unsent: ev.SendDropped
//	case talaris.EventOpen:         // a new session: decide which orders still stand, then send them
//
// # Connection lifecycle
//
// A Conn is StateConnecting from the moment Dial or DialAsync hands it
// out, then StateTLS, StateUpgrading, StateOpen, StateClosing and finally
// StateClosed; StateIdle only ever describes the zero Conn. Its events
// start with EventOpen and end with exactly one final event, EventClose or
// EventError; afterwards the handle is dead (StateClosed, zero Stats,
// ErrClosed from its methods). A failed synchronous Dial delivers no event
// at all: the caller gets the error, never the Conn. DialAsync's failure
// is its EventError.
//
// Run, Pump and PumpNowait deliver every event to their EventFunc.
// RunData, PumpData and PumpDataNowait deliver data to their DataFunc and
// every other event to Config.OnEvent, on the same goroutine and in order,
// so a consumer that only pumps data still sees each open, close and
// error. Run and RunData are the pump a service runs: they lock their
// goroutine to its OS thread and pump until their context ends (they
// return ctx.Err()) or the Pool is closed (nil), and while the pool has no
// connection they sleep, without a timeout, until a dial's first event,
// Close or the context's end wakes them. The other blocking pumps return
// after each batch and do not wait on a pool with no connection left:
// once the last connection's final event has been consumed (that event
// wakes them) they return ErrNoConns; ConnCount says how many connections
// have not ended (a failed synchronous Dial's connection ended when Dial
// returned).
//
// Pool.Close may be called at any time from any goroutine, including a
// pump callback: calls racing it return ErrPoolClosed (Conn.State
// StateClosed, Stats zero) and never read freed memory, the Pump* calls
// return ErrPoolClosed and Run returns nil, ConnCount is 0 and every
// handle is StateClosed.
//
// # Heartbeat, read timeout and abort
//
// DialOptions.PingInterval makes the loop send a ping whenever nothing has
// arrived on an open connection for that long; DialOptions.ReadTimeout
// fails a connection on which nothing at all (data, ping, pong) has
// arrived for that long, with EventError wrapping ErrReadTimeout (code
// 1006, no close handshake). Both are timers in the C loop: no goroutine
// per connection, and nothing is done per message (the loop stamps the
// time of each receive completion and checks lazily when the timer is
// due). Use a PingInterval below the ReadTimeout so a quiet but healthy
// peer answers in time; a frozen peer (TCP up, nothing flowing) is then
// detected within ReadTimeout.
//
// Conn.Abort ends a connection at once, without a close handshake and
// without waiting for queued output: the final event is EventError
// wrapping ErrAborted.
//
// # Closing
//
// Conn.Close queues the close frame behind the messages already
// accepted. Once both close frames have crossed, the client ends its
// side of the connection (over TLS with a close_notify, then a TCP FIN),
// so servers that wait for it (Python's websockets over TLS) close at
// once; the final EventClose follows at the server's TCP end, at the
// first bytes it sends after its close frame, or after 100 ms, whichever
// comes first (a server whose writer keeps going never sends a FIN). A
// close whose queue does not drain, or whose server's close frame does not
// come, within the close timeout (Config.CloseTimeout, or
// DialOptions.CloseTimeout) ends with EventError wrapping
// ErrCloseTimeout. Pool.Close sends 1001 (going away) to every open
// connection, behind what each had accepted, and waits, bounded the same
// way, for their close handshakes before it frees the loop.
//
// With DialOptions.Reconnect the end of a connection is not final unless
// the policy gives up: the loop delivers EventReconnecting (Err says why,
// Delay how long it waits), waits on a timer of its own, re-dials the same
// slot (the Conn handle stays valid and equal to itself), sends
// DialOptions.Subscribe first and delivers EventOpen with Reconnects
// counting the re-opens. In the gap State reports StateConnecting (or a
// later handshake state) and Send*, SendBatch, SendContext, Ping and Pong
// return ErrReconnecting: the application resubscribes through Subscribe
// and resyncs its state when the EventReconnecting/EventOpen pair
// arrives. Conn.Close and
// Conn.Abort stop the reconnecting (during the wait they end the handle at
// once with an EventError wrapping ErrAborted); Pool.Close ends every
// handle.
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
// A refused or malformed upgrade response is a *HandshakeError (get it
// with errors.As): StatusCode, Header, the first bytes of Body and
// RetryAfter, parsed from the server's reply (a 429 or 503 with
// Retry-After says when to come back). Connect failures are ErrDial
// wrapping the errno (errors.Is(err, syscall.ECONNREFUSED)), after every
// address of the host name was tried (IPv4 first); ErrResolve when the
// name has none. DialOptions.LocalAddr binds the source address.
//
// # TLS
//
// wss:// uses BoringSSL (Debian's android-libboringssl-dev) by default, or
// OpenSSL 3 when built with the tag talaris_openssl. Certificates are
// verified against the system store with SNI and host name checks (the
// subjectAltName only, never the subject CN), and ALPN offers http/1.1.
// TLSOptions changes the roots, presents a client certificate, sets the
// minimum version and the cipher suites, pins the server's public key
// (ErrTLSPin), or, for tests only, skips verification. A new Dial to the
// same address and server name on the same Pool resumes the last TLS
// session (ConnStats.Resumed). docs/ARCHITECTURE.md has the table of
// verdicts, the same with either backend.
//
// On TLS 1.3 with an AES-GCM suite, after the first application data the
// loop opens the server's records itself, straight from the receive
// slots into the memory events point at, with no copies through the
// library (KeyUpdate, NewSessionTicket and alerts handled as RFC 8446
// says; Metrics.TLSRecords counts the records). It decrypts them with
// talaris' own AES-GCM on 256-bit vectors where the CPU has VAES and
// VPCLMULQDQ (Metrics.TLSRecordsOwnGCM; Config.Tuning.NoOwnGCM keeps the
// library's), else with the library's. Config.Tuning.NoTLSRecordLayer keeps the
// library's SSL_read throughout; TLS 1.2 and ChaCha20-Poly1305 always use
// it.
//
// # Observability
//
// Pool.Metrics returns pool-wide counters (messages, bytes, wire bytes,
// send-queue-full events, reconnects, TLS records; the loop's internals,
// completions, re-arms, ENOBUFS, stalls, batches, pump sleeps and loop
// wake-ups, through Metrics.EachCounter and the Prometheus output) and, when
// Config.SampleEvery is set, HdrHistogram-style latency histograms per
// Stage (count, sum, min, max, quantiles, buckets). Pool.MetricsInterval gives the
// histograms of the interval since its previous call, for dashboards.
// Pool.WritePrometheus writes the text exposition (every name prefixed
// talaris_, the stages as one histogram family
// talaris_stage_latency_seconds{stage,pool}, pool set by Config.Name)
// without any dependency; the module github.com/talaris-go/talaris/prom
// provides a client_golang Collector.
//
// Sampling. With SampleEvery N the loop stamps one receive completion in N
// (an Inject counts as a memory connection's completion) when it sees it;
// stamps again when the bytes reach the frame parser (after SSL_read for
// wss; for ws the completion's stamp is reused when the parser takes the
// bytes at once, so the stage is 0 unless they waited behind a stall);
// and the first data message the parser completes from them carries
// both, in a stamp table beside the event ring (the 32-byte event only
// gets a flag bit). Just before the tail store that publishes the batch
// the loop adds the publish stamp, and the pump takes the callback stamp
// before calling the callback, then folds the four into the histograms
// (about 20 ns per sample, on the pump, after the callback). A completion
// whose bytes complete no message (a control frame, a partial frame) leaves
// no sample. Stamps are CLOCK_MONOTONIC nanoseconds on both sides: C reads
// clock_gettime, the pump the runtime's monotonic clock (the same vDSO
// clock, no syscall). With sampling off (the default) the cost is one
// predictable branch per completion and per message, and no allocation or
// memory for the histograms.
//
// Pool.PumpStamped is PumpData whose callback also receives the message's
// Stamps (zero when it was not sampled), for callers who relate their own
// clock to the loop's.
//
// The kernel's software receive timestamp (wire_to_callback) is not taken:
// the loop's multishot recv (IORING_OP_RECV) returns no control messages,
// so SO_TIMESTAMPNS cannot reach it. It would need multishot recvmsg with
// a header and control area in every provided buffer (a different slot
// layout and a parse per completion) and turns on timestamping of every
// packet of the host; the stage stays in the histograms, empty.
//
// Config.Logger (a *slog.Logger; nil logs nothing) receives the lifecycle
// of each connection, named by pool, slot and gen (the halves of Conn.ID):
// dialing, TLS done (seen by Dial), open, closed with its code at Info;
// failures with their class (the sentinel's name, e.g. tls_unknown_ca) and,
// for TLS and handshake failures, their category (tls, handshake) at Warn.
// Records are written by the
// goroutine that dials and by the pump when it passes a non-data event,
// never per message.
//
// # Platforms
//
// The C core needs Linux (io_uring, kernel 6.1 or newer) and cgo. Elsewhere
// the same API compiles and returns ErrUnsupported.
package talaris
