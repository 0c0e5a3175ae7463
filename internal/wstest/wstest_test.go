package wstest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/talaris-go/talaris/ws"
)

var servers = []struct {
	name string
	new  func() *Server
}{
	{"gorilla", NewGorilla},
	{"coder", NewCoder},
}

func dial(t *testing.T, url string, subprotocols ...string) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{Subprotocols: subprotocols, HandshakeTimeout: 5 * time.Second}
	c, resp, err := d.Dial(url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	resp.Body.Close()
	t.Cleanup(func() { c.Close() })
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	return c
}

func checkNoErrors(t *testing.T, s *Server) {
	t.Helper()
	s.Close()
	for _, err := range s.Errors() {
		t.Error(err)
	}
}

func TestPayload(t *testing.T) {
	p := Payload(0x0102030405, 16)
	if binary.LittleEndian.Uint64(p) != 0x0102030405 || len(p) != 16 {
		t.Errorf("Payload: % x", p)
	}
	if string(Payload(7, 100)) != string(Payload(7, 100)) || string(Payload(7, 100)) == string(Payload(8, 100)) {
		t.Error("Payload not deterministic or not distinct")
	}
	for _, size := range []int{0, 3, 8, 200} {
		tp := TextPayload(12345, size)
		if len(tp) != size {
			t.Fatalf("len %d", len(tp))
		}
		for _, b := range tp {
			if !strings.ContainsRune(alnum, rune(b)) {
				t.Fatalf("TextPayload has %q", b)
			}
		}
	}
	if got := string(TextPayload(0xabc, 10)[:8]); got != "00000abc" {
		t.Errorf("TextPayload seq %q", got)
	}
	// Fragments of AppendStreamMessage reassemble to the payload.
	var p2 ws.Parser
	var got [][]byte
	var pings []string
	wire := AppendStreamMessage(nil, ws.OpText, 9, 10, 3, true)
	err := p2.Feed(wire, func(op ws.Opcode, b []byte) { got = append(got, append([]byte(nil), b...)) },
		func(op ws.Opcode, b []byte) { pings = append(pings, string(b)) })
	if err != nil || len(got) != 1 || string(got[0]) != string(TextPayload(9, 10)) || fmt.Sprint(pings) != "[p9 p9]" {
		t.Errorf("AppendStreamMessage: %v %q %v", err, got, pings)
	}
}

func TestChecker(t *testing.T) {
	for _, size := range []int{0, 5, 8, 64} {
		c := NewChecker(size)
		for i := range 10 {
			if err := c.Check(Payload(i, size)); err != nil {
				t.Fatal(err)
			}
		}
		if c.Count() != 10 || c.Sum() != StreamSum(ws.OpBinary, 10, size) {
			t.Errorf("size %d: count %d sum %x want %x", size, c.Count(), c.Sum(), StreamSum(ws.OpBinary, 10, size))
		}
		if size > 0 {
			if c.Check(Payload(11, size)) == nil {
				t.Errorf("size %d: skipped message accepted", size)
			}
			if c.Check(Payload(9, size)) == nil {
				t.Errorf("size %d: repeated message accepted", size)
			}
		}
		if c.Check(Payload(10, size+1)) == nil {
			t.Errorf("size %d: wrong length accepted", size)
		}
		if err := c.Check(Payload(10, size)); err != nil || c.Count() != 11 {
			t.Errorf("size %d: after failures: %v", size, err)
		}
	}
	tc := NewTextChecker(20)
	if err := tc.Check(TextPayload(0, 20)); err != nil {
		t.Error(err)
	}
	if tc.Check(Payload(1, 20)) == nil {
		t.Error("binary accepted by text checker")
	}
}

