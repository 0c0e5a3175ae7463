package talaris

// The exported API, the same on every platform: Pool and its dialing and
// pumps, Conn and its methods, events and the callbacks that receive them.
// Each method does the checks that need no platform and calls the
// platform's half (talaris_linux.go and the files beside it, or
// talaris_stub.go).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/talaris-go/talaris/ws"
)

// Pool owns one C loop thread (Config.Loops: or several, each with its own
// connections), its io_uring, its rings and a set of connections. Create
// it with NewPool; one goroutine pumps it. Pool.Metrics sums every
// loop's counters. Without linux and cgo every operation returns
// ErrUnsupported.
type Pool struct {
	pool // the platform's half: talaris_linux.go or talaris_stub.go
}

// NewPool starts a C loop thread configured by cfg.
func NewPool(cfg Config) (*Pool, error) { return newPool(cfg) }

// Close shuts the loop down: open connections send what they had accepted
// (as Conn.Close does), then a 1001 (going away) close frame, and Close
// waits for each close handshake to complete (the server's echo, then its
// TCP end or a short grace), at most the connection's close timeout
// (Config.CloseTimeout, or DialOptions.CloseTimeout), before the sockets
// are closed and the loop is freed; connections still dialing are
// dropped. Pending events are dropped (events that no longer fit in the
// ring are discarded so a connection nobody pumps still reads its echo). A
// Pump in progress returns ErrPoolClosed (after the callback that called
// Close, when one did: Close may be called from a pump callback and
// returns promptly). Close is idempotent and safe against every concurrent
// call: a method racing it, or called after it, returns ErrPoolClosed
// (Conn.State: StateClosed, Conn.Stats: zero); it never reads freed
// memory. After Close ConnCount is 0 and every handle reports StateClosed;
// Pool.Metrics keeps reporting the counters as they were
// when the loop stopped.
func (p *Pool) Close() error { return p.close() }

// ConnCount returns the number of live connections: dialing, open,
// closing or reconnecting. A connection leaves the count when its final
// event is consumed, or, for a synchronous Dial that failed, when Dial
// returns the error (whether or not anything pumps).
func (p *Pool) ConnCount() int { return p.connCount() }

// Dial connects, upgrades and returns an open connection, or the reason it
// could not. The connection's events (EventOpen first) also reach Pump; a
// dial that fails delivers no event at all (the caller never had the
// Conn). ctx bounds the whole dial, name resolution included; cancelling
// it aborts the connection (unless it opened first: then Dial returns it).
//
// A host name is resolved to all its addresses, tried in turn (IPv4
// first) until one connects. Errors: ErrDial wrapping the errno of the
// last connect (errors.Is(err, syscall.ECONNREFUSED)), ErrResolve,
// ErrTimeout, the TLS causes, and for a refused upgrade a *HandshakeError
// (errors.As) that also matches ErrHandshake and its cause (ErrBadStatus
// ...).
//
// Without DialOptions.Reconnect Dial makes exactly one attempt; with it,
// Dial returns once an attempt opens or the policy gives up (the last
// error), and ctx bounds all the attempts and waits together. A Dial that
// gives up delivers no event; the EventReconnecting of attempts that
// failed before the open reach the pump only if it passes them after
// Dial returned the Conn (never before).
func (p *Pool) Dial(ctx context.Context, rawURL string, opts *DialOptions) (Conn, error) {
	return p.dial(ctx, rawURL, opts)
}

// DialAsync starts a dial and returns at once with a handle in
// StateConnecting. EventOpen or EventError for the returned Conn follows
// through the pumps (an EventError's Err is what Dial would have
// returned). A host name is resolved before it returns; use an IP address
// to avoid that wait.
func (p *Pool) DialAsync(rawURL string, opts *DialOptions) (Conn, error) {
	return p.dialAsync(rawURL, opts)
}

