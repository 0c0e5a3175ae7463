package conformance

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// Guards. They only stop a misbehaving client or server from hanging the
// run; no verdict depends on how fast anything happens.
const (
	guardShort = 3 * time.Second  // wait for a client reaction that should come at once
	guardLong  = 15 * time.Second // whole-connection read guard, big echoes
)

// Frame is a message or control frame a client sent back.
type Frame struct {
	Op      ws.Opcode
	Payload []byte
}

// Obs is what the server saw of one client connection.
type Obs struct {
	Requested   bool     // an upgrade request for the case arrived
	Msgs        []Frame  // data messages echoed by the client (reassembled)
	Pongs       [][]byte // pong payloads, in order
	Pings       int      // pings the client sent (not expected, recorded)
	CloseCode   int      // code of the client's first close frame; 0: none, 1005: empty body
	CloseReason string
	Closes      int    // close frames received
	AfterClose  int    // frames received after the client's close frame (a violation)
	BadFrame    string // the client sent something no client may send
	End         string // how the client side of TCP ended: eof, reset, timeout, server-closed
	Notes       []string
}

// Server is a loopback HTTP/1.1 listener that performs (or deliberately
// botches) the WebSocket opening handshake itself and then runs a case's
// script of raw bytes. The request path is /<client>/<case id>; the
// observations of each connection are delivered to Expect's channel.
type Server struct {
	URL    string
	TLSURL string // wss:// base URL once ListenTLS has run

	ln    net.Listener
	tlsLn net.Listener
	cases map[string]*Case
	mu    sync.Mutex
	wait  map[string]chan *Obs
	gone  map[string]chan struct{}
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// NewServer listens on 127.0.0.1 and serves cases.
func NewServer(cases []*Case) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{URL: "ws://" + ln.Addr().String(), ln: ln, cases: map[string]*Case{},
		wait: map[string]chan *Obs{}, gone: map[string]chan struct{}{}, conns: map[net.Conn]struct{}{}}
	for _, c := range cases {
		s.cases[c.ID] = c
	}
	s.wg.Add(1)
	go s.acceptOn(s.ln)
	return s, nil
}

// ListenTLS serves the same cases over TLS on a second loopback port
// (TLSURL, wss://): each connection is wrapped with crypto/tls using cfg
// before the upgrade request is read, so every case's bytes travel inside
// TLS records. cfg.NextProtos defaults to http/1.1.
func (s *Server) ListenTLS(cfg *tls.Config) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	cfg = cfg.Clone()
	if cfg.NextProtos == nil {
		cfg.NextProtos = []string{"http/1.1"}
	}
	s.tlsLn = tls.NewListener(ln, cfg)
	s.TLSURL = "wss://" + ln.Addr().String()
	s.wg.Add(1)
	go s.acceptOn(s.tlsLn)
	return nil
}

// Close stops the listeners and every connection and waits for handlers.
func (s *Server) Close() {
	s.ln.Close()
	if s.tlsLn != nil {
		s.tlsLn.Close()
	}
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Expect registers interest in the connection for client and case id and
// returns the URL to dial, the channel its observations arrive on, and a
// func to call once the client has finished (so that the server stops
// waiting for a reaction that will not come).
func (s *Server) Expect(client, id string) (string, <-chan *Obs, func()) {
	path := "/" + client + "/" + id
	ch := make(chan *Obs, 1)
	gone := make(chan struct{})
	s.mu.Lock()
	s.wait[path] = ch
	s.gone[path] = gone
	s.mu.Unlock()
	return s.URL + path, ch, sync.OnceFunc(func() { close(gone) })
}

func (s *Server) acceptOn(ln net.Listener) {
	defer s.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[nc] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(nc)
			s.mu.Lock()
			delete(s.conns, nc)
			s.mu.Unlock()
		}()
	}
}

