package ws

import (
	"crypto/rand"
	"crypto/sha1"
	"encoding/base64"
)

// acceptGUID is the fixed GUID of RFC 6455 section 1.3.
const acceptGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// AcceptKey returns the Sec-WebSocket-Accept value for the client's
// Sec-WebSocket-Key: base64(SHA-1(key + GUID)).
func AcceptKey(key string) string {
	h := sha1.New()
	h.Write([]byte(key))
	h.Write([]byte(acceptGUID))
	return base64.StdEncoding.EncodeToString(h.Sum(nil))
}

// NewKey returns a fresh Sec-WebSocket-Key: 16 bytes from crypto/rand,
// base64 encoded (24 characters).
func NewKey() string {
	var b [16]byte
	rand.Read(b[:]) // never returns an error (it crashes the program instead)
	return base64.StdEncoding.EncodeToString(b[:])
}
