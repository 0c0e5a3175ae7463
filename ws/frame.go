package ws

import (
	"encoding/binary"
	"errors"
)

// Errors about message payloads, returned by [ParseClosePayload] and
// [Parser].
var (
	// ErrInvalidUTF8 reports a text message or close reason that is not
	// valid UTF-8 (close code 1007).
	ErrInvalidUTF8 = errors.New("ws: invalid UTF-8 in text payload")
	// ErrInvalidClosePayload reports a close payload of exactly one byte
	// (close code 1002).
	ErrInvalidClosePayload = errors.New("ws: close payload of one byte")
	// ErrInvalidCloseCode reports a close code that may not appear on the
	// wire (close code 1002); see ValidReceivedCloseCode.
	ErrInvalidCloseCode = errors.New("ws: invalid close code")
)

// AppendFrame appends a whole unmasked frame, as a server sends it, to dst
// and returns the extended slice. op is written as given (reserved opcodes
// and over-long control frames are expressible).
func AppendFrame(dst []byte, fin bool, op Opcode, payload []byte) []byte {
	dst = AppendHeader(dst, Header{Fin: fin, Op: op, Length: uint64(len(payload))})
	return append(dst, payload...)
}

// AppendMaskedFrame appends a whole frame masked with key, as a client sends
// it, to dst and returns the extended slice. payload is not modified.
func AppendMaskedFrame(dst []byte, fin bool, op Opcode, key [4]byte, payload []byte) []byte {
	dst = AppendHeader(dst, Header{Fin: fin, Op: op, Masked: true, Mask: key, Length: uint64(len(payload))})
	start := len(dst)
	dst = append(dst, payload...)
	Mask(key, dst[start:], 0)
	return dst
}

// ClosePayload returns the body of a close frame: the code as two big-endian
// bytes followed by reason. A code of 0 (or CloseNoStatus with an empty
// reason) gives an empty body. The code and reason are not validated, so
// hostile test servers can send invalid ones.
func ClosePayload(code int, reason string) []byte {
	if code == 0 || (code == CloseNoStatus && reason == "") {
		return []byte{}
	}
	p := make([]byte, 2, 2+len(reason))
	binary.BigEndian.PutUint16(p, uint16(code))
	return append(p, reason...)
}

// ParseClosePayload decodes a received close frame body. An empty body
// yields CloseNoStatus (1005) and no reason. A one-byte body is
// ErrInvalidClosePayload, a code ValidReceivedCloseCode rejects is
// ErrInvalidCloseCode, and a reason that is not valid UTF-8 is
// ErrInvalidUTF8. reason aliases p.
func ParseClosePayload(p []byte) (code int, reason []byte, err error) {
	switch len(p) {
	case 0:
		return CloseNoStatus, nil, nil
	case 1:
		return 0, nil, ErrInvalidClosePayload
	}
	code = int(binary.BigEndian.Uint16(p))
	if !ValidReceivedCloseCode(code) {
		return code, nil, ErrInvalidCloseCode
	}
	reason = p[2:]
	if !ValidUTF8(reason) {
		return code, nil, ErrInvalidUTF8
	}
	return code, reason, nil
}