// DialMemory opens a socketless connection whose server bytes come from
// Conn.Inject instead of a socket: it runs the same C frame parser, ring
// and pump path as a network connection. Use it to benchmark the decode
// path or to replay a captured feed.
func (p *Pool) DialMemory() (Conn, error) { return p.dialMemory() }

// Pump delivers every pending event of every connection to fn, in order,
// and releases their payload memory when fn has returned for the whole
// batch. It blocks until at least one event was delivered and returns how
// many were. Only one goroutine may pump a Pool at a time; a second gets
// ErrConcurrentPump.
//
// Every blocking pump (Pump, PumpData, PumpStamped) ends the same way. It
// returns ErrPoolClosed once Close ran, and ErrNoConns instead of blocking
// when nothing is pending and the pool has no connection left (ConnCount
// is 0): none was dialed, or the last one's final event was just consumed
// (that event wakes a sleeping pump). A Dial or DialAsync counts from the
// moment it is called, so a program dials, then pumps; a connection that
// reconnects counts until its policy gives up. Run and RunData wait for a
// connection instead.
func (p *Pool) Pump(fn EventFunc) (int, error) { return p.pumpBlocking(fn, nil, nil) }

// PumpData is Pump for data messages: open, ping, pong, close and error
// events go to Config.OnEvent, in order with the data, or are consumed
// without a callback when it is nil (pings were answered by the loop
// already). It blocks until at least one callback ran and returns how
// many did. It ends as Pump does.
func (p *Pool) PumpData(fn DataFunc) (int, error) { return p.pumpBlocking(nil, fn, nil) }

// PumpNowait is Pump's one non-blocking pass: it delivers every event
// that is pending and returns at once; n == 0 means nothing arrived yet.
// A loop over it is a busy-polling pump that never sleeps (Config.Wait
// picks spinning for the blocking pumps).
func (p *Pool) PumpNowait(fn EventFunc) (int, error) { return p.pumpOnce(nil, fn) }

// PumpDataNowait is PumpData's one non-blocking pass: data messages to
// fn, the other events to Config.OnEvent, as PumpNowait.
func (p *Pool) PumpDataNowait(fn DataFunc) (int, error) { return p.pumpOnce(fn, nil) }

// Run is the pump a service runs: it locks the calling goroutine to its
// OS thread (runtime.LockOSThread, undone when it returns) and delivers
// every event to fn, as Pump does, until ctx ends (it returns ctx.Err())
// or the Pool is closed (it returns nil; also when it was closed before
// Run, and when fn itself calls Close). Unlike Pump it does not end when
// the pool has no connection: it sleeps until a Dial, DialAsync or
// DialMemory adds one (its first event wakes it), Close, or the end of
// ctx, without spinning or polling. With connections it waits as the
// blocking pumps do (Config.Wait), and the end of ctx wakes it from
// those waits too.
//
// Run is a pump call for its whole life: a second pump (Run, RunData,
// Pump* ...) meanwhile gets ErrConcurrentPump, and so does Run while
// another goroutine pumps. With Config.Tuning.InlineLoop only the
// goroutine that created the Pool may run it (else ErrNotLoopThread);
// its idle waits are the inline loop's, at most 100 ms each.
func (p *Pool) Run(ctx context.Context, fn EventFunc) error { return p.run(ctx, fn, nil) }

// RunData is Run for data messages, as PumpData: open, ping, pong, close,
// error and reconnecting events go to Config.OnEvent, in order with the
// data, or are consumed without a callback when it is nil.
func (p *Pool) RunData(ctx context.Context, fn DataFunc) error { return p.run(ctx, nil, fn) }

// PumpStamped is PumpData whose callback also gets the message's stage
// stamps: zero unless the message was sampled (Config.SampleEvery), so a
// caller can relate its own clock (an exchange timestamp, say) to the
// moment the kernel handed over the bytes. It blocks until at least one
// message was delivered, allocates nothing per message, and records the
// sampled messages in Metrics like the other pumps. It ends as Pump does.
func (p *Pool) PumpStamped(fn StampedFunc) (int, error) { return p.pumpStamped(fn) }

