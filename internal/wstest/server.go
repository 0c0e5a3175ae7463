package wstest

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/talaris-go/talaris/ws"
)

// Subprotocol is the subprotocol the /subproto endpoint accepts.
const Subprotocol = "v1.talaris"

// closeWait bounds how long a server waits for the client's close frame.
const closeWait = 5 * time.Second

// Message is a message recorded by the /collect endpoint.
type Message struct {
	Op      ws.Opcode
	Payload []byte
}

// Server is a WebSocket test server backed by gorilla/websocket (NewGorilla)
// or coder/websocket (NewCoder). Set OnMessage before Start.
type Server struct {
	// URL is ws://127.0.0.1:port, set by Start. Append an endpoint path.
	URL string
	// OnMessage, if set, is called by the /collect endpoint for every
	// message, from the connection's goroutine. payload is a copy the
	// callee may keep.
	OnMessage func(op ws.Opcode, payload []byte)

	name    string
	upgrade func(w http.ResponseWriter, r *http.Request, subprotocols []string) (conn, error)
	tracker

	mu        sync.Mutex
	collected []Message
	errs      []error
	srv       *http.Server
}

// conn is what the endpoints need from a server-side WebSocket library.
// Raw writes may only happen while no library write is in progress; the
// endpoints never write from two goroutines.
type conn interface {
	// ReadMessage returns the next data message; it fails once a close
	// frame (answered by the library unless we sent one) or EOF arrives.
	ReadMessage() (ws.Opcode, []byte, error)
	// WriteMessage sends one unfragmented message through the library.
	WriteMessage(op ws.Opcode, p []byte) error
	// WriteRaw writes bytes to the connection, bypassing framing.
	WriteRaw(b []byte) error
	// CloseHandshake sends a close frame with ws.ClosePayload(code,
	// reason) (any code), waits for the client's close, closes TCP.
	CloseHandshake(code int, reason string) error
	// NetConn returns the underlying connection.
	NetConn() net.Conn
	// Subprotocol returns the negotiated subprotocol.
	Subprotocol() string
	// CloseNow closes TCP at once, without a close frame.
	CloseNow()
}

// Start listens on a free loopback port, serves in the background and
// returns s. With a non-nil t, failures are fatal to the test and Close is
// registered with t.Cleanup; with nil, Start panics on failure.
func (s *Server) Start(t testing.TB) *Server { return s.start(t, nil) }

// StartTLS is Start over TLS: the listener is wrapped with cfg (which must
// hold a certificate) and URL is wss://127.0.0.1:port. When cfg.NextProtos
// is nil the server offers ALPN "http/1.1". TLS handshake failures are not
// logged (error tests cause them on purpose). Over TLS, /drop closes the
// TLS connection (close_notify, then FIN) unless trunc=1 is given: then the
// TCP connection under TLS is closed without close_notify, after half a
// TLS record when partial=1 is given too.
func (s *Server) StartTLS(t testing.TB, cfg *tls.Config) *Server {
	cfg = cfg.Clone()
	if cfg.NextProtos == nil {
		cfg.NextProtos = []string{"http/1.1"}
	}
	return s.start(t, cfg)
}

func (s *Server) start(t testing.TB, tlsCfg *tls.Config) *Server {
	ln, err := listen(t)
	if err != nil {
		return s
	}
	scheme := "ws://"
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
		scheme = "wss://"
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/stream", s.handle(s.stream, nil))
	mux.HandleFunc("/echo", s.handle(s.echo, nil))
	mux.HandleFunc("/close", s.handle(s.close, nil))
	mux.HandleFunc("/drop", s.handle(s.drop, nil))
	mux.HandleFunc("/collect", s.handle(s.collect, nil))
	mux.HandleFunc("/subproto", s.handle(s.subproto, []string{Subprotocol}))
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if tlsCfg != nil {
		s.srv.ErrorLog = log.New(io.Discard, "", 0)
	}
	s.URL = scheme + ln.Addr().String()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.srv.Serve(ln)
	}()
	if t != nil {
		t.Cleanup(s.Close)
	}
	return s
}

// listen opens a loopback listener, reporting failure through t or a panic.
func listen(t testing.TB) (net.Listener, error) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		err = fmt.Errorf("wstest: listen: %w", err)
		if t == nil {
			panic(err)
		}
		t.Fatal(err)
	}
	return ln, err
}

// Close stops the server, closes every open connection and waits for the
// connection goroutines. It is safe to call more than once.
func (s *Server) Close() {
	if s.srv != nil {
		s.srv.Close()
	}
	s.closeAll()
}

// Collected returns copies of the messages recorded by /collect so far, in
// arrival order across all connections.
func (s *Server) Collected() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Message, len(s.collected))
	for i, m := range s.collected {
		out[i] = Message{m.Op, append([]byte(nil), m.Payload...)}
	}
	return out
}

// Errors returns the unexpected errors endpoints met (failed upgrades,
// write errors, bad parameters). A client closing or dropping the
// connection is not an error.
func (s *Server) Errors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}

func (s *Server) addErr(err error) {
	s.mu.Lock()
	s.errs = append(s.errs, fmt.Errorf("wstest %s: %w", s.name, err))
	s.mu.Unlock()
}

// handle wraps an endpoint: upgrade, track the connection, run, close.
func (s *Server) handle(fn func(c conn, q params) error, subprotocols []string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.enter() {
			http.Error(w, "closing", http.StatusServiceUnavailable)
			return
		}
		defer s.wg.Done()
		q := params{r: r}
		c, err := s.upgrade(w, r, subprotocols)
		if err != nil {
			s.addErr(fmt.Errorf("%s: upgrade: %w", r.URL.Path, err))
			return
		}
		untrack := s.track(c.NetConn())
		defer untrack()
		defer c.CloseNow()
		if err := fn(c, q); err != nil {
			s.addErr(fmt.Errorf("%s: %w", r.URL.Path, err))
		}
	}
}

