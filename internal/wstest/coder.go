package wstest

import (
	"bufio"
	"context"
	"net"
	"net/http"

	"github.com/coder/websocket"
	"github.com/talaris-go/talaris/ws"
)

// NewCoder returns an unstarted Server whose endpoints are implemented with
// github.com/coder/websocket.
func NewCoder() *Server {
	return &Server{name: "coder", upgrade: coderUpgrade}
}

// hijackRecorder records the connection coder/websocket hijacks, so that
// raw frames can be written and /drop can close TCP. coder keeps using the
// same bufio.ReadWriter, which makes mixing safe between its operations.
type hijackRecorder struct {
	http.ResponseWriter
	nc  net.Conn
	brw *bufio.ReadWriter
}

// Hijack implements http.Hijacker.
func (h *hijackRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	nc, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	h.nc, h.brw = nc, brw
	return nc, brw, err
}

func coderUpgrade(w http.ResponseWriter, r *http.Request, subprotocols []string) (conn, error) {
	hr := &hijackRecorder{ResponseWriter: w}
	c, err := websocket.Accept(hr, r, &websocket.AcceptOptions{
		Subprotocols:       subprotocols,
		InsecureSkipVerify: true, // any Origin
		CompressionMode:    websocket.CompressionDisabled,
	})
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(MaxReadFrame)
	return &coderConn{c: c, nc: hr.nc, brw: hr.brw}, nil
}

// coderConn adapts a coder connection to conn.
type coderConn struct {
	c   *websocket.Conn
	nc  net.Conn
	brw *bufio.ReadWriter
}

func (c *coderConn) ReadMessage() (ws.Opcode, []byte, error) {
	t, p, err := c.c.Read(context.Background())
	if err != nil {
		return 0, nil, err
	}
	if t == websocket.MessageText {
		return ws.OpText, p, nil
	}
	return ws.OpBinary, p, nil
}

func (c *coderConn) WriteMessage(op ws.Opcode, p []byte) error {
	t := websocket.MessageBinary
	if op == ws.OpText {
		t = websocket.MessageText
	}
	return c.c.Write(context.Background(), t, p)
}

// WriteRaw goes through coder's own buffered writer, which coder flushes
// after every complete message, so the byte order is preserved.
func (c *coderConn) WriteRaw(b []byte) error {
	if _, err := c.brw.Writer.Write(b); err != nil {
		return err
	}
	return c.brw.Writer.Flush()
}

func (c *coderConn) CloseHandshake(code int, reason string) error {
	if ws.ValidReceivedCloseCode(code) && len(reason) <= 123 {
		// coder waits for the client's close itself.
		return c.c.Close(websocket.StatusCode(code), reason)
	}
	// coder refuses codes that may not be on the wire: write the close
	// frame raw and read the client's frames raw from coder's reader.
	if err := c.WriteRaw(ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(code, reason))); err != nil {
		return err
	}
	readClientClose(c.nc, c.brw.Reader)
	return c.nc.Close()
}

func (c *coderConn) NetConn() net.Conn   { return c.nc }
func (c *coderConn) Subprotocol() string { return c.c.Subprotocol() }
func (c *coderConn) CloseNow()           { c.c.CloseNow() }
