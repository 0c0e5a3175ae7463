package wstest

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talaris-go/talaris/ws"
)

// RawServer is a WebSocket server that performs the opening handshake
// itself and then gives the connection to Handler, which may write any bytes
// at all. Set the fields before Start.
type RawServer struct {
	// URL is ws://127.0.0.1:port, set by Start.
	URL string
	// Handler runs on its own goroutine for every upgraded connection.
	// The connection is closed when it returns.
	Handler func(c *RawConn)
	// Header holds extra headers for the standard 101 response (for
	// example Sec-WebSocket-Protocol).
	Header http.Header
	// Response, if non-empty, is sent verbatim instead of the standard 101
	// response, after replacing every "{accept}" with the computed
	// Sec-WebSocket-Accept value. Include the final "\r\n\r\n".
	Response string
	// Extra is written together with the response in a single write, so
	// that frames arrive in the same segment as the handshake.
	Extra []byte

	tracker
	ln   net.Listener
	mu   sync.Mutex
	errs []error
}

// NewRaw returns an unstarted RawServer running handler on every
// connection.
func NewRaw(handler func(c *RawConn)) *RawServer { return &RawServer{Handler: handler} }

// Start listens on a free loopback port and accepts connections in the
// background. With a non-nil t, failures are fatal and Close is registered
// with t.Cleanup; with nil, Start panics on failure.
func (s *RawServer) Start(t testing.TB) *RawServer { return s.start(t, nil) }

// StartTLS is Start for wss://: the listener speaks TLS with cfg (the TLS
// handshake runs when the handler's connection is first read).
func (s *RawServer) StartTLS(t testing.TB, cfg *tls.Config) *RawServer { return s.start(t, cfg) }

func (s *RawServer) start(t testing.TB, cfg *tls.Config) *RawServer {
	ln, err := listen(t)
	if err != nil {
		return s
	}
	s.URL = "ws://" + ln.Addr().String()
	if cfg != nil {
		ln = tls.NewListener(ln, cfg)
		s.URL = "wss://" + ln.Addr().String()
	}
	s.ln = ln
	s.wg.Add(1)
	go s.serve()
	if t != nil {
		t.Cleanup(s.Close)
	}
	return s
}

// Close stops accepting, closes all connections and waits for the handlers.
// It is safe to call more than once.
func (s *RawServer) Close() {
	if s.ln != nil {
		s.ln.Close()
	}
	s.closeAll()
}

// HandshakeErrors returns the reasons client handshakes were rejected (and
// other I/O errors before the handler ran).
func (s *RawServer) HandshakeErrors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}

func (s *RawServer) addErr(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, err)
	s.mu.Unlock()
}

func (s *RawServer) serve() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			return
		}
		if !s.enter() {
			nc.Close()
			return
		}
		go func() {
			defer s.wg.Done()
			untrack := s.track(nc)
			defer untrack()
			defer nc.Close()
			c, err := s.handshake(nc)
			if err != nil {
				s.addErr(err)
				return
			}
			if s.Handler != nil {
				s.Handler(c)
			}
		}()
	}
}

// handshake reads and validates the client's upgrade request and answers
// it.
func (s *RawServer) handshake(nc net.Conn) (*RawConn, error) {
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReaderSize(nc, 64<<10)
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, fmt.Errorf("wstest: reading upgrade request: %w", err)
	}
	nc.SetReadDeadline(time.Time{})
	key := req.Header.Get("Sec-WebSocket-Key")
	if err := checkUpgrade(req); err != nil {
		io.WriteString(nc, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return nil, err
	}
	accept := ws.AcceptKey(key)
	var resp []byte
	if s.Response != "" {
		resp = []byte(strings.ReplaceAll(s.Response, "{accept}", accept))
	} else {
		var b bytes.Buffer
		b.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ")
		b.WriteString(accept)
		b.WriteString("\r\n")
		s.Header.Write(&b)
		b.WriteString("\r\n")
		resp = b.Bytes()
	}
	resp = append(resp, s.Extra...)
	if _, err := nc.Write(resp); err != nil {
		return nil, fmt.Errorf("wstest: writing upgrade response: %w", err)
	}
	return &RawConn{Conn: nc, Request: req, br: br}, nil
}

