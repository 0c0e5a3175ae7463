//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	coder "github.com/coder/websocket"
	gobwas "github.com/gobwas/ws"
	"github.com/gobwas/ws/wsutil"
	"github.com/gorilla/websocket"
	"github.com/lxzan/gws"

	"github.com/talaris-go/talaris/ws"
)

// The Go peers, each driven through its fastest read API:
//
//	gorilla  Conn.NextReader + a reused buffer (ReadMessage allocates)
//	gobwas   ws.ReadHeaderBuffer + io.ReadFull on a 64 KiB bufio.Reader (the low-level API, no wsutil)
//	gws      its own ReadLoop with OnMessage callbacks (ParallelEnabled off)
//	coder    Conn.Reader + a reused buffer
//
// All use crypto/tls for wss://.

// msgFunc receives one data message; p is valid only during the call.
type msgFunc func(text bool, p []byte)

// peerConn is one client connection of a Go peer.
type peerConn interface {
	run(fn msgFunc) error     // read messages until the connection ends
	readOne(fn msgFunc) error // read exactly one data message
	write(p []byte) error     // send one binary message
	close()                   // drop the connection
}

// netDialFunc replaces a peer's TCP dial (the in-memory decode uses it).
type netDialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

type goPeer struct {
	name string
	dial func(ctx context.Context, url string, tc *tls.Config, nd netDialFunc) (peerConn, error)
}

var goPeers = []goPeer{
	{"gorilla", dialGorilla},
	{"gobwas", dialGobwas},
	{"gws", dialGws},
	{"coder", dialCoder},
}

// readAll reads r to EOF into *buf (grown as needed) and returns the bytes.
func readAll(r io.Reader, buf *[]byte) ([]byte, error) {
	b := (*buf)[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			*buf = b
			return b, nil
		}
		if err != nil {
			*buf = b
			return nil, err
		}
	}
}

// ---- gorilla/websocket ----

type gorillaPeer struct {
	c   *websocket.Conn
	buf []byte
}

func dialGorilla(ctx context.Context, url string, tc *tls.Config, nd netDialFunc) (peerConn, error) {
	d := websocket.Dialer{ReadBufferSize: 64 << 10, WriteBufferSize: 4096, TLSClientConfig: tc, HandshakeTimeout: 10 * time.Second}
	if nd != nil {
		d.NetDialContext = nd
	}
	c, _, err := d.DialContext(ctx, url, nil)
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(16 << 20)
	return &gorillaPeer{c: c, buf: make([]byte, 0, 64<<10)}, nil
}

func (g *gorillaPeer) readOne(fn msgFunc) error {
	t, r, err := g.c.NextReader()
	if err != nil {
		return err
	}
	p, err := readAll(r, &g.buf)
	if err != nil {
		return err
	}
	fn(t == websocket.TextMessage, p)
	return nil
}

func (g *gorillaPeer) run(fn msgFunc) error {
	for {
		if err := g.readOne(fn); err != nil {
			return err
		}
	}
}
func (g *gorillaPeer) write(p []byte) error { return g.c.WriteMessage(websocket.BinaryMessage, p) }
func (g *gorillaPeer) close()               { g.c.Close() }

// ---- gobwas/ws ----

type gobwasPeer struct {
	nc  net.Conn
	br  *bufio.Reader
	hb  []byte
	buf []byte
}

func dialGobwas(ctx context.Context, url string, tc *tls.Config, nd netDialFunc) (peerConn, error) {
	d := gobwas.Dialer{TLSConfig: tc, Timeout: 10 * time.Second}
	if nd != nil {
		d.NetDial = nd
	}
	nc, br, _, err := d.Dial(ctx, url)
	if err != nil {
		return nil, err
	}
	var r io.Reader = nc
	if br != nil {
		r = io.MultiReader(br, nc)
	}
	return &gobwasPeer{nc: nc, br: bufio.NewReaderSize(r, 64<<10), hb: make([]byte, 0, gobwas.MaxHeaderSize), buf: make([]byte, 64<<10)}, nil
}

func (g *gobwasPeer) readOne(fn msgFunc) error {
	for {
		h, err := gobwas.ReadHeaderBuffer(g.br, g.hb)
		if err != nil {
			return err
		}
		if h.Length > 16<<20 {
			return errors.New("gobwas: frame too large")
		}
		if int(h.Length) > cap(g.buf) {
			g.buf = make([]byte, h.Length)
		}
		p := g.buf[:h.Length]
		if _, err := io.ReadFull(g.br, p); err != nil {
			return err
		}
		if h.Masked {
			gobwas.Cipher(p, h.Mask, 0)
		}
		switch h.OpCode {
		case gobwas.OpPing:
			wsutil.WriteClientMessage(g.nc, gobwas.OpPong, p)
			continue
		case gobwas.OpPong:
			continue
		case gobwas.OpClose:
			return io.EOF
		}
		fn(h.OpCode == gobwas.OpText, p)
		return nil
	}
}

func (g *gobwasPeer) run(fn msgFunc) error {
	for {
		if err := g.readOne(fn); err != nil {
			return err
		}
	}
}
func (g *gobwasPeer) write(p []byte) error { return wsutil.WriteClientBinary(g.nc, p) }
func (g *gobwasPeer) close()               { g.nc.Close() }

// ---- lxzan/gws ----

type gwsPeer struct {
	gws.BuiltinEventHandler
	c    *gws.Conn
	fn   msgFunc
	once sync.Once
	ch   chan []byte // readOne: copies of messages
	done chan struct{}
	err  error
}

