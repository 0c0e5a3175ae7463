package talaris

import (
	"errors"
	"fmt"
	"net/http"
	"time"
	"unicode/utf8"
)

// Opcode is a WebSocket data opcode as seen by a DataFunc.
type Opcode uint8

// Data opcodes (RFC 6455 section 5.2). Control frames never reach a DataFunc.
const (
	OpText   Opcode = 1
	OpBinary Opcode = 2
)

// String returns "text" or "binary".
func (o Opcode) String() string {
	switch o {
	case OpText:
		return "text"
	case OpBinary:
		return "binary"
	}
	return fmt.Sprintf("opcode(%d)", uint8(o))
}

// EventKind says what an Event reports.
type EventKind uint8

// Event kinds. EventClose and EventError are final: no event for the same
// Conn follows them and the Conn handle is dead afterwards.
const (
	EventOpen   EventKind = 1 // the upgrade completed; Payload holds the agreed subprotocol
	EventText   EventKind = 2 // a complete text message (valid UTF-8)
	EventBinary EventKind = 3 // a complete binary message
	EventPing   EventKind = 4 // a ping arrived; the pong was already sent by the loop
	EventPong   EventKind = 5 // a pong arrived
	EventClose  EventKind = 6 // the close handshake completed; Code and Reason are the peer's
	EventError  EventKind = 7 // the connection failed; Err says why, Code is the close code used
)

var eventKindNames = [...]string{"", "open", "text", "binary", "ping", "pong", "close", "error"}

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
	Err     error  // non-nil exactly for EventError; use errors.Is with the Err* sentinels
}

// DataFunc receives one complete data message. payload is valid only until
// the function returns.
type DataFunc func(c Conn, op Opcode, payload []byte)

// EventFunc receives every event of every connection of a Pool. ev.Payload is
// valid only until the function returns.
type EventFunc func(c Conn, ev Event)

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

// Sentinel errors. Errors returned by this package and Event.Err wrap one
// of these; test with errors.Is.
var (
	ErrUnsupported      = errors.New("talaris: not supported on this platform (needs linux and cgo)")
	ErrClosed           = errors.New("talaris: closed")
	ErrPoolClosed       = errors.New("talaris: pool closed")
	ErrConcurrentPump   = errors.New("talaris: another goroutine is already pumping this pool")
	ErrBadURL           = errors.New("talaris: bad websocket URL")
	ErrTooManyConns     = errors.New("talaris: pool is at its connection limit")
	ErrDial             = errors.New("talaris: TCP connect failed")
	ErrResolve          = errors.New("talaris: host name lookup failed")
	ErrTimeout          = errors.New("talaris: timed out")
	ErrHandshake        = errors.New("talaris: websocket upgrade refused or malformed")
	ErrBadStatus        = errors.New("talaris: upgrade response status is not 101")
	ErrBadAccept        = errors.New("talaris: Sec-WebSocket-Accept does not match the key")
	ErrBadSubprotocol   = errors.New("talaris: server chose a subprotocol that was not offered")
	ErrBadExtension     = errors.New("talaris: server enabled an extension that was not offered")
	ErrHeaderTooLarge   = errors.New("talaris: upgrade response headers too large")
	ErrProtocol         = errors.New("talaris: websocket protocol violation by the peer")
	ErrInvalidUTF8      = errors.New("talaris: invalid UTF-8 in a text message or close reason")
	ErrMessageTooBig    = errors.New("talaris: message exceeds the maximum message size")
	ErrConnectionLost   = errors.New("talaris: connection lost without a close frame")
	ErrCloseTimeout     = errors.New("talaris: close handshake timed out")
	ErrTLS              = errors.New("talaris: TLS failure")
	ErrTLSUnknownCA     = errors.New("talaris: TLS certificate signed by an unknown authority")
	ErrTLSHostname      = errors.New("talaris: TLS certificate does not match the host name")
	ErrTLSExpired       = errors.New("talaris: TLS certificate expired or not yet valid")
	ErrTLSALPN          = errors.New("talaris: TLS ALPN negotiation did not select http/1.1")
	ErrTLSNotTLS        = errors.New("talaris: server did not answer with TLS")
	ErrInvalidCloseCode = errors.New("talaris: close code may not be sent")
	ErrControlTooLong   = errors.New("talaris: control frame payload longer than 125 bytes")
	ErrInvalidConfig    = errors.New("talaris: invalid configuration")
	ErrWouldBlock       = errors.New("talaris: command ring full")
)