// Metrics returns the pool's stage latency histograms, cumulative since
// NewPool, and its counters. The histograms hold the sampled messages
// (Config.SampleEvery; empty when sampling is off) that a pump has passed;
// samples a pump call is still working on appear when it returns. Safe
// from any goroutine, also during and after Close (the counters then keep
// their final values).
func (p *Pool) Metrics() Metrics { return p.metrics(false) }

// MetricsInterval is Metrics with the histograms of the interval since the
// previous MetricsInterval call (or NewPool), for dashboards that want
// per-interval latency; it starts a new interval. The counters stay
// cumulative, and Metrics (and WritePrometheus) are not affected.
func (p *Pool) MetricsInterval() Metrics { return p.metrics(true) }

var errNilWriter = errors.New("talaris: WritePrometheus: nil io.Writer")

// WritePrometheus writes Metrics in the Prometheus text exposition format
// (version 0.0.4: an HTTP handler sets the header Content-Type to
// "text/plain; version=0.0.4; charset=utf-8"), every sample labelled
// pool="<Config.Name>", in one Write call:
//
//   - each counter of Metrics (see Metrics.EachCounter) as a counter
//     family named talaris_<name>_total;
//   - each gauge of Metrics (see Metrics.EachGauge) as a gauge family,
//     once for the pool and once more with a conn label per
//     DialOptions.Label;
//   - the stage latencies as one histogram family,
//     talaris_stage_latency_seconds, with a stage label (a Stage's String):
//     cumulative _bucket samples at LatencyBucketBounds() in seconds plus
//     le="+Inf", then _sum (seconds) and _count;
//   - talaris_stage_rejected_total{stage}: samples whose stamps went
//     backwards.
//
// Every stage is written, recorded or not, so the set of series is fixed.
func (p *Pool) WritePrometheus(w io.Writer) error {
	if w == nil {
		return errNilWriter
	}
	m := p.Metrics()
	return writePrometheus(w, p.name(), &m)
}

// Close codes (RFC 6455 section 7.4.1 and the IANA registry), as package
// ws defines them: here so that a Close call needs no second import.
const (
	CloseNormal             = ws.CloseNormal
	CloseGoingAway          = ws.CloseGoingAway
	CloseProtocolError      = ws.CloseProtocolError
	CloseUnsupportedData    = ws.CloseUnsupportedData
	CloseNoStatus           = ws.CloseNoStatus // never sent: the close frame carried no code
	CloseAbnormal           = ws.CloseAbnormal // never sent: the connection dropped without a close frame
	CloseInvalidPayload     = ws.CloseInvalidPayload
	ClosePolicyViolation    = ws.ClosePolicyViolation
	CloseMessageTooBig      = ws.CloseMessageTooBig
	CloseMandatoryExtension = ws.CloseMandatoryExtension
	CloseInternalError      = ws.CloseInternalError
	CloseServiceRestart     = ws.CloseServiceRestart
	CloseTryAgainLater      = ws.CloseTryAgainLater
	CloseBadGateway         = ws.CloseBadGateway
	CloseTLSHandshake       = ws.CloseTLSHandshake // never sent
)

// State is a connection's lifecycle state.
type State uint32

// Connection states, in order.
const (
	StateIdle       State = 0 // the zero Conn (a handle from Dial or DialAsync never reports it)
	StateConnecting State = 1 // TCP connect in progress (from the moment DialAsync returns)
	StateTLS        State = 2 // TLS handshake in progress
	StateUpgrading  State = 3 // HTTP upgrade in progress
	StateOpen       State = 4
	StateClosing    State = 5 // close frame sent or received
	StateClosed     State = 6 // final: the handshake completed or the connection failed
)

var stateNames = [...]string{"idle", "connecting", "tls", "upgrading", "open", "closing", "closed"}

