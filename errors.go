package talaris

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Sentinel errors. Errors returned by this package and Event.Err wrap one
// of these; test with errors.Is.
var (
	ErrUnsupported    = errors.New("talaris: not supported on this platform (needs linux and cgo)")
	ErrClosed         = errors.New("talaris: closed")
	ErrPoolClosed     = errors.New("talaris: pool closed")
	ErrConcurrentPump = errors.New("talaris: another goroutine is already pumping this pool")
	// ErrNotLoopThread: a Pool with Config.Tuning.InlineLoop is pumped only by
	// the goroutine that created it (its loop runs on that thread).
	ErrNotLoopThread    = errors.New("talaris: an InlineLoop pool is pumped only by the goroutine that called NewPool")
	ErrBadURL           = errors.New("talaris: bad websocket URL")
	ErrTooManyConns     = errors.New("talaris: pool is at its connection limit")
	ErrDial             = errors.New("talaris: TCP connect failed")
	ErrResolve          = errors.New("talaris: host name lookup failed")
	ErrTimeout          = errors.New("talaris: timed out")
	ErrHandshake        = errors.New("talaris: websocket upgrade refused or malformed")
	ErrBadStatus        = errors.New("talaris: upgrade response status is not 101")
	ErrBadAccept        = errors.New("talaris: Sec-WebSocket-Accept does not match the key")
	ErrBadSubprotocol   = errors.New("talaris: server chose a subprotocol that was not offered")
	ErrBadExtension     = errors.New("talaris: server enabled an extension that was not offered")
	ErrHeaderTooLarge   = errors.New("talaris: upgrade response headers too large")
	ErrProtocol         = errors.New("talaris: websocket protocol violation by the peer")
	ErrInvalidUTF8      = errors.New("talaris: invalid UTF-8 in a text message or close reason")
	ErrMessageTooBig    = errors.New("talaris: message exceeds the maximum message size")
	ErrConnectionLost   = errors.New("talaris: connection lost without a close frame")
	ErrCloseTimeout     = errors.New("talaris: close handshake timed out")
	ErrReadTimeout      = errors.New("talaris: nothing received within DialOptions.ReadTimeout")
	ErrAborted          = errors.New("talaris: connection aborted") // by Conn.Abort, or Close while dialing; also matches ErrClosed
	ErrTLS              = errors.New("talaris: TLS failure")
	ErrTLSUnknownCA     = errors.New("talaris: TLS certificate signed by an unknown authority")
	ErrTLSHostname      = errors.New("talaris: TLS certificate does not match the host name")
	ErrTLSExpired       = errors.New("talaris: TLS certificate expired or not yet valid")
	ErrTLSALPN          = errors.New("talaris: TLS ALPN negotiation did not select http/1.1")
	ErrTLSNotTLS        = errors.New("talaris: server did not answer with TLS")
	ErrTLSPin           = errors.New("talaris: TLS server public key matches no pin")
	ErrInvalidCloseCode = errors.New("talaris: close code may not be sent")
	ErrControlTooLong   = errors.New("talaris: control frame payload longer than 125 bytes")
	ErrInvalidConfig    = errors.New("talaris: invalid configuration")
	ErrWouldBlock       = errors.New("talaris: connection's send queue is full (Config.MaxSendQueue)")
	// ErrReconnecting: the connection dropped and its ReconnectPolicy
	// re-dials; nothing is sent until the next EventOpen, and nothing
	// accepted before the drop is sent on the next connection. It does
	// not match ErrWouldBlock: waiting does not make the send right.
	ErrReconnecting  = errors.New("talaris: the connection is reconnecting: nothing is sent until its next EventOpen")
	ErrInvalidOpcode = errors.New("talaris: not a data opcode (OpText or OpBinary)")
	ErrNoConns       = errors.New("talaris: pool has no connection left to deliver an event")
)

// errNotOpen is a Ping or Pong before the connection opened: it matches
// ErrWouldBlock (try again after EventOpen) and says why.
var errNotOpen = fmt.Errorf("%w: the connection is not open yet (control frames are not queued for the open)", ErrWouldBlock)

// errInternal is the cause of a C error code this table does not know.
var errInternal = errors.New("talaris: internal error")

// ConnError is the error of a failed connection: Is matches the sentinel
// of the cause and its category, so errors.Is(err, ErrTLS) and
// errors.Is(err, ErrHandshake) hold for their sub-causes (ErrTLSExpired,
// ErrBadStatus ...), and errors.Is(err, ErrClosed) for ErrAborted. The
// system error behind ErrDial and ErrConnectionLost is wrapped too:
// errors.Is(err, syscall.ECONNREFUSED), or errors.As with a
// *syscall.Errno.
type ConnError struct {
	Cause  error  // the most specific sentinel
	Code   int    // close code sent or observed, or HTTP status
	Detail string // what the loop saw

	errno syscall.Errno // the system error, 0 when none
}

