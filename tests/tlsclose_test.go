//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"crypto/tls"
	"io"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// TestTLSCloseNotifyLater: the server answers our close frame, then, in a
// later TCP segment, ends its TLS stream, and keeps TCP open until we end
// (or closes it). Both close frames have crossed, so the connection ends
// cleanly at once (EventClose 1000), for every way the stream ends:
//   - close_notify: its close_notify (before the fix the loop dropped every
//     byte after the close frame, never saw it and waited out CloseTimeout:
//     ErrCloseTimeout; found by a hostile review, both backends);
//   - junk: a record no key opens (nothing after the close handshake is a
//     failure: it ends the stream as a close_notify would);
//   - junk2, junk2+fin: two such records in one segment, then nothing or a
//     FIN (found by a review of the fix: the second record, still queued,
//     held the end until CloseTimeout, even after the FIN).
//
// TLS 1.2 and 1.3, our record layer and the library's.
func TestTLSCloseNotifyLater(t *testing.T) {
	closeFrame := ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(1000, ""))
	rec := []byte{23, 3, 3, 0, 40} // an application_data record of 40 bytes no key opens
	for i := 1; i <= 40; i++ {
		rec = append(rec, byte(i))
	}
	ends := map[string]func(tc *tls.Conn, bc *batchConn) (fin bool){
		"close_notify": func(tc *tls.Conn, _ *batchConn) bool { tc.CloseWrite(); return false },
		"junk":         func(_ *tls.Conn, bc *batchConn) bool { bc.Conn.Write(rec); return false },
		"junk2": func(_ *tls.Conn, bc *batchConn) bool {
			bc.Conn.Write(append(rec[:len(rec):len(rec)], rec...))
			return false
		},
		"junk2+fin": func(_ *tls.Conn, bc *batchConn) bool {
			bc.Conn.Write(append(rec[:len(rec):len(rec)], rec...))
			return true
		},
	}
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		for _, lib := range []bool{false, true} {
			if lib && v == tls.VersionTLS12 {
				continue // TLS 1.2 always takes the library's path
			}
			for _, end := range []string{"close_notify", "junk", "junk2", "junk2+fin"} {
				name := tls.VersionName(v) + map[bool]string{false: "/ours/", true: "/library/"}[lib] + end
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
						if ends[end](tc, bc) {
							time.Sleep(20 * time.Millisecond)
							bc.Conn.Close() // and a FIN
							return
						}
						io.Copy(io.Discard, br) // the client's close_notify and FIN
						select {                // and still no FIN of ours while the client may wait
						case <-done:
						case <-time.After(5 * time.Second):
						}
					})
					p := newTestPool(t, talaris.Config{NoTLSRecordLayer: lib, CloseTimeout: 2 * time.Second}, hangGuard)
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
					if err := c.Close(talaris.CloseNormal, ""); err != nil {
						t.Fatal(err)
					}
					f := pumpCount(t, p, c, chk, 1<<30)
					if f == nil || f.Kind != talaris.EventClose || f.Code != 1000 {
						t.Fatalf("final %+v, want EventClose 1000 (the close handshake crossed and the stream ended)", f)
					}
				})
			}
		}
	}
}