// String returns the state's name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint32(s))
}

// ConnStats are a connection's counters, kept by the C loop (the send
// queue's two by the Go side).
type ConnStats struct {
	MsgsIn, BytesIn uint64 // data messages and their payload bytes delivered to the ring
	// MsgsOut and BytesOut are the data messages and payload bytes of
	// Send* the connection took into its send path (framed, or written
	// by a direct send). Messages a Close or Abort then drops before they
	// started stay counted; WireOut and SendQueued say what reached the
	// socket.
	MsgsOut, BytesOut uint64
	PingsIn, PongsIn  uint64
	WireIn, WireOut   uint64 // bytes read from and written to the socket
	Resumed           bool   // the TLS handshake resumed a session of an earlier dial

	// SendQueued is the payload bytes Send*, Ping and Pong accepted that
	// are not written to the socket yet (a ping or pong counts 14 bytes
	// more than its payload): what Config.MaxSendQueue bounds. A message
	// counts until the out buffer holding its last byte has been written.
	SendQueued uint64
	// SendQueueFull counts the sends refused with ErrWouldBlock, and the
	// SendContext calls that had to wait, because the queue was full.
	SendQueueFull uint64
	// SendDropped counts the messages (pings and pongs included) Send*
	// accepted that never reached the socket: still queued when a close
	// timed out, when the server's close frame came first, at Abort, or
	// when the connection dropped (a reconnect's gap included). The final
	// event and each EventReconnecting report the ones since the last
	// report in Event.SendDropped.
	SendDropped uint64
	Reconnects  uint64 // successful re-opens under a ReconnectPolicy
}

// Conn is a handle to one connection of a Pool. It is a small value: copy
// it, compare it, use it as a map key. A handle whose connection has ended
// (after its EventClose or EventError) is dead: its methods return
// ErrClosed, State returns StateClosed and Stats zero, even if the Pool
// reuses the underlying slot for a new connection. Once the Pool is
// closed (also while Close runs) they return ErrPoolClosed, StateClosed
// and zero.
type Conn struct {
	p    *Pool
	slot uint32
	gen  uint32
}

// ID returns a number unique among the pool's live connections (slot and
// generation packed), handy for per-connection state in a slice or map.
func (c Conn) ID() uint64 { return uint64(c.gen)<<32 | uint64(c.slot) }

// Slot returns the connection's slot index in [0, Config.MaxConns): stable
// for the connection's life, reused after it ends. Use it to index
// per-connection arrays without a map lookup.
func (c Conn) Slot() int { return int(c.slot) }

// Pool returns the pool the connection belongs to.
func (c Conn) Pool() *Pool { return c.p }

// SendText queues b as one text message. b is copied before SendText
// returns. Safe from any goroutine; it never waits for the peer. b must
// be valid UTF-8, else ErrInvalidUTF8 (utf8.Valid: about 65 ns per KiB of
// ASCII, 1.3 to 2.3 us per KiB of multi-byte text on the 2-core test box;
// BenchmarkSendTextValidate in tests/). SendBinary does not check.
//
// Back-pressure: when the connection's queued bytes (ConnStats.SendQueued)
// plus len(b) would pass Config.MaxSendQueue, SendText returns
// ErrWouldBlock at once and queues nothing (a message larger than the
// whole queue is accepted when the queue is empty). Use SendContext to
// wait for room instead. After Close, once a close frame was sent or
// received (StateClosing: nothing more may be sent) and once the
// connection has ended, it returns ErrClosed; after Pool.Close,
// ErrPoolClosed. A message sent
// before the connection is open (right after DialAsync) waits in the
// queue and goes out once the upgrade completes; it is dropped if the
// dial fails. Messages larger than 1 MiB (a quarter of the command ring) are
// sent as several fragments of one message. Under a ReconnectPolicy,
// from the drop (EventReconnecting follows) to the next EventOpen it
// returns ErrReconnecting and queues nothing: decide after EventOpen
// whether the order still stands. A message that raced the drop is
// dropped (ConnStats.SendDropped, Event.SendDropped), never sent on the
// next connection (DialOptions.Subscribe is what every new connection gets).
// With Config.Tuning.InlineLoop, from a goroutine other than the Pool's, it also
// returns ErrWouldBlock (counted) when the command ring is full until
// that goroutine runs the loop again.
//
// A message returned nil for is sent before the close frame of a later
// Close (within the close timeout) and is never sent on another
// connection. Flush says when it has reached the socket.
func (c Conn) SendText(b []byte) error { return c.send(OpText, b) }

