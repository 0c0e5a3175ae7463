package ws

import "strconv"

// Opcode is a WebSocket frame opcode (RFC 6455 section 5.2), a 4-bit value.
type Opcode uint8

// Frame opcodes defined by RFC 6455.
const (
	OpContinuation Opcode = 0x0 // continuation of a fragmented message
	OpText         Opcode = 0x1 // first frame of a text message
	OpBinary       Opcode = 0x2 // first frame of a binary message
	OpClose        Opcode = 0x8 // close control frame
	OpPing         Opcode = 0x9 // ping control frame
	OpPong         Opcode = 0xA // pong control frame
)

// IsControl reports whether op is a control opcode (0x8 to 0xF, including
// the reserved ones).
func (op Opcode) IsControl() bool { return op&0x8 != 0 }

// IsData reports whether op is a data opcode (0x0 to 0x7, including the
// reserved ones).
func (op Opcode) IsData() bool { return op&0x8 == 0 }

// IsReserved reports whether op is one of the reserved opcodes 0x3-0x7 and
// 0xB-0xF, or does not fit in four bits.
func (op Opcode) IsReserved() bool {
	switch op {
	case OpContinuation, OpText, OpBinary, OpClose, OpPing, OpPong:
		return false
	}
	return true
}

// String returns the opcode's name, or "Opcode(0xN)" for reserved values.
func (op Opcode) String() string {
	switch op {
	case OpContinuation:
		return "continuation"
	case OpText:
		return "text"
	case OpBinary:
		return "binary"
	case OpClose:
		return "close"
	case OpPing:
		return "ping"
	case OpPong:
		return "pong"
	}
	return "Opcode(0x" + strconv.FormatUint(uint64(op), 16) + ")"
}

// Close status codes (RFC 6455 section 7.4.1 and the IANA registry).
const (
	CloseNormal             = 1000 // normal closure
	CloseGoingAway          = 1001 // endpoint going away
	CloseProtocolError      = 1002 // protocol error
	CloseUnsupportedData    = 1003 // data type cannot be accepted
	CloseReserved1004       = 1004 // reserved, never on the wire
	CloseNoStatus           = 1005 // no status code present; never on the wire
	CloseAbnormal           = 1006 // closed without a close frame; never on the wire
	CloseInvalidPayload     = 1007 // invalid payload data, e.g. bad UTF-8
	ClosePolicyViolation    = 1008 // policy violation
	CloseMessageTooBig      = 1009 // message too big
	CloseMandatoryExtension = 1010 // client expected an extension
	CloseInternalError      = 1011 // unexpected server condition
	CloseServiceRestart     = 1012 // service restart
	CloseTryAgainLater      = 1013 // try again later
	CloseBadGateway         = 1014 // bad gateway
	CloseTLSHandshake       = 1015 // TLS handshake failure; never on the wire
)

// ValidReceivedCloseCode reports whether code may appear in a close frame
// received from a peer: 1000-1003, 1007-1014 and 3000-4999. The codes
// 0-999, 1004-1006, 1015, 1016-2999 and 5000 and above are invalid and must
// fail the connection with CloseProtocolError.
func ValidReceivedCloseCode(code int) bool {
	switch {
	case code >= 1000 && code <= 1003:
		return true
	case code >= 1007 && code <= 1014:
		return true
	case code >= 3000 && code <= 4999:
		return true
	}
	return false
}