func (e *ConnError) Error() string {
	if e.Detail == "" {
		return e.Cause.Error()
	}
	return e.Cause.Error() + ": " + e.Detail
}

// Is reports whether target is the cause or its category.
func (e *ConnError) Is(target error) bool {
	if target == e.Cause {
		return true
	}
	p := causeCategory(e.Cause)
	return p != nil && target == p
}

// withDropped adds to a connection's error that n accepted messages
// never reached the socket (Event.SendDropped); nil stays nil (a clean
// close reports them in Event.SendDropped only).
func withDropped(err error, n uint64) error {
	var ce *ConnError
	if err == nil || !errors.As(err, &ce) {
		return err
	}
	d := fmt.Sprintf("%d queued messages dropped", n)
	if ce.Detail != "" {
		d = ce.Detail + "; " + d
	}
	ce.Detail = d
	return err
}

// causeCategory is the sentinel a cause belongs to: ErrHandshake for the
// HTTP upgrade's causes, ErrTLS for the TLS ones, ErrClosed for ErrAborted
// (before ErrAborted existed that end was ErrClosed, and it still
// matches); nil for the others. It is derived from the cause alone, so a
// ConnError built by hand matches as one from the loop does.
func causeCategory(cause error) error {
	if cause == ErrAborted {
		return ErrClosed
	}
	for _, c := range httpCauses {
		if c == cause {
			return ErrHandshake
		}
	}
	for _, c := range tlsCauses {
		if c == cause {
			return ErrTLS
		}
	}
	return nil
}

// Unwrap returns the cause and, when there is one, the errno.
func (e *ConnError) Unwrap() []error {
	if e.errno != 0 {
		return []error{e.Cause, e.errno}
	}
	return []error{e.Cause}
}

// HandshakeError is the error of an upgrade the server refused or
// answered wrongly (it wraps ErrHandshake and the specific cause, such as
// ErrBadStatus): get it with errors.As from Dial's error or from an
// EventError's Err. The response is the server's own: Header and Body are
// bounded copies of what arrived with the head (at most 16 KiB of head and
// maxHandshakeBody bytes of body).
type HandshakeError struct {
	StatusCode int         // the response's status (101 when the refusal was for a bad header)
	Header     http.Header // the response headers, canonical names
	// Body is the start of the response's body (chunked decoded, at most
	// maxHandshakeBody bytes): what came with the head or within 200 ms
	// of it (the refusal waits that long at most for a body the head
	// announces, or for the end of a body without a length). May be empty.
	Body []byte
	// RetryAfter is the response's Retry-After (delta-seconds, or an
	// HTTP-date relative to when the error was built), 0 when absent,
	// malformed or in the past.
	RetryAfter time.Duration
	// Err is the *ConnError with the cause (ErrBadStatus, ErrBadAccept ...).
	Err error
}

// maxHandshakeBody bounds HandshakeError.Body.
const maxHandshakeBody = 1024