func (s *Server) serve(nc net.Conn) {
	defer nc.Close()
	nc.SetReadDeadline(time.Now().Add(guardLong))
	br := bufio.NewReaderSize(nc, 64<<10)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	nc.SetReadDeadline(time.Time{})
	s.mu.Lock()
	ch := s.wait[req.URL.Path]
	gone := s.gone[req.URL.Path]
	delete(s.wait, req.URL.Path)
	delete(s.gone, req.URL.Path)
	s.mu.Unlock()
	parts := strings.SplitN(strings.TrimPrefix(req.URL.Path, "/"), "/", 2)
	var c *Case
	if len(parts) == 2 {
		c = s.cases[parts[1]]
	}
	if c == nil || ch == nil {
		io.WriteString(nc, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	ss := &Sess{nc: nc, br: br, req: req, obs: &Obs{Requested: true}, changed: make(chan struct{}),
		readDone: make(chan struct{}), clientGone: gone}
	ss.accept = ws.AcceptKey(req.Header.Get("Sec-WebSocket-Key"))
	ss.run(c)
	nc.Close()
	select {
	case <-ss.readDone:
	case <-time.After(guardShort):
	}
	ss.mu.Lock()
	obs := ss.obs
	ss.obs = nil // the reader must not touch it any more
	ss.mu.Unlock()
	ch <- obs
}

// Sess is one server connection running a case.
type Sess struct {
	nc     net.Conn
	br     *bufio.Reader
	req    *http.Request
	accept string // Sec-WebSocket-Accept for the client's key

	mu         sync.Mutex
	obs        *Obs
	changed    chan struct{} // closed and replaced on every observation
	eof        bool
	readDone   chan struct{}
	clientGone <-chan struct{} // closed when the client adapter has returned
	gate       sync.Mutex      // held by the script to pause the reader
	sentClose  bool
	finished   bool
	writeErr   error
}

// StdResponse is the standard 101 response head ("{accept}" is replaced
// with the right Sec-WebSocket-Accept value).
const StdResponse = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"

func (s *Sess) run(c *Case) {
	go s.reader()
	if c.Handshake != nil {
		c.Handshake(s)
		if !s.finished {
			s.WaitEOF(guardShort)
		}
		return
	}
	resp := c.Response
	if resp == "" {
		resp = StdResponse
	}
	s.Send([]byte(strings.ReplaceAll(resp, "{accept}", s.accept)), c.First)
	if c.Want.Kind == NoOpen {
		s.WaitEOF(guardShort)
		return
	}
	if c.Script != nil {
		c.Script(s)
	}
	if s.finished {
		return
	}
	w := &c.Want
	if w.Kind == Echo {
		s.waitUntil(guardLong, func(o *Obs) bool {
			return len(o.Msgs) >= len(w.Msgs) && len(o.Pongs) >= len(w.Pongs)
		})
		if !s.sentClose {
			s.SendClose(1000, "")
		}
	} else {
		// Fail: wait for the client's close frame, but stop waiting when
		// the client shows it is not failing (echoes more than the
		// allowed prefix), so lenient clients do not cost a guard each.
		s.waitUntil(guardShort, func(o *Obs) bool {
			return len(o.Msgs) > len(w.Msgs) || len(o.Pongs) > len(w.Pongs)
		})
		if !s.sentClose && s.closeCode() == 0 && !s.isEOF() {
			s.SendClose(1000, "")
		}
	}
	if s.WaitClose(guardShort) && !s.sentClose {
		code := s.closeCode()
		if !sendable(code) {
			code = 1000
		}
		s.SendClose(code, "")
	}
	// The server closes TCP first (RFC 6455 section 7.1.1): return.
}

func sendable(code int) bool {
	return code >= 1000 && code <= 1003 || code >= 1007 && code <= 1014 || code >= 3000 && code <= 4999
}

// Send writes the concatenation of bs in one write.
func (s *Sess) Send(bs ...[]byte) {
	s.write(bytes.Join(bs, nil))
}

func (s *Sess) write(b []byte) {
	if len(b) == 0 {
		return
	}
	s.nc.SetWriteDeadline(time.Now().Add(guardLong))
	if _, err := s.nc.Write(b); err != nil && s.writeErr == nil {
		s.writeErr = err
	}
}

// SendFrames writes each frame with its own write (frame-wise chops).
func (s *Sess) SendFrames(bs ...[]byte) {
	for _, b := range bs {
		s.write(b)
	}
}

// SendChopped writes b in pieces of n bytes, sleeping delay between them.
func (s *Sess) SendChopped(b []byte, n int, delay time.Duration) {
	for len(b) > 0 {
		k := min(n, len(b))
		s.write(b[:k])
		b = b[k:]
		if delay > 0 && len(b) > 0 {
			time.Sleep(delay)
		}
	}
}

// SendClose writes a close frame with ws.ClosePayload(code, reason).
func (s *Sess) SendClose(code int, reason string) {
	s.sentClose = true
	s.Send(ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(code, reason)))
}

// MarkClosed records that the script wrote a close frame itself.
func (s *Sess) MarkClosed() { s.sentClose = true }

// Finish tells run that the script handled the ending itself.
func (s *Sess) Finish() { s.finished = true }

// Note adds a line to the observations.
func (s *Sess) Note(format string, args ...any) {
	s.mu.Lock()
	if s.obs != nil {
		s.obs.Notes = append(s.obs.Notes, fmt.Sprintf(format, args...))
	}
	s.mu.Unlock()
}

// Pause stops the reader before its next frame; Resume lets it go on.
func (s *Sess) Pause()  { s.gate.Lock() }
func (s *Sess) Resume() { s.gate.Unlock() }

// Conn is the connection (for deadlines); a *tls.Conn over wss://.
func (s *Sess) Conn() net.Conn { return s.nc }

// TLS reports whether the case runs over wss://.
func (s *Sess) TLS() bool {
	_, ok := s.nc.(*tls.Conn)
	return ok
}

// tcp returns the TCP connection under s.nc.
func (s *Sess) tcp() *net.TCPConn {
	nc := s.nc
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	tc, _ := nc.(*net.TCPConn)
	return tc
}

// CloseWrite ends the server's byte stream with a FIN (over TLS: a
// close_notify first, as a TLS server closing cleanly does) and keeps
// reading.
func (s *Sess) CloseWrite() {
	if tc, ok := s.nc.(*tls.Conn); ok {
		tc.CloseWrite()
	}
	if tc := s.tcp(); tc != nil {
		tc.CloseWrite()
	}
}

// Reset closes the connection with a TCP reset (over TLS: no close_notify).
func (s *Sess) Reset() {
	if tc := s.tcp(); tc != nil {
		tc.SetLinger(0)
		tc.Close()
	}
	s.nc.Close()
	s.finished = true
}

func (s *Sess) closeCode() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.obs.CloseCode
}