// readStream reads a /stream with a gorilla client, checking every message
// and counting pings, and expects close 1000 "done".
func readStream(t *testing.T, url string, op ws.Opcode, size int) (*Checker, int) {
	c := dial(t, url)
	var pings atomic.Int64
	c.SetPingHandler(func(s string) error {
		if !strings.HasPrefix(s, "p") {
			t.Errorf("ping payload %q", s)
		}
		pings.Add(1)
		return c.WriteControl(websocket.PongMessage, []byte(s), time.Now().Add(time.Second))
	})
	chk := NewChecker(size)
	wantType := websocket.BinaryMessage
	if op == ws.OpText {
		chk, wantType = NewTextChecker(size), websocket.TextMessage
	}
	for {
		typ, p, err := c.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != 1000 || ce.Text != "done" {
				t.Fatalf("after %d messages: %v", chk.Count(), err)
			}
			return chk, int(pings.Load())
		}
		if typ != wantType {
			t.Fatalf("message type %d", typ)
		}
		if err := chk.Check(p); err != nil {
			t.Fatal(err)
		}
	}
}

func TestStream(t *testing.T) {
	cases := []struct {
		query     string
		n, size   int
		op        ws.Opcode
		wantPings int
	}{
		{"n=1000&size=64&frag=3&ping=1", 1000, 64, ws.OpBinary, 2000},
		{"n=200&size=100&op=text", 200, 100, ws.OpText, 0},
		{"n=50&size=5&frag=7&op=text", 50, 5, ws.OpText, 0},
		{"n=20&size=0&ping=1", 20, 0, ws.OpBinary, 20},
		{"n=3&size=200000&frag=2", 3, 200000, ws.OpBinary, 0},
	}
	for _, srv := range servers {
		for _, tc := range cases {
			t.Run(srv.name+"/"+tc.query, func(t *testing.T) {
				s := srv.new().Start(t)
				chk, pings := readStream(t, s.URL+"/stream?"+tc.query, tc.op, tc.size)
				if chk.Count() != tc.n || pings != tc.wantPings {
					t.Errorf("got %d messages %d pings, want %d, %d", chk.Count(), pings, tc.n, tc.wantPings)
				}
				if chk.Sum() != StreamSum(tc.op, tc.n, tc.size) {
					t.Error("checksum mismatch")
				}
				checkNoErrors(t, s)
			})
		}
	}
}

func TestEcho(t *testing.T) {
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			s := srv.new().Start(t)
			c := dial(t, s.URL+"/echo")
			msgs := []struct {
				typ int
				p   string
			}{{websocket.TextMessage, "hello"}, {websocket.BinaryMessage, "\x00\xff"}, {websocket.TextMessage, ""}, {websocket.BinaryMessage, strings.Repeat("b", 100000)}}
			for _, m := range msgs {
				if err := c.WriteMessage(m.typ, []byte(m.p)); err != nil {
					t.Fatal(err)
				}
				typ, p, err := c.ReadMessage()
				if err != nil || typ != m.typ || string(p) != m.p {
					t.Fatalf("echo: %d %d bytes %v", typ, len(p), err)
				}
			}
			c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(4000, "bye"))
			_, _, err := c.ReadMessage()
			var ce *websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != 4000 {
				t.Fatalf("close reply: %v", err)
			}
			checkNoErrors(t, s)
		})
	}
}

func TestClose(t *testing.T) {
	cases := []struct {
		query  string
		after  int
		code   int
		reason string
	}{
		{"code=4001&reason=bye&after=2", 2, 4001, "bye"},
		{"", 0, 1000, ""},
		{"code=1001&reason=going", 0, 1001, "going"},
		{"code=0", 0, websocket.CloseNoStatusReceived, ""}, // empty close body
	}
	for _, srv := range servers {
		for _, tc := range cases {
			t.Run(srv.name+"/"+tc.query, func(t *testing.T) {
				s := srv.new().Start(t)
				c := dial(t, s.URL+"/close?"+tc.query)
				for i := range tc.after {
					c.WriteMessage(websocket.TextMessage, []byte(fmt.Sprint(i)))
				}
				_, _, err := c.ReadMessage()
				var ce *websocket.CloseError
				if !errors.As(err, &ce) || ce.Code != tc.code || ce.Text != tc.reason {
					t.Fatalf("got %v, want close %d %q", err, tc.code, tc.reason)
				}
				// gorilla's client answered the close; the server then
				// closes TCP.
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := c.NetConn().Read(make([]byte, 1)); err != io.EOF {
					t.Errorf("after close handshake: %v, want EOF", err)
				}
				checkNoErrors(t, s)
			})
		}
	}
}

