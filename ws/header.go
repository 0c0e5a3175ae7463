package ws

import (
	"encoding/binary"
	"errors"
)

// Header is a decoded WebSocket frame header.
type Header struct {
	Fin    bool    // final fragment of a message
	Rsv    uint8   // RSV bits: bit 2 is RSV1, bit 1 RSV2, bit 0 RSV3
	Op     Opcode  // opcode (4 bits)
	Masked bool    // payload is masked with Mask
	Mask   [4]byte // masking key; meaningful only when Masked
	Length uint64  // payload length in bytes
}

// MaxHeaderLen is the longest possible frame header: 2 bytes, an 8-byte
// extended length and a 4-byte masking key.
const MaxHeaderLen = 14

// Errors returned by [ParseHeader]. Each is a protocol error (close code
// 1002).
var (
	ErrReservedBits        = errors.New("ws: reserved bits set without a negotiated extension")
	ErrReservedOpcode      = errors.New("ws: reserved opcode")
	ErrMaskedServerFrame   = errors.New("ws: masked frame from server")
	ErrUnmaskedClientFrame = errors.New("ws: unmasked frame from client")
	ErrFragmentedControl   = errors.New("ws: fragmented control frame")
	ErrControlTooLong      = errors.New("ws: control frame payload longer than 125 bytes")
	ErrLength63            = errors.New("ws: most significant bit of 64-bit payload length set")
)

// ParseHeader decodes the frame header at the start of b.
//
// fromServer selects the direction: true applies the rules of a client
// reading server frames (a masked frame is an error, ErrMaskedServerFrame),
// false those of a server reading client frames (an unmasked frame is an
// error, ErrUnmaskedClientFrame). In both directions RSV bits
// (ErrReservedBits; no extension is ever negotiated), reserved opcodes
// (ErrReservedOpcode), non-final control frames (ErrFragmentedControl),
// control payloads over 125 bytes (ErrControlTooLong) and 64-bit lengths with
// the most significant bit set (ErrLength63) are rejected. Non-minimal length
// encodings are accepted (see the package documentation).
//
// On success n is the header length (2 to 14) and the payload starts at
// b[n:]. If b holds an incomplete header and no error can be detected yet,
// ParseHeader returns n == 0 and a nil error: call again with more bytes.
// Errors are reported as early as the bytes allow: every error except
// ErrLength63 needs only the first two bytes, ErrLength63 the third.
// The checks run in the order listed above, so a frame breaking several
// rules always yields the same error.
func ParseHeader(b []byte, fromServer bool) (h Header, n int, err error) {
	if len(b) < 2 {
		return Header{}, 0, nil
	}
	b0, b1 := b[0], b[1]
	h.Fin = b0&0x80 != 0
	h.Rsv = (b0 >> 4) & 0x7
	h.Op = Opcode(b0 & 0xF)
	h.Masked = b1&0x80 != 0
	len7 := b1 & 0x7F

	switch {
	case h.Rsv != 0:
		return Header{}, 0, ErrReservedBits
	case h.Op.IsReserved():
		return Header{}, 0, ErrReservedOpcode
	case fromServer && h.Masked:
		return Header{}, 0, ErrMaskedServerFrame
	case !fromServer && !h.Masked:
		return Header{}, 0, ErrUnmaskedClientFrame
	case h.Op.IsControl() && !h.Fin:
		return Header{}, 0, ErrFragmentedControl
	case h.Op.IsControl() && len7 > 125:
		return Header{}, 0, ErrControlTooLong
	case len7 == 127 && len(b) > 2 && b[2]&0x80 != 0:
		return Header{}, 0, ErrLength63
	}

	n = 2
	switch len7 {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if h.Masked {
		n += 4
	}
	if len(b) < n {
		return Header{}, 0, nil
	}
	switch len7 {
	case 126:
		h.Length = uint64(binary.BigEndian.Uint16(b[2:4]))
	case 127:
		h.Length = binary.BigEndian.Uint64(b[2:10])
	default:
		h.Length = uint64(len7)
	}
	if h.Masked {
		copy(h.Mask[:], b[n-4:n])
	}
	return h, n, nil
}

// HeaderLen returns the number of bytes AppendHeader writes for h.
func HeaderLen(h Header) int {
	n := 2 + lenBytes(h.Length)
	if h.Masked {
		n += 4
	}
	return n
}

// lenBytes returns the size of the minimal extended length field.
func lenBytes(length uint64) int {
	switch {
	case length <= 125:
		return 0
	case length <= 0xFFFF:
		return 2
	}
	return 8
}

// AppendHeader appends the encoding of h to dst using the minimal length
// encoding and returns the extended slice. Fields are written as given,
// without validation: reserved opcodes, RSV bits and invalid control frames
// can be expressed. Only the low four bits of Op and low three bits of Rsv
// are used.
func AppendHeader(dst []byte, h Header) []byte {
	return AppendHeaderLen(dst, h, lenBytes(h.Length))
}

// AppendHeaderLen is like [AppendHeader] but forces the extended length
// field to be lenBytes long: 0 (7-bit length), 2 (16-bit) or 8 (64-bit).
// This expresses non-minimal encodings (AppendHeaderLen(dst, h, 8) with
// Length 5) and lengths of 2^63 and more, which a valid peer never sends.
// It panics if lenBytes is not 0, 2 or 8, or Length does not fit the chosen
// field (over 125 for 0, over 65535 for 2).
func AppendHeaderLen(dst []byte, h Header, lenBytes int) []byte {
	b0 := byte(h.Op & 0xF)
	b0 |= (h.Rsv & 0x7) << 4
	if h.Fin {
		b0 |= 0x80
	}
	var b1 byte
	if h.Masked {
		b1 = 0x80
	}
	switch lenBytes {
	case 0:
		if h.Length > 125 {
			panic("ws: AppendHeaderLen: length does not fit a 7-bit length")
		}
		dst = append(dst, b0, b1|byte(h.Length))
	case 2:
		if h.Length > 0xFFFF {
			panic("ws: AppendHeaderLen: length does not fit a 16-bit length")
		}
		dst = append(dst, b0, b1|126)
		dst = binary.BigEndian.AppendUint16(dst, uint16(h.Length))
	case 8:
		dst = append(dst, b0, b1|127)
		dst = binary.BigEndian.AppendUint64(dst, h.Length)
	default:
		panic("ws: AppendHeaderLen: lenBytes must be 0, 2 or 8")
	}
	if h.Masked {
		dst = append(dst, h.Mask[:]...)
	}
	return dst
}
