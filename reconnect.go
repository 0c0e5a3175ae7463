package talaris

import (
	"encoding/binary"
	"fmt"
	"time"
	"unicode/utf8"
)

// ReconnectPolicy makes a connection re-dial by itself after it drops
// (DialOptions.Reconnect). The C loop waits out the backoff on a timer of
// its own (no goroutine per connection) and re-dials the same slot, so the
// Conn handle stays valid across reconnects:
//
//   - A drop (an error, a timeout, the server's close frame) delivers
//     EventReconnecting instead of a final event: Err says why (for a
//     close by the server, a ConnError wrapping ErrClosed with the
//     server's Code and Reason) and Delay is the wait before the next
//     attempt. It is not final: the handle stays owned by the caller.
//   - Every open delivers EventOpen; Event.Reconnects counts the
//     successful re-opens (0 on the first open, 1 after the first
//     reconnect, and so on: attempts that failed do not count).
//   - Attempts that fail deliver EventReconnecting too, with the next
//     delay.
//   - The wait before attempt n+1 (n = attempts since the last open, 0
//     right after a drop) is chosen uniformly in [MinDelay,
//     min(MaxDelay, MinDelay·2^n)] (exponential backoff, full jitter
//     above the floor). A 429 or 503 upgrade reply with a Retry-After in
//     seconds waits at least that long.
//   - MaxAttempts bounds the attempts without an open (the first dial
//     counts as one): when they are used up, the last error is the final
//     EventError. A connection that opened gets a fresh series.
//   - Conn.Close and Conn.Abort stop the reconnecting: during the backoff
//     wait either ends the handle at once with a final EventError wrapping
//     ErrAborted (which also matches ErrClosed). Pool.Close ends every
//     handle.
//   - Causes no retry can cure end the handle at once: Close, Abort,
//     Pool.Close, an unreadable CA file, out of memory.
//
// Dial with a policy returns once the connection is open or the policy
// gave up (its ctx bounds the whole wait; cancelling it stops the
// attempts). Without a policy a dial makes exactly one attempt.
//
// Sends during the gap: from the EventReconnecting until the next open,
// SendText, SendBinary, Ping and Pong return an error matching
// ErrWouldBlock (not counted as a full queue) and nothing is queued;
// SendContext waits for the re-open (or its ctx). DialOptions.Subscribe is
// the way to have messages sent on every new connection (the loop sends
// them right after the upgrade, before any user message). A message sent
// while the drop is still unnoticed goes to the old socket or is dropped
// by the loop (with what the old connection had not sent yet): it is
// never sent on a later connection or a half-open one.
type ReconnectPolicy struct {
	MinDelay    time.Duration // first wait and floor of every wait (100ms)
	MaxDelay    time.Duration // cap of the exponential growth (30s, at least MinDelay); at most 24h
	MaxAttempts int           // attempts without an open before giving up; 0: forever
}

// Reconnect defaults and bounds (the Config defaults table is in config.go).
var defaultReconnect = ReconnectPolicy{MinDelay: 100 * time.Millisecond, MaxDelay: 30 * time.Second}

const (
	maxReconnectDelay = 24 * time.Hour
	maxSubscribeBytes = 1 << 20 // all Subscribe messages together
)

// withDefaults returns the policy with zero delays defaulted, or
// ErrInvalidConfig.
func (r ReconnectPolicy) withDefaults() (ReconnectPolicy, error) {
	if r.MinDelay < 0 || r.MaxDelay < 0 || r.MaxAttempts < 0 {
		return r, fmt.Errorf("%w: ReconnectPolicy fields must not be negative", ErrInvalidConfig)
	}
	if r.MinDelay == 0 {
		r.MinDelay = defaultReconnect.MinDelay
	}
	if r.MaxDelay == 0 {
		r.MaxDelay = max(defaultReconnect.MaxDelay, r.MinDelay)
	}
	if r.MaxDelay < r.MinDelay || r.MaxDelay > maxReconnectDelay {
		return r, fmt.Errorf("%w: ReconnectPolicy needs MinDelay <= MaxDelay <= 24h", ErrInvalidConfig)
	}
	return r, nil
}

// subscribeBlob validates DialOptions.Subscribe (UTF-8 text, 1 MiB in all)
// and packs it for the C loop: each message as a 4-byte host-order length
// and its bytes.
func subscribeBlob(msgs [][]byte) (string, error) {
	n := 0
	for _, m := range msgs {
		if !utf8.Valid(m) {
			return "", fmt.Errorf("%w: in DialOptions.Subscribe", ErrInvalidUTF8)
		}
		n += 4 + len(m)
	}
	if n > maxSubscribeBytes {
		return "", fmt.Errorf("%w: DialOptions.Subscribe holds more than %d bytes", ErrInvalidConfig, maxSubscribeBytes)
	}
	if n == 0 {
		return "", nil
	}
	b := make([]byte, 0, n)
	for _, m := range msgs {
		b = binary.NativeEndian.AppendUint32(b, uint32(len(m)))
		b = append(b, m...)
	}
	return string(b), nil
}