// Error says what was refused and why.
func (e *HandshakeError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying *ConnError: errors.Is(err, ErrHandshake)
// and errors.Is(err, ErrBadStatus) hold through it.
func (e *HandshakeError) Unwrap() error { return e.Err }

// newHandshakeError parses the start of a refused response (head, then
// the first body bytes; possibly cut short) into a HandshakeError
// wrapping cause. Malformed header lines are skipped: the error is about
// the refusal, not about its syntax.
func newHandshakeError(cause error, code int, resp []byte, now time.Time) *HandshakeError {
	he := &HandshakeError{StatusCode: code, Header: http.Header{}, Err: cause}
	head, body, complete := bytes.Cut(resp, []byte("\r\n\r\n"))
	line, rest, _ := bytes.Cut(head, []byte("\r\n"))
	if f := bytes.Fields(line); len(f) >= 2 && he.StatusCode == 0 {
		he.StatusCode, _ = strconv.Atoi(string(f[1]))
	}
	r := textproto.NewReader(bufio.NewReader(bytes.NewReader(append(rest, "\r\n\r\n"...))))
	if h, err := r.ReadMIMEHeader(); err == nil || len(h) > 0 {
		he.Header = http.Header(h)
	}
	if complete && len(body) > 0 {
		he.Body = handshakeBody(body, he.Header)
	}
	he.RetryAfter = retryAfter(he.Header.Get("Retry-After"), now)
	return he
}

// handshakeBody is the start of a refused response's body as its head
// frames it: a chunked body decoded (as far as its chunks came), a
// Content-Length body cut to that length, at most maxHandshakeBody bytes.
func handshakeBody(raw []byte, h http.Header) []byte {
	if strings.Contains(strings.ToLower(h.Get("Transfer-Encoding")), "chunked") {
		// A body cut short decodes as far as it goes: keep that.
		out, _ := io.ReadAll(io.LimitReader(httputil.NewChunkedReader(bytes.NewReader(raw)), maxHandshakeBody))
		if len(out) == 0 {
			return nil
		}
		return out
	}
	if n, err := strconv.ParseUint(h.Get("Content-Length"), 10, 31); err == nil && int(n) < len(raw) {
		raw = raw[:n]
	}
	if len(raw) == 0 {
		return nil
	}
	return bytes.Clone(raw[:min(len(raw), maxHandshakeBody)])
}

// retryAfter parses a Retry-After value: delta-seconds or an HTTP-date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// The C core's error codes, mirrored here so the table below is plain Go;
// talaris_linux.go fails to compile if one drifts from csrc/ring.h or
// csrc/codec/http.h.
const (
	cErrNone         = 0  // TL_E_NONE
	cErrDial         = 1  // TL_E_DIAL
	cErrTimeout      = 2  // TL_E_TIMEOUT
	cErrHTTP         = 3  // TL_E_HTTP: aux is a TL_HTTP_ERR_*
	cErrProtocol     = 4  // TL_E_PROTOCOL
	cErrUTF8         = 5  // TL_E_UTF8
	cErrTooBig       = 6  // TL_E_TOO_BIG
	cErrLost         = 7  // TL_E_LOST
	cErrCloseTimeout = 8  // TL_E_CLOSE_TIMEOUT
	cErrTLS          = 9  // TL_E_TLS: aux is a TL_TLS_*
	cErrAborted      = 10 // TL_E_ABORTED
	cErrShutdown     = 11 // TL_E_SHUTDOWN
	cErrReadTimeout  = 12 // TL_E_READ_TIMEOUT
	cErrProxy        = 13 // TL_E_PROXY: aux is a TL_PROXY_* | errno << 8 (proxy.go)

	cTLSUnknownCA = 1 // TL_TLS_UNKNOWN_CA
	cTLSHostname  = 2 // TL_TLS_HOSTNAME
	cTLSExpired   = 3 // TL_TLS_EXPIRED
	cTLSALPN      = 4 // TL_TLS_ALPN
	cTLSNotTLS    = 5 // TL_TLS_NOT_TLS
	cTLSPin       = 7 // TL_TLS_PIN

	cHTTPTooLarge  = -2 // TL_HTTP_ERR_TOO_LARGE
	cHTTPStatus    = -3 // TL_HTTP_ERR_STATUS
	cHTTPAccept    = -6 // TL_HTTP_ERR_ACCEPT
	cHTTPProtocol  = -7 // TL_HTTP_ERR_PROTOCOL
	cHTTPExtension = -8 // TL_HTTP_ERR_EXTENSION
)

// errCauses maps a C error code to its sentinel. TL_E_HTTP and TL_E_TLS
// are refined by aux through httpCauses and tlsCauses; an aux missing
// there leaves the category itself as the cause.
var (
	errCauses = map[int32]error{
		cErrDial:         ErrDial,
		cErrTimeout:      ErrTimeout,
		cErrHTTP:         ErrHandshake,
		cErrProtocol:     ErrProtocol,
		cErrUTF8:         ErrInvalidUTF8,
		cErrTooBig:       ErrMessageTooBig,
		cErrLost:         ErrConnectionLost,
		cErrCloseTimeout: ErrCloseTimeout,
		cErrTLS:          ErrTLS,
		cErrAborted:      ErrAborted,
		cErrShutdown:     ErrPoolClosed,
		cErrReadTimeout:  ErrReadTimeout,
	}
	httpCauses = map[int32]error{
		cHTTPStatus:    ErrBadStatus,
		cHTTPAccept:    ErrBadAccept,
		cHTTPProtocol:  ErrBadSubprotocol,
		cHTTPExtension: ErrBadExtension,
		cHTTPTooLarge:  ErrHeaderTooLarge,
	}
	tlsCauses = map[int32]error{
		cTLSUnknownCA: ErrTLSUnknownCA,
		cTLSHostname:  ErrTLSHostname,
		cTLSExpired:   ErrTLSExpired,
		cTLSALPN:      ErrTLSALPN,
		cTLSNotTLS:    ErrTLSNotTLS,
		cTLSPin:       ErrTLSPin,
	}
)

// makeErr builds the error of C error code e (TL_E_*) with its aux cause,
// the close code or HTTP status, and the loop's detail text; nil for
// TL_E_NONE.
func makeErr(e, aux int32, code int, detail string) error {
	if e == cErrNone {
		return nil
	}
	if e == cErrProxy {
		return makeProxyErr(aux, code, detail)
	}
	cause, ok := errCauses[e]
	if !ok {
		cause = errInternal
	}
	sub := map[int32]error(nil)
	switch e {
	case cErrHTTP:
		sub = httpCauses
	case cErrTLS:
		sub = tlsCauses
	}
	if c, ok := sub[aux]; ok {
		cause = c
	}
	ce := &ConnError{Cause: cause, Code: code, Detail: detail}
	if (e == cErrDial || e == cErrLost) && aux > 0 {
		ce.errno = syscall.Errno(aux)
	}
	return ce
}
