package wstest

import (
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
	"github.com/talaris-go/talaris/ws"
)

// NewGorilla returns an unstarted Server whose endpoints are implemented
// with github.com/gorilla/websocket.
func NewGorilla() *Server {
	return &Server{name: "gorilla", upgrade: gorillaUpgrade}
}

func gorillaUpgrade(w http.ResponseWriter, r *http.Request, subprotocols []string) (conn, error) {
	u := websocket.Upgrader{
		Subprotocols: subprotocols,
		CheckOrigin:  func(*http.Request) bool { return true },
	}
	c, err := u.Upgrade(w, r, nil)
	if err != nil {
		return nil, err
	}
	g := &gorillaConn{c: c}
	// Answer a client's close with the same code, unless we sent a close
	// first (then the handshake is complete and nothing more is sent).
	c.SetCloseHandler(func(code int, text string) error {
		if g.sentClose.Load() {
			return nil
		}
		g.sentClose.Store(true)
		p := []byte{}
		if code != websocket.CloseNoStatusReceived {
			p = ws.ClosePayload(code, "")
		}
		c.WriteControl(websocket.CloseMessage, p, time.Now().Add(time.Second))
		return nil
	})
	return g, nil
}

// gorillaConn adapts a gorilla connection to conn.
type gorillaConn struct {
	c         *websocket.Conn
	sentClose atomic.Bool
}

func (g *gorillaConn) ReadMessage() (ws.Opcode, []byte, error) {
	t, p, err := g.c.ReadMessage()
	if err != nil {
		return 0, nil, err
	}
	if t == websocket.TextMessage {
		return ws.OpText, p, nil
	}
	return ws.OpBinary, p, nil
}

func (g *gorillaConn) WriteMessage(op ws.Opcode, p []byte) error {
	t := websocket.BinaryMessage
	if op == ws.OpText {
		t = websocket.TextMessage
	}
	return g.c.WriteMessage(t, p)
}

// WriteRaw writes straight to the connection: gorilla flushes every frame
// it writes, so nothing of its own is pending between calls.
func (g *gorillaConn) WriteRaw(b []byte) error {
	_, err := g.c.NetConn().Write(b)
	return err
}

func (g *gorillaConn) CloseHandshake(code int, reason string) error {
	g.sentClose.Store(true)
	// gorilla does not validate close codes, so invalid ones go out as is.
	err := g.c.WriteControl(websocket.CloseMessage, ws.ClosePayload(code, reason), time.Now().Add(closeWait))
	if err != nil {
		return err
	}
	g.c.SetReadDeadline(time.Now().Add(closeWait))
	for {
		if _, _, err := g.c.NextReader(); err != nil {
			break // the client's close (or EOF, timeout)
		}
	}
	return g.c.Close()
}

func (g *gorillaConn) NetConn() net.Conn   { return g.c.NetConn() }
func (g *gorillaConn) Subprotocol() string { return g.c.Subprotocol() }
func (g *gorillaConn) CloseNow()           { g.c.Close() }