// SendBinary queues b as one binary message, like SendText.
func (c Conn) SendBinary(b []byte) error { return c.send(OpBinary, b) }

// SendContext queues b as one message of opcode op (OpText or OpBinary),
// waiting while the connection's send queue is too full to take it (see
// SendText). It returns nil once b is queued, ctx.Err() wrapped when ctx
// ends first (errors.Is(err, context.DeadlineExceeded)), ErrClosed when
// the connection ends or is closed meanwhile, ErrPoolClosed when the Pool
// is, and ErrReconnecting at once, or as soon as the connection drops
// while it waits, under a ReconnectPolicy. The wait sleeps on a futex the
// loop signals as queued bytes reach the socket: no polling.
func (c Conn) SendContext(ctx context.Context, op Opcode, b []byte) error {
	return c.sendContext(ctx, op, b)
}

// SendBatch queues msgs, in order, as messages of opcode op (OpText, each
// valid UTF-8, or OpBinary), all or none: when they do not all fit the
// send queue it returns ErrWouldBlock and queues nothing (like one
// message, a batch larger than Config.MaxSendQueue is accepted whole when
// the queue is empty). The messages are copied before it returns and
// written together: on an open ws:// connection with nothing queued the
// sending goroutine frames them all and writes them with one send(2);
// otherwise the loop collects them and writes them with one send (one
// TLS write for wss). Errors and safety as SendText; an empty batch only
// reports whether the connection takes sends.
func (c Conn) SendBatch(op Opcode, msgs [][]byte) error { return c.sendBatch(op, msgs) }

// Flush waits until every message accepted before the call (Send*,
// SendBatch, SendContext, Ping, Pong) has been handed to the socket:
// written to the kernel (TLS-sealed first for wss). It returns nil then,
// and an error if some of them never will be: the connection's error
// (ErrClosed for a clean close) once it ended, ErrReconnecting when a
// reconnect dropped them (also a drop before the call that no Flush
// reported yet: each drop is reported by one Flush), ctx.Err() wrapped
// when ctx ends first. It sleeps on the same futex as SendContext: no
// polling.
func (c Conn) Flush(ctx context.Context) error { return c.flush(ctx) }

// Ping queues a ping with payload b (at most 125 bytes). It goes out
// ahead of queued data messages (between two frames). It counts against
// MaxSendQueue like a send and returns ErrWouldBlock, ErrClosed and
// ErrPoolClosed as SendText does; before the connection is open Ping and
// Pong return ErrWouldBlock (control frames are not queued for the open,
// only data messages are), and ErrReconnecting in a reconnect gap.
func (c Conn) Ping(b []byte) error { return c.control(cmdPing, b) }

// Pong queues an unsolicited pong with payload b (at most 125 bytes). Pings
// are answered by the loop itself; this is for heartbeats.
func (c Conn) Pong(b []byte) error { return c.control(cmdPong, b) }