// checkUpgrade validates a client's opening handshake (RFC 6455 section
// 4.2.1).
func checkUpgrade(r *http.Request) error {
	switch {
	case r.Method != http.MethodGet:
		return fmt.Errorf("wstest: upgrade request method %q, want GET", r.Method)
	case !r.ProtoAtLeast(1, 1):
		return fmt.Errorf("wstest: upgrade request protocol %q", r.Proto)
	case !hasToken(r.Header, "Upgrade", "websocket"):
		return fmt.Errorf("wstest: Upgrade header %q lacks websocket", r.Header.Values("Upgrade"))
	case !hasToken(r.Header, "Connection", "upgrade"):
		return fmt.Errorf("wstest: Connection header %q lacks upgrade", r.Header.Values("Connection"))
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		return fmt.Errorf("wstest: Sec-WebSocket-Version %q, want 13", r.Header.Get("Sec-WebSocket-Version"))
	}
	raw, err := base64.StdEncoding.DecodeString(r.Header.Get("Sec-WebSocket-Key"))
	if err != nil || len(raw) != 16 {
		return fmt.Errorf("wstest: bad Sec-WebSocket-Key %q", r.Header.Get("Sec-WebSocket-Key"))
	}
	return nil
}

// hasToken reports whether a comma-separated header contains token,
// case-insensitively.
func hasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// RawConn is a server connection after the opening handshake. Its methods
// are meant for the single handler goroutine.
type RawConn struct {
	// Conn is the TCP connection. Reading from it directly skips bytes
	// already buffered by ReadFrame.
	Conn net.Conn
	// Request is the client's upgrade request.
	Request *http.Request

	br *bufio.Reader
}

// Write writes b as is.
func (c *RawConn) Write(b []byte) error {
	_, err := c.Conn.Write(b)
	return err
}

// WriteFrame writes one unmasked frame built with ws.AppendFrame. op is not
// validated.
func (c *RawConn) WriteFrame(fin bool, op ws.Opcode, payload []byte) error {
	return c.Write(ws.AppendFrame(nil, fin, op, payload))
}

// WriteFrameLen writes a header with the length encoding forced to lenBytes
// (0, 2 or 8; see ws.AppendHeaderLen) followed by payload. h.Length is
// written as given and need not equal len(payload).
func (c *RawConn) WriteFrameLen(h ws.Header, lenBytes int, payload []byte) error {
	return c.Write(append(ws.AppendHeaderLen(nil, h, lenBytes), payload...))
}

// WriteClose writes a close frame with ws.ClosePayload(code, reason).
func (c *RawConn) WriteClose(code int, reason string) error {
	return c.WriteFrame(true, ws.OpClose, ws.ClosePayload(code, reason))
}

// WriteChopped writes b in pieces of chunk bytes, sleeping delay between
// pieces, so that the client sees frames split at awkward places. Go sets
// TCP_NODELAY, so each piece normally leaves in its own segment.
func (c *RawConn) WriteChopped(b []byte, chunk int, delay time.Duration) error {
	if chunk <= 0 {
		chunk = 1
	}
	for len(b) > 0 {
		n := min(chunk, len(b))
		if err := c.Write(b[:n]); err != nil {
			return err
		}
		b = b[n:]
		if len(b) > 0 && delay > 0 {
			time.Sleep(delay)
		}
	}
	return nil
}

// MaxReadFrame is the largest payload ReadFrame accepts.
const MaxReadFrame = 64 << 20

// ErrFrameTooBig is returned by ReadFrame for payloads over MaxReadFrame.
var ErrFrameTooBig = errors.New("wstest: client frame too big")

// ReadFrame reads one frame from the client, checks it with
// ws.ParseHeader(..., false) (so an unmasked frame is ws.ErrUnmaskedClientFrame)
// and returns its header and unmasked payload.
func (c *RawConn) ReadFrame() (ws.Header, []byte, error) {
	return ReadClientFrame(c.br, MaxReadFrame)
}