func TestDrop(t *testing.T) {
	for _, srv := range servers {
		for _, rst := range []string{"0", "1"} {
			t.Run(srv.name+"/rst="+rst, func(t *testing.T) {
				s := srv.new().Start(t)
				c := dial(t, s.URL+"/drop?n=5&size=16&rst="+rst)
				chk := NewChecker(16)
				var err error
				for {
					var p []byte
					if _, p, err = c.ReadMessage(); err != nil {
						break
					}
					if err := chk.Check(p); err != nil {
						t.Fatal(err)
					}
				}
				var ce *websocket.CloseError
				if chk.Count() != 5 || !errors.As(err, &ce) || ce.Code != websocket.CloseAbnormalClosure {
					if rst == "0" || chk.Count() > 5 { // a reset may discard unread data
						t.Fatalf("%d messages, %v", chk.Count(), err)
					}
				}
				checkNoErrors(t, s)
			})
		}
	}
}

func TestCollect(t *testing.T) {
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			s := srv.new()
			var hooked atomic.Int64
			s.OnMessage = func(op ws.Opcode, p []byte) { hooked.Add(1) }
			s.Start(t)
			c := dial(t, s.URL+"/collect")
			for i := range 10 {
				c.WriteMessage(websocket.BinaryMessage, Payload(i, 32))
			}
			c.WriteMessage(websocket.TextMessage, []byte("last"))
			c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(1000, ""))
			if _, _, err := c.ReadMessage(); !websocket.IsCloseError(err, 1000) {
				t.Fatalf("close: %v", err)
			}
			checkNoErrors(t, s) // waits for the handler
			got := s.Collected()
			chk := NewChecker(32)
			for _, m := range got[:10] {
				if m.Op != ws.OpBinary {
					t.Error("op", m.Op)
				}
				if err := chk.Check(m.Payload); err != nil {
					t.Error(err)
				}
			}
			if len(got) != 11 || got[10].Op != ws.OpText || string(got[10].Payload) != "last" || hooked.Load() != 11 {
				t.Errorf("collected %d, hook %d", len(got), hooked.Load())
			}
		})
	}
}

func TestSubproto(t *testing.T) {
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			s := srv.new().Start(t)
			for _, offer := range [][]string{{"x", Subprotocol}, nil} {
				c := dial(t, s.URL+"/subproto", offer...)
				want := ""
				if offer != nil {
					want = Subprotocol
				}
				typ, p, err := c.ReadMessage()
				if err != nil || typ != websocket.TextMessage || string(p) != want || c.Subprotocol() != want {
					t.Fatalf("offer %v: %q %q %v", offer, p, c.Subprotocol(), err)
				}
				c.WriteMessage(websocket.TextMessage, []byte("echo"))
				if _, p, err := c.ReadMessage(); err != nil || string(p) != "echo" {
					t.Fatalf("echo after subproto: %q %v", p, err)
				}
				c.Close()
			}
			checkNoErrors(t, s)
		})
	}
}

