// Command reconsrv is the WebSocket server process the reconnect tests
// kill (SIGKILL) and restart on the same port: it must be a process of its
// own so the kernel, not Go, ends its sockets. gorilla/websocket serves
// every connection: it prints "OPEN n" and "MSG n <text>" for every text
// message received on connection n (one line each, to stdout) and sends
// "tick" text messages every 10 ms.
//
// Flags: -addr host:port; -cert and -key for wss:// (ALPN http/1.1).
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

var outMu sync.Mutex

func say(format string, a ...any) {
	outMu.Lock()
	defer outMu.Unlock()
	fmt.Fprintf(os.Stdout, format+"\n", a...)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "listen address")
	cert := flag.String("cert", "", "PEM certificate (wss)")
	key := flag.String("key", "", "PEM key (wss)")
	flag.Parse()

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(1)
	}
	if *cert != "" {
		kp, err := tls.LoadX509KeyPair(*cert, *key)
		if err != nil {
			fmt.Fprintln(os.Stderr, "tls:", err)
			os.Exit(1)
		}
		ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{kp}, NextProtos: []string{"http/1.1"}})
	}
	var conns atomic.Int64
	up := websocket.Upgrader{CheckOrigin: func(*http.Request) bool { return true }}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		n := conns.Add(1)
		say("OPEN %d", n)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				op, b, err := c.ReadMessage()
				if err != nil {
					return
				}
				if op == websocket.TextMessage {
					say("MSG %d %s", n, b)
				}
			}
		}()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				c.Close()
				return
			case <-t.C:
				if c.WriteMessage(websocket.TextMessage, []byte("tick")) != nil {
					c.Close()
					return
				}
			}
		}
	})
	say("READY %s", ln.Addr())
	http.Serve(ln, h)
}
