//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// TLS peers for the tests: certificates and options, gorilla and coder
// over TLS, and a raw TLS server whose writes the test batches itself.

const (
	testCAFile     = "../testdata/ca.pem"
	testCertFile   = "../testdata/server.pem"
	testKeyFile    = "../testdata/server-key.pem"
	expiredCert    = "../testdata/expired.pem"
	expiredKey     = "../testdata/expired-key.pem"
	otherCAFile    = "../testdata/other-ca.pem"
	tlsDialTimeout = 60 * time.Second
)

// tlsOpts verifies against the test CA.
var tlsOpts = &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAFile: testCAFile}}

// serverTLS returns a server config with cert/key restricted to versions
// [minV, maxV] (0: crypto/tls defaults).
func serverTLS(t testing.TB, certFile, keyFile string, minV, maxV uint16) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: minV, MaxVersion: maxV}
}

// forEachTLSServer runs fn per server library, on a wss:// server with cfg.
func forEachTLSServer(t *testing.T, cfg *tls.Config, fn func(t *testing.T, srv *wstest.Server)) {
	for _, k := range serverKinds {
		t.Run(k.name, func(t *testing.T) {
			srv := k.new().StartTLS(t, cfg)
			fn(t, srv)
			if errs := srv.Errors(); len(errs) > 0 {
				t.Errorf("server errors: %v", errs)
			}
		})
	}
}

// batchConn holds writes until Flush, so many TLS records leave in one
// TCP write (and land in one buffer slot of the client).
type batchConn struct {
	net.Conn
	hold bool
	buf  []byte
}

func (b *batchConn) Write(p []byte) (int, error) {
	if b.hold {
		b.buf = append(b.buf, p...)
		return len(p), nil
	}
	return b.Conn.Write(p)
}

func (b *batchConn) Flush() error {
	_, err := b.Conn.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}

// tlsRawServer accepts TLS connections, answers the WebSocket upgrade and
// runs handler. It returns the wss:// URL.
func tlsRawServer(t *testing.T, cfg *tls.Config, handler func(tc *tls.Conn, bc *batchConn, br *bufio.Reader)) string {
	t.Helper()
	l := newTrackedListener(t)
	l.run(func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			l.track(nc)
			l.run(func() {
				defer nc.Close()
				bc := &batchConn{Conn: nc}
				tc := tls.Server(bc, cfg)
				tc.SetDeadline(time.Now().Add(hangGuard))
				br := bufio.NewReader(tc)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				resp := "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
					ws.AcceptKey(req.Header.Get("Sec-WebSocket-Key")) + "\r\n\r\n"
				if _, err := io.WriteString(tc, resp); err != nil {
					return
				}
				handler(tc, bc, br)
			})
		}
	})
	return "wss://" + l.Addr().String()
}

// readClose reads client frames until its close frame.
func readClose(br *bufio.Reader) {
	for {
		var hdr [14]byte
		if _, err := io.ReadFull(br, hdr[:2]); err != nil {
			return
		}
		n := 4
		switch hdr[1] & 0x7f {
		case 126:
			n += 2
		case 127:
			n += 8
		}
		if _, err := io.ReadFull(br, hdr[2:2+n]); err != nil {
			return
		}
		h, _, err := ws.ParseHeader(hdr[:2+n], false)
		if err != nil {
			return
		}
		if _, err := io.CopyN(io.Discard, br, int64(h.Length)); err != nil {
			return
		}
		if h.Op == ws.OpClose {
			return
		}
	}
}

// pumpCount pumps until chk has seen want messages or c ended.
func pumpCount(t *testing.T, p *talaris.Pool, c talaris.Conn, chk *wstest.Checker, want int) *finalEvent {
	t.Helper()
	var final *finalEvent
	var chkErr error
	pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
		switch ev.Kind {
		case talaris.EventBinary:
			if chkErr == nil {
				chkErr = chk.Check(ev.Payload)
			}
		case talaris.EventClose, talaris.EventError:
			f := copyFinal(ev)
			final = &f
		}
	}, func() bool { return chkErr != nil || final != nil || chk.Count() >= want }, nil)
	if chkErr != nil {
		t.Fatal(chkErr)
	}
	return final
}