// Close starts the close handshake with code and reason (at most 123 bytes
// of UTF-8). The final EventClose (or EventError on timeout) follows
// through Pump. Closing a connection that is still dialing aborts it, as
// Abort does (EventError wrapping ErrAborted, which also matches ErrClosed,
// Code 1006: no close frame is sent).
//
// Close keeps what it accepted: every message Send* accepted before it is
// written first, then the close frame, as gorilla and coder do. The close
// timeout (Config.CloseTimeout, or DialOptions.CloseTimeout) bounds the
// drain of that queue and the wait for the server's close frame;
// messages still queued when it expires are dropped and counted
// (ConnStats.SendDropped, Metrics.SendDropped), and the final event is
// EventError wrapping ErrCloseTimeout with Event.SendDropped set. If the
// server's close frame comes first, what is still queued is dropped (the
// server reads no more) and counted the same way. Once both close frames
// have crossed, the connection ends at the server's TCP end, at the first
// bytes it sends after its close frame, or after 100 ms, whichever comes
// first: a server that keeps writing does not hold Close up. Abort stays
// immediate. From Close on, Send* on c returns ErrClosed, and a second
// Close returns ErrClosed.
func (c Conn) Close(code int, reason string) error {
	if !closeCodeSendable(code) {
		return fmt.Errorf("%w: %d", ErrInvalidCloseCode, code)
	}
	if len(reason) > 123 {
		return ErrControlTooLong
	}
	if !utf8.ValidString(reason) {
		return ErrInvalidUTF8
	}
	return c.closeConn(code, reason)
}

// Abort ends the connection at once: no close handshake, output still
// queued in the loop is dropped and the socket is shut down. The final
// event is EventError wrapping ErrAborted (which also matches ErrClosed;
// Code 1006), whatever the connection was doing (dialing, open, closing). The abort is not held
// behind queued sends. Safe from any goroutine; on a connection that has
// already ended it returns ErrClosed, after Pool.Close ErrClosed or
// ErrPoolClosed.
func (c Conn) Abort() error { return c.abort() }

// Inject feeds b to a connection made by DialMemory as if its server had
// sent it: frames are parsed by the C loop and delivered through Pump.
// Bytes not parsed yet (the pump is behind) count in ConnStats.SendQueued;
// while b would take them past Config.MaxSendQueue, Inject waits for the
// pump (so do not call it from the pumping goroutine with more than that
// outstanding).
func (c Conn) Inject(b []byte) error { return c.inject(b) }

// State returns the connection's current state.
func (c Conn) State() State { return c.state() }

// Stats returns the connection's counters; zero once it has ended.
func (c Conn) Stats() ConnStats { return c.stats() }

// Subprotocol returns the subprotocol the server agreed to, or "".
func (c Conn) Subprotocol() string { return c.subprotocol() }

func closeCodeSendable(code int) bool {
	switch {
	case code >= 1000 && code <= 1003, code >= 1007 && code <= 1014, code >= 3000 && code <= 4999:
		return true
	}
	return false
}

// Command ops of the Go->C command ring (TL_CMD_* in csrc/ring.h, by
// number). The record layout and the producer live in cmdring_linux.go.
const (
	cmdPad    = 0
	cmdDial   = 1
	cmdSend   = 2
	cmdPing   = 3
	cmdPong   = 4
	cmdClose  = 5
	cmdInject = 7
	cmdAbort  = 8
	cmdDirect = 9
)

// Opcode is a WebSocket data opcode as seen by a DataFunc (package ws's
// type: one definition for the library, its parser's reference and the
// tests).
type Opcode = ws.Opcode

// Data opcodes (RFC 6455 section 5.2). Control frames never reach a DataFunc.
const (
	OpText   = ws.OpText
	OpBinary = ws.OpBinary
)

// EventKind says what an Event reports.
type EventKind uint8

