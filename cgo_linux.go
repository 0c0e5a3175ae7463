//go:build linux && cgo

package talaris

// The package's one cgo preamble with build flags: the C core is compiled
// from talaris_core.c with these flags (and csrc_hash.go's fingerprint).
// The other cgo files only #include the headers they read.

/*
#cgo CFLAGS: -O2 -std=gnu11 -Wall
#cgo amd64,!talaris_openssl CFLAGS: -I/usr/include/android
#cgo amd64,!talaris_openssl LDFLAGS: -L/usr/lib/x86_64-linux-gnu/android -Wl,-rpath,/usr/lib/x86_64-linux-gnu/android -lssl -lcrypto
#cgo arm64,!talaris_openssl CFLAGS: -I/usr/include/android
#cgo arm64,!talaris_openssl LDFLAGS: -L/usr/lib/aarch64-linux-gnu/android -Wl,-rpath,/usr/lib/aarch64-linux-gnu/android -lssl -lcrypto
#cgo talaris_openssl LDFLAGS: -lssl -lcrypto
#cgo LDFLAGS: -l:liburing.a -lpthread
#include <stdlib.h>
#include <string.h>
#include "csrc/talaris.h"
#include "csrc/http.h"
*/
import "C"

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// The C codes mirrored in errors.go and conn.go: each pair of array types
// has a negative length, and fails to compile, unless the two sides are
// equal.
type (
	_ [C.TL_E_NONE - cErrNone]byte
	_ [cErrNone - C.TL_E_NONE]byte
	_ [C.TL_E_DIAL - cErrDial]byte
	_ [cErrDial - C.TL_E_DIAL]byte
	_ [C.TL_E_TIMEOUT - cErrTimeout]byte
	_ [cErrTimeout - C.TL_E_TIMEOUT]byte
	_ [C.TL_E_HTTP - cErrHTTP]byte
	_ [cErrHTTP - C.TL_E_HTTP]byte
	_ [C.TL_E_PROTOCOL - cErrProtocol]byte
	_ [cErrProtocol - C.TL_E_PROTOCOL]byte
	_ [C.TL_E_UTF8 - cErrUTF8]byte
	_ [cErrUTF8 - C.TL_E_UTF8]byte
	_ [C.TL_E_TOO_BIG - cErrTooBig]byte
	_ [cErrTooBig - C.TL_E_TOO_BIG]byte
	_ [C.TL_E_LOST - cErrLost]byte
	_ [cErrLost - C.TL_E_LOST]byte
	_ [C.TL_E_CLOSE_TIMEOUT - cErrCloseTimeout]byte
	_ [cErrCloseTimeout - C.TL_E_CLOSE_TIMEOUT]byte
	_ [C.TL_E_TLS - cErrTLS]byte
	_ [cErrTLS - C.TL_E_TLS]byte
	_ [C.TL_E_ABORTED - cErrAborted]byte
	_ [cErrAborted - C.TL_E_ABORTED]byte
	_ [C.TL_E_SHUTDOWN - cErrShutdown]byte
	_ [cErrShutdown - C.TL_E_SHUTDOWN]byte
	_ [C.TL_E_READ_TIMEOUT - cErrReadTimeout]byte
	_ [cErrReadTimeout - C.TL_E_READ_TIMEOUT]byte
	_ [C.TL_CMD_ABORT - cmdAbort]byte
	_ [cmdAbort - C.TL_CMD_ABORT]byte
	_ [C.TL_CMD_DIRECT - cmdDirect]byte
	_ [cmdDirect - C.TL_CMD_DIRECT]byte

	_ [C.TL_TLS_UNKNOWN_CA - cTLSUnknownCA]byte
	_ [cTLSUnknownCA - C.TL_TLS_UNKNOWN_CA]byte
	_ [C.TL_TLS_HOSTNAME - cTLSHostname]byte
	_ [cTLSHostname - C.TL_TLS_HOSTNAME]byte
	_ [C.TL_TLS_EXPIRED - cTLSExpired]byte
	_ [cTLSExpired - C.TL_TLS_EXPIRED]byte
	_ [C.TL_TLS_ALPN - cTLSALPN]byte
	_ [cTLSALPN - C.TL_TLS_ALPN]byte
	_ [C.TL_TLS_NOT_TLS - cTLSNotTLS]byte
	_ [cTLSNotTLS - C.TL_TLS_NOT_TLS]byte
	_ [C.TL_TLS_PIN - cTLSPin]byte
	_ [cTLSPin - C.TL_TLS_PIN]byte

	_ [C.TL_HTTP_ERR_TOO_LARGE - cHTTPTooLarge]byte
	_ [cHTTPTooLarge - C.TL_HTTP_ERR_TOO_LARGE]byte
	_ [C.TL_HTTP_ERR_STATUS - cHTTPStatus]byte
	_ [cHTTPStatus - C.TL_HTTP_ERR_STATUS]byte
	_ [C.TL_HTTP_ERR_ACCEPT - cHTTPAccept]byte
	_ [cHTTPAccept - C.TL_HTTP_ERR_ACCEPT]byte
	_ [C.TL_HTTP_ERR_PROTOCOL - cHTTPProtocol]byte
	_ [cHTTPProtocol - C.TL_HTTP_ERR_PROTOCOL]byte
	_ [C.TL_HTTP_ERR_EXTENSION - cHTTPExtension]byte
	_ [cHTTPExtension - C.TL_HTTP_ERR_EXTENSION]byte
)

func tlsBackend() string { return C.GoString(C.tl_tls_backend()) }

func pinCurrentThreadTo(cpu int) error {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("talaris: pin to CPU %d: %w", cpu, err)
	}
	return nil
}
