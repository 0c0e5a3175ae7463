//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"crypto/tls"
	"io"
	"testing"
	"time"

	. "github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// TestTLSCloseNotifyLater: the server answers our close frame, then sends
// its close_notify in a later TCP segment and keeps TCP open (no FIN)
// until we end. Both close frames and both close_notifys have crossed, so
// the connection ends cleanly at once (EventClose 1000). Before the fix
// the loop dropped every byte after the close frame, never saw the
// close_notify and waited out CloseTimeout (5 s: ErrCloseTimeout). A
// server that sends something the TLS layer refuses after the close frame
// ends the stream the same way (nothing after the close handshake is a
// failure). TLS 1.2 and 1.3, our record layer and the library's.
func TestTLSCloseNotifyLater(t *testing.T) {
	closeFrame := ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(1000, ""))
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		for _, lib := range []bool{false, true} {
			if lib && v == tls.VersionTLS12 {
				continue // TLS 1.2 always takes the library's path
			}
			for _, garbage := range []bool{false, true} {
				name := tls.VersionName(v) + map[bool]string{false: "/ours", true: "/library"}[lib] +
					map[bool]string{false: "/close_notify", true: "/garbage"}[garbage]
				t.Run(name, func(t *testing.T) {
					done := make(chan struct{})
					defer close(done)
					cfg := serverTLS(t, testCertFile, testKeyFile, v, v)
					cfg.NextProtos = []string{"http/1.1"}
					url := tlsRawServer(t, cfg, func(tc *tls.Conn, bc *batchConn, br *bufio.Reader) {
						for i := 0; i < 10; i++ {
							tc.Write(ws.AppendFrame(nil, true, ws.OpBinary, wstest.Payload(i, 100)))
						}
						readClose(br)
						tc.Write(closeFrame)
						time.Sleep(20 * time.Millisecond) // a segment of its own
						if garbage {
							bc.Conn.Write([]byte{23, 3, 3, 0, 40, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
								21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40}) // a record no key opens
						} else {
							tc.CloseWrite() // close_notify; TCP stays open
						}
						io.Copy(io.Discard, br) // the client's close_notify and FIN
						select {                // and still no FIN of ours while the client may wait
						case <-done:
						case <-time.After(5 * time.Second):
						}
					})
					p := newTestPool(t, Config{NoTLSRecordLayer: lib, CloseTimeout: 2 * time.Second}, hangGuard)
					ctx, cancel := dialCtx(t)
					c, err := p.Dial(ctx, url, tlsOpts)
					cancel()
					if err != nil {
						t.Fatal(err)
					}
					chk := wstest.NewChecker(100)
					if f := pumpCount(t, p, c, chk, 10); f != nil {
						t.Fatalf("ended early: %+v", *f)
					}
					if err := c.Close(CloseNormal, ""); err != nil {
						t.Fatal(err)
					}
					f := pumpCount(t, p, c, chk, 1<<30)
					if f == nil || f.Kind != EventClose || f.Code != 1000 {
						t.Fatalf("final %+v, want EventClose 1000 (the close handshake and the close_notify crossed)", f)
					}
				})
			}
		}
	}
}