// Event kinds. EventClose and EventError are final: no event for the same
// Conn follows them and the Conn handle is dead afterwards. Every other
// kind, EventReconnecting included, leaves the handle live.
const (
	EventOpen   EventKind = 1 // the upgrade completed; Payload holds the agreed subprotocol
	EventText   EventKind = 2 // a complete text message (valid UTF-8)
	EventBinary EventKind = 3 // a complete binary message
	EventPing   EventKind = 4 // a ping arrived; the pong was already sent by the loop
	EventPong   EventKind = 5 // a pong arrived
	EventClose  EventKind = 6 // the close handshake completed; Code and Reason are the peer's
	EventError  EventKind = 7 // the connection failed; Err says why, Code is the close code used
	// EventReconnecting is not final: a connection with a ReconnectPolicy
	// dropped (or an attempt failed) and the loop re-dials after Delay.
	// Err says why; for a close by the server, Code and Reason are its.
	EventReconnecting EventKind = 8
)

var eventKindNames = [...]string{"", "open", "text", "binary", "ping", "pong", "close", "error", "reconnecting"}

// String returns the kind's lower-case name.
func (k EventKind) String() string {
	if int(k) < len(eventKindNames) && k != 0 {
		return eventKindNames[k]
	}
	return fmt.Sprintf("event(%d)", uint8(k))
}

// Event is one thing that happened on a connection. Payload (and Reason,
// which aliases it for EventClose) points into memory owned by the C loop:
// it is valid only until the callback that received the Event returns. Copy
// it to keep it.
type Event struct {
	Kind    EventKind
	Payload []byte
	Code    int    // close code for EventClose and EventError (0 when none applies)
	Reason  []byte // close reason for EventClose; aliases loop memory like Payload
	Err     error  // non-nil exactly for EventError and EventReconnecting; use errors.Is with the Err* sentinels
	// Delay is the wait before the next attempt (EventReconnecting).
	Delay time.Duration
	// Reconnects counts the handle's successful re-opens (EventOpen): 0 on
	// the first open, n after the nth reconnect.
	Reconnects int
	// SendDropped, on EventClose, EventError and EventReconnecting, counts
	// the messages accepted for sending that never reached the socket
	// since the previous such event of the handle (ConnStats.SendDropped).
	// When it is not 0 on an EventError, Err says so too.
	SendDropped uint64
}

// DataFunc receives one complete data message. payload is valid only until
// the function returns.
type DataFunc func(c Conn, op Opcode, payload []byte)

// EventFunc receives every event of every connection of a Pool. ev.Payload is
// valid only until the function returns.
type EventFunc func(c Conn, ev Event)

// Stamps are the stage timestamps of one sampled message
// (Config.SampleEvery), in nanoseconds of CLOCK_MONOTONIC: the clock of
// clock_gettime(CLOCK_MONOTONIC) in C and of the monotonic reading Go's
// time.Now carries, so stamps from the C loop and the pump compare
// directly. A zero field was not taken; all are zero when the message was
// not sampled.
//
// For a sampled message CQE <= Plaintext <= Publish <= Callback.
type Stamps struct {
	CQE       int64 // the loop saw the receive completion (for DialMemory: the Inject)
	Plaintext int64 // the bytes reached the frame parser (after TLS decryption for wss)
	Publish   int64 // the event ring's tail store that made the message visible to Go
	Callback  int64 // the pump was about to call the callback
	// wire is the kernel's software receive timestamp, for
	// StageWireToCallback. Always 0 today: the multishot recv the loop
	// uses delivers no control messages, so SO_TIMESTAMPNS cannot reach
	// it (see doc.go, Observability).
	wire int64
}

// Sampled reports whether the message carries stamps.
func (s Stamps) Sampled() bool { return s.CQE != 0 }

// StampedFunc is a DataFunc that also receives the message's stage stamps
// (all zero when it was not sampled). payload is valid only until the
// function returns.
type StampedFunc func(c Conn, op Opcode, payload []byte, st Stamps)

// TLSBackend names the TLS library linked into the C core: "boringssl"
// (default) or "openssl" (build tag talaris_openssl); "" without cgo.
func TLSBackend() string { return tlsBackend() }

// PinCurrentThreadTo locks the calling goroutine to its OS thread and pins
// that thread to cpu.
func PinCurrentThreadTo(cpu int) error { return pinCurrentThreadTo(cpu) }
