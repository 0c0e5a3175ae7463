//go:build linux && cgo

package talaris

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

func TestTLSSmoke(t *testing.T) {
	up := websocket.Upgrader{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 256)
		for i := 0; i < 100000; i++ {
			binary.LittleEndian.PutUint64(buf, uint64(i))
			c.WriteMessage(websocket.BinaryMessage, buf)
		}
		c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(1000, "done"))
		c.ReadMessage()
	}))
	cert, err := tls.LoadX509KeyPair("testdata/server.pem", "testdata/server-key.pem")
	if err != nil {
		t.Fatal(err)
	}
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	defer srv.Close()
	p, err := NewPool(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := p.Dial(ctx, "wss"+strings.TrimPrefix(srv.URL, "https")+"/", &DialOptions{TLS: TLSOptions{RootCAFile: "testdata/ca.pem"}})
	if err != nil {
		t.Fatal(err)
	}
	next := uint64(0)
	done := false
	start := time.Now()
	for !done {
		_, err := p.Pump(func(cc Conn, ev Event) {
			switch ev.Kind {
			case EventBinary:
				if v := binary.LittleEndian.Uint64(ev.Payload); v != next {
					t.Fatalf("got %d want %d", v, next)
				}
				next++
			case EventClose:
				t.Logf("close %d %q", ev.Code, ev.Reason)
				done = true
			case EventError:
				t.Logf("error %v", ev.Err)
				done = true
			}
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%s: got %d in %v; stats %+v state %v", TLSBackend(), next, time.Since(start), p.Stats(), c.State())
	if next != 100000 {
		t.Fatal("lost")
	}
	_, err = p.Dial(ctx, "wss"+strings.TrimPrefix(srv.URL, "https")+"/", &DialOptions{TLS: TLSOptions{RootCAFile: "testdata/other-ca.pem"}})
	t.Logf("other CA: %v", err)
	_, err = p.Dial(ctx, "wss"+strings.TrimPrefix(srv.URL, "https")+"/", &DialOptions{TLS: TLSOptions{RootCAFile: "testdata/ca.pem", ServerName: "wrong.example"}})
	t.Logf("wrong name: %v", err)
	_, err = p.Dial(ctx, "wss"+strings.TrimPrefix(srv.URL, "https")+"/", nil)
	t.Logf("system store: %v", err)
}
