//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/http/httptest"

	"github.com/talaris-go/talaris/ws"
)

// exampleServer is the venue the root examples talk to: a few lines of
// WebSocket server on net/http and the ws package, so the examples run as
// written (go test runs them and checks their Output) with no module
// beyond the library's own. Each connection is handed to serve, which
// reads and writes whole messages.
type exampleServer struct {
	*httptest.Server
	URL string // ws://127.0.0.1:port
}

// exampleConn is one server-side connection of exampleServer.
type exampleConn struct {
	nc net.Conn
	r  *bufio.Reader
}

func newExampleServer(serve func(c *exampleConn)) *exampleServer {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		nc, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer nc.Close()
		accept := ws.AcceptKey(r.Header.Get("Sec-WebSocket-Key"))
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n" +
			"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + "\r\n\r\n")
		if brw.Flush() != nil {
			return
		}
		serve(&exampleConn{nc: nc, r: brw.Reader})
	}))
	return &exampleServer{Server: s, URL: "ws" + s.URL[len("http"):]}
}

// read returns the next message from the client (unmasked), answering a
// close frame with one of its own; ok is false once the connection ended.
func (c *exampleConn) read() (op ws.Opcode, payload []byte, ok bool) {
	for {
		var hdr [14]byte
		if _, err := io.ReadFull(c.r, hdr[:2]); err != nil {
			return 0, nil, false
		}
		n := int64(hdr[1] & 0x7f)
		switch n {
		case 126:
			if _, err := io.ReadFull(c.r, hdr[:2]); err != nil {
				return 0, nil, false
			}
			n = int64(binary.BigEndian.Uint16(hdr[:2]))
		case 127:
			if _, err := io.ReadFull(c.r, hdr[:8]); err != nil {
				return 0, nil, false
			}
			n = int64(binary.BigEndian.Uint64(hdr[:8]))
		}
		op = ws.Opcode(hdr[0] & 0x0f)
		var key [4]byte
		if _, err := io.ReadFull(c.r, key[:]); err != nil || n > 1<<20 {
			return 0, nil, false
		}
		payload = make([]byte, n)
		if _, err := io.ReadFull(c.r, payload); err != nil {
			return 0, nil, false
		}
		ws.Mask(key, payload, 0)
		if op == ws.OpClose {
			c.nc.Write(ws.AppendFrame(nil, true, ws.OpClose, payload))
			return 0, nil, false
		}
		if op == ws.OpText || op == ws.OpBinary {
			return op, payload, true
		}
	}
}

// write sends one text message.
func (c *exampleConn) write(s string) {
	c.nc.Write(ws.AppendFrame(nil, true, ws.OpText, []byte(s)))
}

// close sends a close frame with code and reason and waits for the
// client's answer.
func (c *exampleConn) close(code int, reason string) {
	c.nc.Write(ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(code, reason)))
	for {
		if _, _, ok := c.read(); !ok {
			return
		}
	}
}