func TestRawServer(t *testing.T) {
	done := make(chan error, 1)
	s := NewRaw(func(c *RawConn) {
		done <- func() error {
			c.SetDeadline(10 * time.Second)
			// Fragmented text with a ping inside, chopped into 1-byte writes.
			wire := AppendStreamMessage(nil, ws.OpText, 0, 20, 3, true)
			if err := c.WriteChopped(wire, 1, 0); err != nil {
				return err
			}
			// Non-minimal 64-bit length.
			if err := c.WriteFrameLen(ws.Header{Fin: true, Op: ws.OpBinary, Length: 3}, 8, []byte("abc")); err != nil {
				return err
			}
			// Client frames are masked; both pings were answered.
			for range 2 {
				h, p, err := c.ReadFrame()
				if err != nil || h.Op != ws.OpPong || string(p) != "p0" || !h.Masked {
					return fmt.Errorf("pong: %+v %q %v", h, p, err)
				}
			}
			op, p, err := c.ReadMessage()
			if err != nil || op != ws.OpText || string(p) != "from client" {
				return fmt.Errorf("client message: %v %q %v", op, p, err)
			}
			if err := c.WriteClose(4002, "raw"); err != nil {
				return err
			}
			code, reason, err := c.ExpectClose()
			if err != nil || code != 4002 || reason != "" {
				return fmt.Errorf("client close: %d %q %v", code, reason, err)
			}
			return c.Close()
		}()
	})
	s.Extra = ws.AppendFrame(nil, true, ws.OpBinary, []byte("early")) // same write as the 101
	s.Header = http.Header{"X-Test": {"1"}}
	s.Start(t)

	c, resp, err := websocket.DefaultDialer.Dial(s.URL+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if resp.Header.Get("X-Test") != "1" {
		t.Error("extra header missing")
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	want := []string{"early", string(TextPayload(0, 20)), "abc"}
	for _, w := range want {
		_, p, err := c.ReadMessage()
		if err != nil || string(p) != w {
			t.Fatalf("got %q %v, want %q", p, err, w)
		}
	}
	c.WriteMessage(websocket.TextMessage, []byte("from client"))
	_, _, cerr := c.ReadMessage()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !websocket.IsCloseError(cerr, 4002) {
		t.Fatalf("close: %v", cerr)
	}
	s.Close()
	if errs := s.HandshakeErrors(); len(errs) != 0 {
		t.Fatal(errs)
	}
}

func TestRawServerHandshake(t *testing.T) {
	s := NewRaw(func(c *RawConn) { c.Reset() }).Start(t)
	// A plain HTTP request is rejected with 400.
	resp, err := http.Get("http" + strings.TrimPrefix(s.URL, "ws") + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("status %d", resp.StatusCode)
	}
	// A valid handshake followed by a reset.
	c, _, err := websocket.DefaultDialer.Dial(s.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := c.ReadMessage(); err == nil {
		t.Error("read after reset succeeded")
	}
	c.Close()
	s.Close()
	if errs := s.HandshakeErrors(); len(errs) != 1 || !strings.Contains(errs[0].Error(), "Upgrade") {
		t.Errorf("handshake errors: %v", errs)
	}

	// A custom response with the accept key placeholder, and a wrong one.
	ok := NewRaw(func(c *RawConn) { c.WriteClose(1000, ""); c.ExpectClose() })
	ok.Response = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: WebSocket\r\nConnection: upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
	ok.Start(t)
	c, _, err = websocket.DefaultDialer.Dial(ok.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	bad := NewRaw(nil)
	bad.Response = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: AAAA\r\n\r\n"
	bad.Start(t)
	if _, _, err := websocket.DefaultDialer.Dial(bad.URL, nil); err == nil {
		t.Error("bad accept key accepted by the client")
	}
}

func TestRawReadFrameRejectsUnmasked(t *testing.T) {
	got := make(chan error, 1)
	s := NewRaw(func(c *RawConn) {
		_, _, err := c.ReadFrame()
		got <- err
	}).Start(t)
	c, _, err := websocket.DefaultDialer.Dial(s.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.NetConn().Write(ws.AppendFrame(nil, true, ws.OpText, []byte("x"))) // unmasked
	if err := <-got; err != ws.ErrUnmaskedClientFrame {
		t.Fatalf("got %v", err)
	}
}

func TestServerCloseWithOpenConnections(t *testing.T) {
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			s := srv.new().Start(nil)
			c := dial(t, s.URL+"/echo")
			done := make(chan struct{})
			go func() { s.Close(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Close hangs with an open connection")
			}
			if _, _, err := c.ReadMessage(); err == nil {
				t.Error("connection still open")
			}
			s.Close() // idempotent
		})
	}
}