// ReadMessage reads frames until a complete data message, returning
// control frames as they come: op is the frame's opcode for control frames
// and the message's opcode for data. Fragmentation errors are reported with
// the ws package's sentinels.
func (c *RawConn) ReadMessage() (ws.Opcode, []byte, error) {
	var op ws.Opcode
	var msg []byte
	for {
		h, p, err := c.ReadFrame()
		if err != nil {
			return 0, nil, err
		}
		switch {
		case h.Op.IsControl():
			return h.Op, p, nil
		case h.Op == ws.OpContinuation && op == 0:
			return 0, nil, ws.ErrUnexpectedContinuation
		case h.Op != ws.OpContinuation && op != 0:
			return 0, nil, ws.ErrExpectedContinuation
		case h.Op != ws.OpContinuation:
			op = h.Op
		}
		msg = append(msg, p...)
		if h.Fin {
			return op, msg, nil
		}
	}
}

// ExpectClose reads frames until a close frame and returns its code and
// reason (ws.CloseNoStatus for an empty body). Data and other control frames
// before it are skipped.
func (c *RawConn) ExpectClose() (code int, reason string, err error) {
	for {
		h, p, err := c.ReadFrame()
		if err != nil {
			return 0, "", err
		}
		if h.Op == ws.OpClose {
			code, r, err := ws.ParseClosePayload(p)
			return code, string(r), err
		}
	}
}

// SetDeadline sets the read and write deadline d from now; d <= 0 clears it.
func (c *RawConn) SetDeadline(d time.Duration) error {
	if d <= 0 {
		return c.Conn.SetDeadline(time.Time{})
	}
	return c.Conn.SetDeadline(time.Now().Add(d))
}

// SetReadRate makes the connection's reads (ReadFrame, ReadMessage,
// ExpectClose) take at most bps bytes per second from here on: a slow
// reader, so the client's sends back up. Bytes already buffered are not
// limited.
func (c *RawConn) SetReadRate(bps int) {
	c.br = bufio.NewReaderSize(&rateReader{r: c.br, bps: bps, start: time.Now()}, 4096)
}

// rateReader paces reads to bps bytes per second on average.
type rateReader struct {
	r     io.Reader
	bps   int
	start time.Time
	n     int64
}

func (r *rateReader) Read(p []byte) (int, error) {
	if max := max(r.bps/100, 1); len(p) > max { // at most 10 ms worth at once
		p = p[:max]
	}
	due := r.start.Add(time.Duration(float64(r.n) / float64(r.bps) * float64(time.Second)))
	if d := time.Until(due); d > 0 {
		time.Sleep(d)
	}
	n, err := r.r.Read(p)
	r.n += int64(n)
	return n, err
}

// Close closes the TCP connection gracefully (FIN).
func (c *RawConn) Close() error { return c.Conn.Close() }

// Reset closes the TCP connection with a reset (SO_LINGER 0, then close).
func (c *RawConn) Reset() error {
	setLinger0(c.Conn)
	return c.Conn.Close()
}

// ReadClientFrame reads one client frame from br, checks its header with
// ws.ParseHeader(..., false) and returns it with the unmasked payload; a
// payload over max is ErrFrameTooBig (nothing of it is read).
func ReadClientFrame(br *bufio.Reader, max uint64) (ws.Header, []byte, error) {
	var hdr [ws.MaxHeaderLen]byte
	if _, err := io.ReadFull(br, hdr[:2]); err != nil {
		return ws.Header{}, nil, err
	}
	n := 2
	switch hdr[1] & 0x7F {
	case 126:
		n += 2
	case 127:
		n += 8
	}
	if hdr[1]&0x80 != 0 {
		n += 4
	}
	if _, err := io.ReadFull(br, hdr[2:n]); err != nil {
		return ws.Header{}, nil, err
	}
	h, _, err := ws.ParseHeader(hdr[:n], false)
	if err != nil {
		return h, nil, err
	}
	if h.Length > max {
		return h, nil, ErrFrameTooBig
	}
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(br, p); err != nil {
		return h, nil, err
	}
	ws.Mask(h.Mask, p, 0)
	return h, p, nil
}
