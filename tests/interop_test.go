//go:build linux && cgo

package talaris_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
)

// TestPythonWebsockets streams from Python's websockets (an independent
// WebSocket implementation) over ws:// and wss:// and checks every message,
// the clean close and an echo round trip.
func TestPythonWebsockets(t *testing.T) {
	for _, tls := range []bool{false, true} {
		name, scheme, opts := "ws", "ws", (*talaris.DialOptions)(nil)
		if tls {
			name, scheme, opts = "wss", "wss", &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAFile: "../testdata/ca.pem"}}
		}
		t.Run(name, func(t *testing.T) {
			port := startPythonPeer(t, tls)
			p, err := talaris.NewPool(talaris.Config{})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const n, size = 5000, 100
			c, err := p.Dial(ctx, fmt.Sprintf("%s://127.0.0.1:%s/stream?n=%d&size=%d", scheme, port, n, size), opts)
			if err != nil {
				t.Fatal(err)
			}
			var got uint64
			var final *talaris.Event
			for final == nil {
				if _, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
					switch ev.Kind {
					case talaris.EventBinary:
						if len(ev.Payload) != size || binary.LittleEndian.Uint64(ev.Payload) != got {
							t.Fatalf("message %d: bad payload (len %d)", got, len(ev.Payload))
						}
						for i := 8; i < size; i++ {
							if ev.Payload[i] != byte(int(got)+i) {
								t.Fatalf("message %d: byte %d is %d", got, i, ev.Payload[i])
							}
						}
						got++
					case talaris.EventClose, talaris.EventError:
						e := ev
						e.Reason = append([]byte(nil), ev.Reason...)
						final = &e
					}
				}); err != nil {
					t.Fatal(err)
				}
			}
			if got != n || final.Kind != talaris.EventClose || final.Code != 1000 || string(final.Reason) != "done" {
				t.Fatalf("got %d/%d messages, final %v code %d reason %q err %v", got, n, final.Kind, final.Code, final.Reason, final.Err)
			}
			_ = c

			e, err := p.Dial(ctx, fmt.Sprintf("%s://127.0.0.1:%s/echo", scheme, port), opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := e.SendText([]byte("héllo from talaris")); err != nil {
				t.Fatal(err)
			}
			echoed := ""
			for echoed == "" {
				if _, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
					if cc == e && ev.Kind == talaris.EventText {
						echoed = string(ev.Payload)
					}
				}); err != nil {
					t.Fatal(err)
				}
			}
			if echoed != "héllo from talaris" {
				t.Fatalf("echo %q", echoed)
			}
			if err := e.Close(1000, "bye"); err != nil {
				t.Fatal(err)
			}
			closed := false
			for !closed {
				if _, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
					if cc == e && (ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError) {
						if ev.Kind != talaris.EventClose || ev.Code != 1000 {
							t.Errorf("close: %v %d %v", ev.Kind, ev.Code, ev.Err)
						}
						closed = true
					}
				}); err != nil {
					t.Fatalf("pump before the echo connection's close: %v", err)
				}
			}
		})
	}
}
