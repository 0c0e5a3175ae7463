// Package testhook gives the repository's test module (tests/) a view of
// package talaris state that the public API deliberately does not show.
// Being internal, nothing outside this repository can import it; keep it
// to what a black-box test cannot observe otherwise.
package testhook

// NoTLSRecordLayer, when set before a Pool is made, gives it
// Config.Tuning.NoTLSRecordLayer whatever its Config says: the test
// suite's TestMain sets it for its pass with the library's SSL_read only
// (TALARIS_TEST_NO_TLSREC=1), so every TLS test also runs without the own
// record layer and AES-GCM.
var NoTLSRecordLayer bool

// PumpClaim returns the state of a *talaris.Pool's pump claim: 0 nobody
// pumps, 1 a goroutine is inside a Pump call, 2 the pool was closed and
// freed, 3 a failed Dial passes its connection's last events. Package talaris sets it (linux and cgo only; nil elsewhere).
var PumpClaim func(pool any) int32

// Where a payload handed to a callback lies (PayloadOrigin).
const (
	OriginOther     = 0 // none of the below
	OriginArena     = 1 // copied into the event arena
	OriginSlot      = 2 // in place, in a receive slot (ws://)
	OriginPlaintext = 3 // in place, in a TLS plaintext slot (wss://)
)

// PayloadOrigin says where payload b of an event of *talaris.Pool pool
// lies (an Origin* value): which delivery path it took. Call it inside
// the callback that got b. One cgo call: tests only. Package talaris sets
// it (linux and cgo only; nil elsewhere).
var PayloadOrigin func(pool any, b []byte) int

// OwnGCM says whether this CPU runs talaris' own AES-GCM (csrc/crypto/gcm.h:
// VAES and VPCLMULQDQ), which the TLS record layer then uses unless
// Config.Tuning.NoOwnGCM. Package talaris sets it (linux and cgo only; nil
// elsewhere).
var OwnGCM func() bool

// DirectSends returns how many messages of a talaris.Conn conn the
// sending goroutine wrote to the socket itself (a direct send: ws://,
// unless Knobs.NoDirectSend), and how many of those the socket
// took only part of, whose rest the loop wrote; handoffs <= sends. Both
// are 0 once the connection ended. Package talaris sets it (linux and cgo
// only; nil elsewhere).
var DirectSends func(conn any) (sends, handoffs uint64)

// ConnLoop returns the index of the loop thread (Config.Loops) that serves
// connection slot slot of *talaris.Pool pool. Package talaris sets it
// (linux and cgo only; nil elsewhere).
var ConnLoop func(pool any, slot int) int
