// Package ws holds pure-Go building blocks of the WebSocket protocol
// (RFC 6455) used by talaris' tests, test servers, benchmarks and as the
// reference implementation the C frame parser is differentially fuzzed
// against.
//
// Nothing here opens sockets; the package only encodes and decodes bytes.
//
// # Opcodes and close codes
//
// [Opcode] names the frame opcodes; [Opcode.IsControl] and
// [Opcode.IsReserved] classify them. Close status codes are exported as
// constants (CloseNormal, CloseProtocolError, ...) and
// [ValidReceivedCloseCode] implements the RFC 6455 section 7.4 rule for
// codes a peer may put on the wire.
//
// # Frame headers
//
// [ParseHeader] decodes a frame header and enforces the rules a client
// applies to server frames (or, with fromServer false, a server applies to
// client frames): no RSV bits (no extension is ever negotiated), no reserved
// opcodes, correct masking, control frames final and at most 125 bytes, and
// the most significant bit of a 64-bit length clear. Errors are the exported
// sentinels ErrReservedBits, ErrReservedOpcode, ErrMaskedServerFrame,
// ErrUnmaskedClientFrame, ErrFragmentedControl, ErrControlTooLong and
// ErrLength63.
//
// Length policy: non-minimal length encodings (for example a 5-byte payload
// announced with the 16-bit or 64-bit form) are accepted. RFC 6455 section
// 5.2 says the minimal number of bytes "MUST" be used, but section 5.2 gives
// no instruction to fail the connection for it, and major implementations
// accept them. The C parser follows the same policy.
//
// [AppendHeader] always writes the minimal encoding; [AppendHeaderLen]
// forces a given length form so that hostile test servers can express
// non-minimal lengths and lengths of 2^63 and more.
//
// # Masking
//
// [Mask] XORs a buffer with a masking key eight bytes at a time and can be
// resumed at any position of a payload.
//
// # Handshake
//
// [AcceptKey] computes Sec-WebSocket-Accept from Sec-WebSocket-Key and
// [NewKey] makes a random Sec-WebSocket-Key.
//
// # UTF-8
//
// [ValidUTF8] validates a whole text payload. [UTF8Validator] validates a
// stream of fragments and fails as soon as a byte makes the input invalid,
// even in the middle of a code point (F4 90 or ED A0 fail at the second
// byte), as RFC 6455 section 8.1 and the Autobahn suite expect.
//
// # Frames and close payloads
//
// [AppendFrame] and [AppendMaskedFrame] build whole frames;
// [ClosePayload] and [ParseClosePayload] build and check close frame bodies.
//
// # Reference parser
//
// [Parser] is a small, deliberately simple streaming parser for the client
// side of a connection: it reassembles fragmented messages, delivers
// control frames interleaved within them, validates text and close frames,
// and enforces a maximum message size. [CloseCode] maps its errors to the
// close code a client sends when failing the connection (1002, 1007, 1009).
package ws