// params reads integer query parameters.
type params struct{ r *http.Request }

func (q params) int(name string, def int) int {
	v := q.r.URL.Query().Get(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return def
	}
	return n
}

func (q params) str(name string) string { return q.r.URL.Query().Get(name) }

func (q params) op() ws.Opcode {
	if q.str("op") == "text" {
		return ws.OpText
	}
	return ws.OpBinary
}

// writeStream sends messages 0..n-1 of a /stream.
func writeStream(c conn, q params) error {
	n, size, frag, op := q.int("n", 1), q.int("size", 64), q.int("frag", 1), q.op()
	ping := q.str("ping") == "1"
	if frag <= 1 && !ping {
		var buf []byte
		for i := range n {
			buf = AppendPayload(buf[:0], op, i, size)
			if err := c.WriteMessage(op, buf); err != nil {
				return err
			}
		}
		return nil
	}
	// Raw frames, batched into writes of about 64 KiB.
	var buf []byte
	for i := range n {
		buf = AppendStreamMessage(buf, op, i, size, frag, ping)
		if len(buf) >= 64<<10 || i == n-1 {
			if err := c.WriteRaw(buf); err != nil {
				return err
			}
			buf = buf[:0]
		}
	}
	return nil
}

func (s *Server) stream(c conn, q params) error {
	if err := writeStream(c, q); err != nil {
		return ignoreClosed(err)
	}
	return ignoreClosed(c.CloseHandshake(ws.CloseNormal, "done"))
}

func (s *Server) drop(c conn, q params) error {
	if err := writeStream(c, q); err != nil {
		return ignoreClosed(err)
	}
	nc := c.NetConn()
	if tc, ok := nc.(*tls.Conn); ok && q.str("trunc") == "1" {
		// Truncate: no close_notify, optionally in the middle of a record
		// (an application-data header announcing 100 bytes, then 3).
		nc = tc.NetConn()
		if q.str("partial") == "1" {
			if _, err := nc.Write([]byte{23, 3, 3, 0, 100, 1, 2, 3}); err != nil {
				return ignoreClosed(err)
			}
		}
	}
	if q.str("rst") == "1" {
		setLinger0(nc)
	}
	return ignoreClosed(nc.Close())
}

func (s *Server) echo(c conn, _ params) error {
	for {
		op, p, err := c.ReadMessage()
		if err != nil {
			return nil // close answered by the library, or EOF
		}
		if err := c.WriteMessage(op, p); err != nil {
			return ignoreClosed(err)
		}
	}
}

func (s *Server) close(c conn, q params) error {
	for range q.int("after", 0) {
		if _, _, err := c.ReadMessage(); err != nil {
			return nil
		}
	}
	return ignoreClosed(c.CloseHandshake(q.int("code", ws.CloseNormal), q.str("reason")))
}

func (s *Server) collect(c conn, _ params) error {
	for {
		op, p, err := c.ReadMessage()
		if err != nil {
			return nil
		}
		p = append([]byte(nil), p...)
		s.mu.Lock()
		s.collected = append(s.collected, Message{op, p})
		s.mu.Unlock()
		if s.OnMessage != nil {
			s.OnMessage(op, append([]byte(nil), p...))
		}
	}
}

func (s *Server) subproto(c conn, q params) error {
	if err := c.WriteMessage(ws.OpText, []byte(c.Subprotocol())); err != nil {
		return ignoreClosed(err)
	}
	return s.echo(c, q)
}

// ignoreClosed drops the errors a client going away causes.
func ignoreClosed(err error) error {
	var ne net.Error
	if err == nil || errors.Is(err, net.ErrClosed) || errors.As(err, &ne) {
		return nil
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		return nil
	}
	return err
}

// setLinger0 makes the next Close of c send a TCP reset.
func setLinger0(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
}

// tracker tracks a server's goroutines and open connections.
type tracker struct {
	wg     sync.WaitGroup
	tmu    sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// enter registers a connection goroutine; false once the server closed.
func (t *tracker) enter() bool {
	t.tmu.Lock()
	defer t.tmu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	return true
}

// track records an open connection until the returned func is called.
func (t *tracker) track(c net.Conn) func() {
	t.tmu.Lock()
	if t.conns == nil {
		t.conns = make(map[net.Conn]struct{})
	}
	t.conns[c] = struct{}{}
	closed := t.closed
	t.tmu.Unlock()
	if closed {
		c.Close()
	}
	return func() {
		t.tmu.Lock()
		delete(t.conns, c)
		t.tmu.Unlock()
	}
}

// closeAll closes all tracked connections and waits for the goroutines.
func (t *tracker) closeAll() {
	t.tmu.Lock()
	t.closed = true
	for c := range t.conns {
		c.Close()
	}
	t.tmu.Unlock()
	t.wg.Wait()
}

// readClientClose reads client frames from br until a close frame arrives
// (returning nil), another error occurs or closeWait passes.
func readClientClose(nc net.Conn, br *bufio.Reader) error {
	nc.SetReadDeadline(time.Now().Add(closeWait))
	for {
		h, _, err := ReadClientFrame(br, 1<<20)
		if err != nil {
			return err
		}
		if h.Op == ws.OpClose {
			return nil
		}
	}
}