func (s *Sess) isEOF() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eof
}

// waitUntil waits until cond holds, the client's side ended, a close frame
// arrived, or d passed. It reports whether cond held.
func (s *Sess) waitUntil(d time.Duration, cond func(o *Obs) bool) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		s.mu.Lock()
		ok := cond(s.obs)
		stop := s.eof || s.obs.CloseCode != 0
		ch := s.changed
		s.mu.Unlock()
		if ok {
			return true
		}
		if stop {
			return false
		}
		select {
		case <-ch:
		case <-t.C:
			return false
		case <-s.clientGone:
			// The client has returned (and closed its socket): let the
			// reader take in what it sent, check once more, then stop.
			s.clientGone = nil
			select {
			case <-s.readDone:
			case <-time.After(guardShort):
			}
			t.Reset(0)
		}
	}
}

// WaitMsgs waits for n echoed data messages.
func (s *Sess) WaitMsgs(n int, d time.Duration) bool {
	return s.waitUntil(d, func(o *Obs) bool { return len(o.Msgs) >= n })
}

// WaitPongs waits for n pongs.
func (s *Sess) WaitPongs(n int, d time.Duration) bool {
	return s.waitUntil(d, func(o *Obs) bool { return len(o.Pongs) >= n })
}

// WaitClose waits for the client's close frame.
func (s *Sess) WaitClose(d time.Duration) bool {
	return s.waitUntil(d, func(o *Obs) bool { return o.CloseCode != 0 })
}

// WaitEOF waits until the client's side of TCP ends (FIN or RST).
func (s *Sess) WaitEOF(d time.Duration) bool {
	select {
	case <-s.readDone:
		return true
	case <-s.clientGone:
		select {
		case <-s.readDone:
			return true
		case <-time.After(50 * time.Millisecond):
			return false
		}
	case <-time.After(d):
		return false
	}
}

// reader reads the client's frames until its side ends.
func (s *Sess) reader() {
	defer close(s.readDone)
	s.nc.SetReadDeadline(time.Now().Add(guardLong + guardLong))
	var op ws.Opcode
	var msg []byte
	for {
		s.gate.Lock()
		s.gate.Unlock()
		h, p, err := readFrame(s.br)
		s.mu.Lock()
		if s.obs == nil {
			s.mu.Unlock()
			return
		}
		o := s.obs
		if err != nil {
			s.eof = true
			o.End = endOf(err)
			if strings.HasPrefix(err.Error(), "client:") {
				o.BadFrame = err.Error()
			}
		} else {
			if o.Closes > 0 {
				o.AfterClose++
			}
			switch {
			case h.Op == ws.OpClose:
				code, reason, perr := ws.ParseClosePayload(p)
				if o.Closes == 0 {
					if perr != nil {
						o.BadFrame = "client close payload: " + perr.Error()
						code = -1
					}
					o.CloseCode, o.CloseReason = code, string(reason)
				}
				o.Closes++
			case h.Op == ws.OpPing:
				o.Pings++
			case h.Op == ws.OpPong:
				o.Pongs = append(o.Pongs, p)
			case h.Op == ws.OpContinuation && op == 0, h.Op != ws.OpContinuation && op != 0:
				o.BadFrame = "client fragmentation error"
			default:
				if h.Op != ws.OpContinuation {
					op = h.Op
				}
				msg = append(msg, p...)
				if h.Fin {
					o.Msgs = append(o.Msgs, Frame{Op: op, Payload: msg})
					op, msg = 0, nil
				}
			}
		}
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func endOf(err error) string {
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, os.ErrDeadlineExceeded):
		return "timeout"
	case errors.Is(err, net.ErrClosed):
		return "server-closed"
	}
	return err.Error()
}

// readFrame reads one client frame and unmasks it; a header the server
// refuses is reported as the client's fault ("client: ...").
func readFrame(br *bufio.Reader) (ws.Header, []byte, error) {
	h, p, err := wstest.ReadClientFrame(br, 64<<20)
	if errors.Is(err, wstest.ErrFrameTooBig) {
		return h, nil, fmt.Errorf("client: frame of %d bytes", h.Length)
	}
	if err != nil && endOf(err) == err.Error() { // not an I/O end: a bad header
		return h, nil, fmt.Errorf("client: %w", err)
	}
	return h, p, err
}
