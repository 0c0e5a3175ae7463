package talaris

import (
	"errors"
	"syscall"
	"testing"
)

// TestConnErrorCategories checks that a ConnError matches its cause and the
// cause's category whether the loop made it (makeErr) or a user built it
// by hand (a test double of a dial's error, say), and nothing else.
func TestConnErrorCategories(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		match    []error
		mismatch []error
	}{
		{"loop tls expired", makeErr(cErrTLS, cTLSExpired, 0, "certificate expired"),
			[]error{ErrTLSExpired, ErrTLS}, []error{ErrHandshake, ErrTLSHostname, ErrClosed}},
		{"hand-built tls expired", &ConnError{Cause: ErrTLSExpired},
			[]error{ErrTLSExpired, ErrTLS}, []error{ErrHandshake, ErrTLSHostname}},
		{"loop bad status", makeErr(cErrHTTP, cHTTPStatus, 503, "503 Service Unavailable"),
			[]error{ErrBadStatus, ErrHandshake}, []error{ErrTLS, ErrBadAccept}},
		{"hand-built bad accept", &ConnError{Cause: ErrBadAccept},
			[]error{ErrBadAccept, ErrHandshake}, []error{ErrTLS, ErrBadStatus}},
		{"loop tls, unknown aux", makeErr(cErrTLS, 99, 0, ""),
			[]error{ErrTLS}, []error{ErrHandshake, ErrTLSExpired}},
		{"loop aborted", makeErr(cErrAborted, 0, 0, ""),
			[]error{ErrAborted, ErrClosed}, []error{ErrTLS, ErrHandshake}},
		{"loop lost with errno", makeErr(cErrLost, int32(syscall.ECONNRESET), 1006, "recv"),
			[]error{ErrConnectionLost, syscall.ECONNRESET}, []error{ErrTLS, ErrClosed, syscall.ECONNREFUSED}},
		{"hand-built timeout", &ConnError{Cause: ErrTimeout},
			[]error{ErrTimeout}, []error{ErrTLS, ErrHandshake, ErrClosed}},
	} {
		for _, m := range tc.match {
			if !errors.Is(tc.err, m) {
				t.Errorf("%s: errors.Is(%v, %v) = false, want true", tc.name, tc.err, m)
			}
		}
		for _, m := range tc.mismatch {
			if errors.Is(tc.err, m) {
				t.Errorf("%s: errors.Is(%v, %v) = true, want false", tc.name, tc.err, m)
			}
		}
	}
}
