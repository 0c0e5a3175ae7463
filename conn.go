package talaris

import (
	"context"
	"fmt"
	"unicode/utf8"
)

// Close codes (RFC 6455 section 7.4.1 and the IANA registry).
const (
	CloseNormal             = 1000
	CloseGoingAway          = 1001
	CloseProtocolError      = 1002
	CloseUnsupportedData    = 1003
	CloseNoStatus           = 1005 // never sent: the close frame carried no code
	CloseAbnormal           = 1006 // never sent: the connection dropped without a close frame
	CloseInvalidPayload     = 1007
	ClosePolicyViolation    = 1008
	CloseMessageTooBig      = 1009
	CloseMandatoryExtension = 1010
	CloseInternalError      = 1011
	CloseServiceRestart     = 1012
	CloseTryAgainLater      = 1013
	CloseBadGateway         = 1014
	CloseTLSHandshake       = 1015 // never sent
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
	Reconnects    uint64 // successful re-opens under a ReconnectPolicy
	// DirectSends counts the messages (of MsgsOut) the sending goroutine
	// wrote to the socket itself (Config.NoDirectSend); DirectHandoffs
	// those of them the socket took only part of, whose rest the loop
	// wrote.
	DirectSends, DirectHandoffs uint64
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
// dial fails. Messages larger than a quarter of Config.CmdRingSize are
// sent as several fragments of one message. Under a ReconnectPolicy,
// from EventReconnecting to the next open it returns an error matching
// ErrWouldBlock (not counted in SendQueueFull) and queues nothing; a
// message that raced the drop is dropped, never sent on the next
// connection (DialOptions.Subscribe is what every new connection gets).
// With Config.InlineLoop, from a goroutine other than the Pool's, it also
// returns ErrWouldBlock (counted) when the command ring is full until
// that goroutine runs the loop again.
func (c Conn) SendText(b []byte) error { return c.send(OpText, b) }

// SendBinary queues b as one binary message, like SendText.
func (c Conn) SendBinary(b []byte) error { return c.send(OpBinary, b) }

// SendContext queues b as one message of opcode op (OpText or OpBinary),
// waiting while the connection's send queue is too full to take it (see
// SendText). It returns nil once b is queued, ctx.Err() wrapped when ctx
// ends first (errors.Is(err, context.DeadlineExceeded)), ErrClosed when
// the connection ends or is closed meanwhile, ErrPoolClosed when the Pool
// is. The wait sleeps on a futex the loop signals as queued bytes reach
// the socket: no polling. Under a ReconnectPolicy it also waits through
// a reconnect gap: b goes out on the next connection, after Subscribe.
func (c Conn) SendContext(ctx context.Context, op Opcode, b []byte) error {
	return c.sendContext(ctx, op, b)
}

// Ping queues a ping with payload b (at most 125 bytes). It goes out
// ahead of queued data messages (between two frames). It counts against
// MaxSendQueue like a send and returns ErrWouldBlock, ErrClosed and
// ErrPoolClosed as SendText does; before the connection is open (and in a
// reconnect gap) Ping and Pong return ErrWouldBlock: control frames are not
// queued for the open, only data messages are.
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
// Close never waits behind queued data: the close frame goes out after
// the bytes already handed to the socket's out buffers (at most about
// 256 KiB, and a message already partly written is finished first, so
// fragments never interleave); queued messages not yet started are
// dropped. Config.CloseTimeout bounds the handshake. From Close on, Send*
// on c returns ErrClosed, and a second Close returns ErrClosed.
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