func (g *gwsPeer) OnMessage(_ *gws.Conn, m *gws.Message) {
	g.fn(m.Opcode == gws.OpcodeText, m.Bytes())
	m.Close()
}

func (g *gwsPeer) OnClose(_ *gws.Conn, err error) {
	g.err = err
}

func dialGws(ctx context.Context, url string, tc *tls.Config, nd netDialFunc) (peerConn, error) {
	g := &gwsPeer{done: make(chan struct{})}
	opt := &gws.ClientOption{Addr: url, ReadBufferSize: 64 << 10, ReadMaxPayloadSize: 16 << 20, HandshakeTimeout: 10 * time.Second}
	if tc != nil {
		opt.TlsConfig = tc.Clone()
	}
	var c *gws.Conn
	var err error
	if nd != nil {
		nc, derr := nd(ctx, "tcp", "mem")
		if derr != nil {
			return nil, derr
		}
		c, _, err = gws.NewClientFromConn(g, opt, nc)
	} else {
		c, _, err = gws.NewClient(g, opt)
	}
	if err != nil {
		return nil, err
	}
	g.c = c
	return g, nil
}

func (g *gwsPeer) run(fn msgFunc) error {
	g.fn = fn
	g.c.ReadLoop()
	close(g.done)
	return g.err
}

func (g *gwsPeer) readOne(fn msgFunc) error {
	g.once.Do(func() {
		g.ch = make(chan []byte, 1)
		g.fn = func(text bool, p []byte) { g.ch <- append([]byte(nil), p...) }
		go func() { g.c.ReadLoop(); close(g.ch) }()
	})
	p, ok := <-g.ch
	if !ok {
		return io.EOF
	}
	fn(false, p)
	return nil
}

func (g *gwsPeer) write(p []byte) error { return g.c.WriteMessage(gws.OpcodeBinary, p) }
func (g *gwsPeer) close()               { g.c.NetConn().Close() }

// ---- coder/websocket ----

type coderPeer struct {
	c   *coder.Conn
	buf []byte
}

func dialCoder(ctx context.Context, url string, tc *tls.Config, nd netDialFunc) (peerConn, error) {
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: false}
	if nd != nil {
		tr.DialContext = nd
	}
	c, _, err := coder.Dial(ctx, url, &coder.DialOptions{HTTPClient: &http.Client{Transport: tr}, CompressionMode: coder.CompressionDisabled})
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(16 << 20)
	return &coderPeer{c: c, buf: make([]byte, 0, 64<<10)}, nil
}

func (c *coderPeer) readOne(fn msgFunc) error {
	t, r, err := c.c.Reader(context.Background())
	if err != nil {
		return err
	}
	p, err := readAll(r, &c.buf)
	if err != nil {
		return err
	}
	fn(t == coder.MessageText, p)
	return nil
}

func (c *coderPeer) run(fn msgFunc) error {
	for {
		if err := c.readOne(fn); err != nil {
			return err
		}
	}
}
func (c *coderPeer) write(p []byte) error {
	return c.c.Write(context.Background(), coder.MessageBinary, p)
}
func (c *coderPeer) close() { c.c.CloseNow() }

// ---- in-memory server for the decode workload ----

// memConn is a net.Conn whose peer is a WebSocket server that answers the
// opening handshake and then serves a fixed byte stream in reads of at most
// chunk bytes, then io.EOF. Writes after the handshake are discarded.
type memConn struct {
	req   []byte
	out   []byte // response then data
	data  []byte
	chunk int
	hs    bool
	reqMu sync.Mutex
	ready chan struct{} // closed when the whole upgrade request was written
}

func newMemConn(data []byte, chunk int) *memConn {
	return &memConn{data: data, chunk: chunk, ready: make(chan struct{})}
}

func (m *memConn) Read(b []byte) (int, error) {
	if !m.hs {
		<-m.ready // net/http reads concurrently with writing the request
		m.reqMu.Lock()
		i := bytes.Index(m.req, []byte("\r\n\r\n"))
		m.reqMu.Unlock()
		if i < 0 {
			return 0, errors.New("memconn: no upgrade request")
		}
		key := ""
		for _, l := range strings.Split(string(m.req[:i]), "\r\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(strings.TrimSpace(k), "Sec-WebSocket-Key") {
				key = strings.TrimSpace(v)
			}
		}
		m.hs = true
		resp := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + ws.AcceptKey(key) + "\r\n\r\n"
		return copy(b, resp), nil // the response fits any sane first read
	}
	if len(m.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(b), m.chunk, len(m.data))
	copy(b, m.data[:n])
	m.data = m.data[n:]
	return n, nil
}

func (m *memConn) Write(b []byte) (int, error) {
	m.reqMu.Lock()
	defer m.reqMu.Unlock()
	select {
	case <-m.ready:
		return len(b), nil // after the handshake: discarded
	default:
	}
	m.req = append(m.req, b...)
	if bytes.Contains(m.req, []byte("\r\n\r\n")) {
		close(m.ready)
	}
	return len(b), nil
}
func (m *memConn) Close() error                     { return nil }
func (m *memConn) LocalAddr() net.Addr              { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }
func (m *memConn) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2} }
func (m *memConn) SetDeadline(time.Time) error      { return nil }
func (m *memConn) SetReadDeadline(time.Time) error  { return nil }
func (m *memConn) SetWriteDeadline(time.Time) error { return nil }
