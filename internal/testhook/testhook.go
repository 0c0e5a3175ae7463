// Package testhook gives the repository's test module (tests/) a view of
// package talaris state that the public API deliberately does not show.
// Being internal, nothing outside this repository can import it; keep it
// to what a black-box test cannot observe otherwise.
package testhook

// PumpClaim returns the state of a *talaris.Pool's pump claim: 0 nobody
// pumps, 1 a goroutine is inside a Pump call, 2 the pool was closed and
// freed. Package talaris sets it (linux and cgo only; nil elsewhere).
var PumpClaim func(pool any) int32
