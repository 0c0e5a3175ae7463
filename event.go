package talaris

import (
	"fmt"
	"time"
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
	// Wire is the kernel's software receive timestamp. Always 0 today:
	// the multishot recv the loop uses delivers no control messages, so
	// SO_TIMESTAMPNS cannot reach it (see doc.go, Observability).
	Wire int64
}

// Sampled reports whether the message carries stamps.
func (s Stamps) Sampled() bool { return s.CQE != 0 }

// StampedFunc is a DataFunc that also receives the message's stage stamps
// (all zero when it was not sampled). payload is valid only until the
// function returns.
type StampedFunc func(c Conn, op Opcode, payload []byte, st Stamps)