// WaitStrategy says how a side waits when it has nothing to do.
type WaitStrategy uint8

const (
	// WaitDefault is WaitBlock on machines with 2 or fewer CPUs, where a
	// spinning loop or pump steals the core the feed (or the other side of
	// the ring) needs, and WaitSpinThenBlock elsewhere.
	WaitDefault WaitStrategy = iota
	// WaitBlock sleeps in the kernel at once.
	WaitBlock
	// WaitSpin never sleeps: lowest latency, one core burned.
	WaitSpin
	// WaitSpinThenBlock spins for SpinTime, then sleeps.
	WaitSpinThenBlock
)

// Setup flags for the io_uring instance (Config.RingFlags). They map to the
// kernel's IORING_SETUP_* flags of the same names.
const (
	RingSQPoll       uint32 = 1 << 1
	RingSQAff        uint32 = 1 << 2
	RingCoopTaskrun  uint32 = 1 << 8
	RingTaskrunFlag  uint32 = 1 << 9
	RingSingleIssuer uint32 = 1 << 12
	RingDeferTaskrun uint32 = 1 << 13
	// RingFlagsNone asks for no setup flags at all (a zero RingFlags means
	// the default RingSingleIssuer|RingDeferTaskrun).
	RingFlagsNone uint32 = 1 << 31
)

// Config configures a Pool and its C loop. The zero value is usable; every
// zero field takes the default written beside it.
type Config struct {
	SQEntries  uint32        // io_uring submission queue entries (256)
	CQEntries  uint32        // completion queue entries (4 x SQEntries)
	RingFlags  uint32        // Ring* setup flags (RingSingleIssuer|RingDeferTaskrun)
	SQPollIdle time.Duration // SQPOLL kernel thread idle time before it sleeps (1ms)
	SQPollCPU  int           // CPU for the SQPOLL thread when RingSQAff is set (-1: unpinned)

	BufSize  uint32 // bytes per provided receive buffer (16 KiB); a power of two
	BufCount uint32 // provided receive buffers, a power of two <= 32768 (1024)

	LoopCPU      int           // CPU the loop thread is pinned to; -1 or unset: not pinned
	LoopCPUSet   bool          // LoopCPU is meaningful (so CPU 0 can be chosen)
	LoopWait     WaitStrategy  // how the loop thread waits for work
	ConsumerWait WaitStrategy  // how Pump waits for events
	SpinTime     time.Duration // spin period for WaitSpinThenBlock (50us)

	EventRingSize uint32 // events in the C->Go ring, a power of two (65536)
	ArenaSize     uint64 // bytes of payload arena shared by all connections (64 MiB)
	CmdRingSize   uint32 // bytes of the Go->C command ring, a power of two (4 MiB)

	MaxConns         uint32        // connections a Pool can hold at once (1024)
	MaxMessageSize   uint64        // largest message accepted, else close 1009 (16 MiB)
	HandshakeTimeout time.Duration // TCP+TLS+upgrade limit for a dial (10s)
	CloseTimeout     time.Duration // wait for the peer's close frame and TCP FIN (5s)
	MaxSendQueue     uint64        // bytes queued for one connection's socket before Send returns ErrWouldBlock (64 MiB)
}

// TLSOptions configures certificate verification for wss:// URLs.
// Verification against the system CA store, with SNI and host name check, is
// the default.
type TLSOptions struct {
	RootCAFile         string // PEM file of trusted roots, replaces the system store
	RootCAPEM          []byte // PEM of trusted roots, replaces the system store
	ServerName         string // name sent in SNI and checked in the certificate (default: URL host)
	InsecureSkipVerify bool   // accept any certificate: for tests only
}

// DialOptions configures one connection. A nil *DialOptions means defaults.
type DialOptions struct {
	Header       http.Header // extra request headers (not Upgrade, Connection, Sec-WebSocket-*)
	Subprotocols []string    // offered in Sec-WebSocket-Protocol
	TLS          TLSOptions
	// HandshakeTimeout overrides Config.HandshakeTimeout for this dial.
	HandshakeTimeout time.Duration
}

