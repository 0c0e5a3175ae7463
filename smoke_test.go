//go:build linux && cgo

package talaris

import (
	"context"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

func TestSmoke(t *testing.T) {
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64)
		for i := 0; i < 100000; i++ {
			binary.LittleEndian.PutUint64(buf, uint64(i))
			c.WriteMessage(websocket.BinaryMessage, buf)
		}
		c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(1000, "done"))
		c.ReadMessage()
	}))
	defer srv.Close()
	p, err := NewPool(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := p.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/", nil)
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
	t.Logf("got %d in %v; stats %+v conn %+v state %v", next, time.Since(start), p.Stats(), c.Stats(), c.State())
	if next != 100000 {
		t.Fatal("lost")
	}
}