// State is a connection's lifecycle state.
type State uint32

// Connection states, in order.
const (
	StateIdle       State = 0 // not used (a dead or zero handle)
	StateConnecting State = 1 // TCP connect in progress
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

// ConnStats are a connection's counters, kept by the C loop.
type ConnStats struct {
	MsgsIn, BytesIn   uint64 // data messages and their payload bytes delivered to the ring
	MsgsOut, BytesOut uint64 // data messages and payload bytes sent by Send*
	PingsIn, PongsIn  uint64
	WireIn, WireOut   uint64 // bytes read from and written to the socket
}

// PoolStats are a Pool's counters.
type PoolStats struct {
	Events     uint64 // events published to the ring
	Batches    uint64 // tail publishes (events per batch = Events/Batches)
	CQEs       uint64 // completions handled by the loop
	Rearms     uint64 // multishot recvs re-armed after ending without F_MORE
	NoBufs     uint64 // recvs ended by -ENOBUFS (buffer ring exhausted)
	Stalls     uint64 // times the loop held input back because the ring or arena was full
	LoopWakes  uint64 // times Go woke a sleeping loop
	PumpSleeps uint64 // times Pump slept waiting for events
}

// Conn is a handle to one connection of a Pool. It is a small value: copy
// it, compare it, use it as a map key. A handle whose connection has ended
// (after its EventClose or EventError) is dead: its methods return
// ErrClosed and State returns StateClosed, even if the Pool reuses the
// underlying slot for a new connection.
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
// returns. Safe from any goroutine. It blocks only while the command ring
// is full. Messages larger than a quarter of Config.CmdRingSize are sent
// as several fragments of one message.
func (c Conn) SendText(b []byte) error { return c.send(OpText, b) }

// SendBinary queues b as one binary message, like SendText.
func (c Conn) SendBinary(b []byte) error { return c.send(OpBinary, b) }

// Ping queues a ping with payload b (at most 125 bytes).
func (c Conn) Ping(b []byte) error { return c.control(cmdPing, b) }

// Pong queues an unsolicited pong with payload b (at most 125 bytes). Pings
// are answered by the loop itself; this is for heartbeats.
func (c Conn) Pong(b []byte) error { return c.control(cmdPong, b) }

// Close starts the close handshake with code and reason (at most 123 bytes
// of UTF-8). The final EventClose (or EventError on timeout) follows
// through Pump. Closing a connection that is still dialing aborts it.
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

// Inject feeds b to a connection made by DialMemory as if its server had
// sent it: frames are parsed by the C loop and delivered through Pump.
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

// Pump delivers every pending event of every connection to fn, in order,
// and releases their payload memory when fn has returned for the whole
// batch. It blocks until at least one event was delivered and returns how
// many were. Only one goroutine may pump a Pool at a time; a second gets
// ErrConcurrentPump. After Close it returns ErrPoolClosed.
func (p *Pool) Pump(fn EventFunc) (int, error) { return p.pumpBlocking(fn, nil) }

// PumpData is Pump for data messages only: open, ping, pong, close and
// error events are consumed without a callback (pings were answered by
// the loop already). It blocks until at least one message was delivered.
func (p *Pool) PumpData(fn DataFunc) (int, error) { return p.pumpBlocking(nil, fn) }

// PumpSpin busy-polls the ring up to iters times and delivers the first
// batch it finds; it never sleeps. n == 0 means nothing arrived yet.
func (p *Pool) PumpSpin(iters int, fn DataFunc) (int, error) { return p.pumpOnce(fn, nil, iters) }

// PumpNowait makes one non-blocking pass: it delivers what is pending and
// returns at once.
func (p *Pool) PumpNowait(fn DataFunc) (int, error) { return p.pumpOnce(fn, nil, 1) }

// PumpEventsNowait is PumpNowait for every event kind.
func (p *Pool) PumpEventsNowait(fn EventFunc) (int, error) { return p.pumpOnce(nil, fn, 1) }

// TLSBackend names the TLS library linked into the C core: "boringssl"
// (default) or "openssl" (build tag talaris_openssl); "" without cgo.
func TLSBackend() string { return tlsBackend() }
