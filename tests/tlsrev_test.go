//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"hash"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// Hostile-peer tests of our TLS 1.3 record layer (csrc/tlsrec.c): a Go
// crypto/tls server does the handshake and writes the 101 (its record 0,
// the library's last: the hand-over follows it), then the test writes
// records of its own making on the raw TCP connection, sealed with the
// server's application traffic secret from the KeyLogWriter (RFC 8446 5.2,
// 5.3, 7.1-7.3), so it can send what crypto/tls never would.

// keyLog keeps the SERVER_TRAFFIC_SECRET_0 line of one handshake.
type keyLog struct {
	mu     sync.Mutex
	secret []byte
}

func (k *keyLog) Write(p []byte) (int, error) {
	for _, line := range strings.Split(string(p), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "SERVER_TRAFFIC_SECRET_0" {
			if s, err := hex.DecodeString(f[2]); err == nil {
				k.mu.Lock()
				k.secret = s
				k.mu.Unlock()
			}
		}
	}
	return len(p), nil
}

// recSealer seals the server's records as RFC 8446 does.
type recSealer struct {
	newHash func() hash.Hash
	keyLen  int
	secret  []byte
	aead    cipher.AEAD
	iv      []byte
	seq     uint64
}

// expandLabel is HKDF-Expand-Label(secret, label, "", n) for n at most
// one hash length (one HMAC block).
func (s *recSealer) expandLabel(secret []byte, label string, n int) []byte {
	info := []byte{byte(n >> 8), byte(n), byte(6 + len(label))}
	info = append(info, "tls13 "+label...)
	info = append(info, 0, 1)
	m := hmac.New(s.newHash, secret)
	m.Write(info)
	return m.Sum(nil)[:n]
}

func (s *recSealer) rekey() {
	b, err := aes.NewCipher(s.expandLabel(s.secret, "key", s.keyLen))
	if err != nil {
		panic(err)
	}
	if s.aead, err = cipher.NewGCM(b); err != nil {
		panic(err)
	}
	s.iv = s.expandLabel(s.secret, "iv", 12)
}

// update moves to the next secret (after sealing a KeyUpdate).
func (s *recSealer) update() {
	s.secret = s.expandLabel(s.secret, "traffic upd", s.newHash().Size())
	s.rekey()
	s.seq = 0
}

// seal returns one record of content of inner type typ, then pad zeros.
func (s *recSealer) seal(typ byte, content []byte, pad int) []byte {
	inner := append(append(append([]byte{}, content...), typ), make([]byte, pad)...)
	hdr := []byte{23, 3, 3, 0, 0}
	binary.BigEndian.PutUint16(hdr[3:], uint16(len(inner)+16))
	nonce := append([]byte{}, s.iv...)
	var sq [8]byte
	binary.BigEndian.PutUint64(sq[:], s.seq)
	for i := range 8 {
		nonce[4+i] ^= sq[i]
	}
	s.seq++
	return s.aead.Seal(hdr, nonce, inner, hdr)
}

// Inner content types and post-handshake messages.
const (
	ctAlert     = 21
	ctHandshake = 22
	ctData      = 23
)

func keyUpdateMsg(req byte) []byte { return []byte{24, 0, 0, 1, req} }

// craftServer runs a TLS 1.3 server without session tickets (so the 101 is
// its record 0) and calls script with a sealer at record 1 and the raw TCP
// connection; the client's records after the hand-over are counted and
// reported on the returned channel once the client ends its side.
func craftServer(t *testing.T, script func(s *recSealer, w io.Writer)) (string, <-chan int) {
	kl := &keyLog{}
	cfg := serverTLS(t, testCertFile, testKeyFile, tls.VersionTLS13, tls.VersionTLS13)
	cfg.NextProtos = []string{"http/1.1"}
	cfg.SessionTicketsDisabled = true
	cfg.KeyLogWriter = kl
	clientRecs := make(chan int, 1)
	url := tlsRawServer(t, cfg, func(tc *tls.Conn, bc *batchConn, br *bufio.Reader) {
		s := &recSealer{seq: 1}
		switch tc.ConnectionState().CipherSuite {
		case tls.TLS_AES_128_GCM_SHA256:
			s.newHash, s.keyLen = sha256.New, 16
		case tls.TLS_AES_256_GCM_SHA384:
			s.newHash, s.keyLen = sha512.New384, 32
		default:
			clientRecs <- -1
			return
		}
		kl.mu.Lock()
		s.secret = kl.secret
		kl.mu.Unlock()
		s.rekey()
		done := make(chan int, 1)
		go func() {
			// The client's records from now on (none were sent before the
			// hand-over: the request was its only application data).
			n := 0
			var hdr [5]byte
			for {
				if _, err := io.ReadFull(bc.Conn, hdr[:]); err != nil {
					break
				}
				if _, err := io.CopyN(io.Discard, bc.Conn, int64(binary.BigEndian.Uint16(hdr[3:]))); err != nil {
					break
				}
				n++
			}
			done <- n
		}()
		script(s, bc.Conn)
		select {
		case n := <-done:
			clientRecs <- n
		case <-time.After(hangGuard):
			clientRecs <- -2
		}
	})
	return url, clientRecs
}

// craftRun dials url and pumps until the end: the messages checked in
// order (wstest payloads of size), the final event, the client's record
// count and PoolStats.TLSRecords.
func craftRun(t *testing.T, cfg talaris.Config, url string, recs <-chan int, size int) (int, *finalEvent, int, uint64) {
	t.Helper()
	p := newTestPool(t, cfg, hangGuard)
	c, err := p.DialAsync(url, tlsOpts)
	if err != nil {
		t.Fatal(err)
	}
	chk := wstest.NewChecker(size)
	f := pumpCount(t, p, c, chk, 1<<30)
	n := <-recs
	if n == -1 {
		t.Skip("ChaCha20 negotiated: our record layer does not run")
	}
	return chk.Count(), f, n, p.Stats().TLSRecords
}

func frame(i, size int) []byte {
	return ws.AppendFrame(nil, true, ws.OpBinary, wstest.Payload(i, size))
}

// TestTLSRecordCraftedControl: the crafted peer itself is right: frames
// in records of our making (one padded), then close_notify, arrive whole,
// opened by our record layer, and end like a close_notify from crypto/tls.
func TestTLSRecordCraftedControl(t *testing.T) {
	url, recs := craftServer(t, func(s *recSealer, w io.Writer) {
		var b []byte
		b = append(b, s.seal(ctData, frame(0, 64), 0)...)
		b = append(b, s.seal(ctData, frame(1, 64), 100)...)
		b = append(b, s.seal(ctData, nil, 0)...) // zero-length data is allowed
		b = append(b, s.seal(ctData, frame(2, 64), 0)...)
		b = append(b, s.seal(ctAlert, []byte{1, 0}, 0)...)
		w.Write(b)
	})
	craftClean(t, talaris.Config{}, url, recs, 3)
}

// craftClean is craftRun for a script that ends with close_notify after
// want frames, one per record: all arrive, each opened by our layer, and
// the connection ends as on a close_notify. Returns the client's record
// count.
func craftClean(t *testing.T, cfg talaris.Config, url string, recs <-chan int, want int) int {
	t.Helper()
	got, f, crecs, ours := craftRun(t, cfg, url, recs, 64)
	wantOurs := uint64(want)
	if cfg.NoTLSRecordLayer {
		wantOurs = 0
	}
	if got != want || ours != wantOurs {
		t.Errorf("got %d messages, %d records opened by our layer, want %d and %d (final %+v)", got, ours, want, wantOurs, f)
	}
	if f == nil || f.Kind != talaris.EventError || !errors.Is(f.Err, talaris.ErrConnectionLost) || f.Code != 1006 {
		t.Errorf("final %+v, want EventError ErrConnectionLost 1006 (close_notify)", f)
	}
	return crecs
}

// TestTLSRecordKeyUpdateSplit: a KeyUpdate whose header ends one handshake
// record and whose one-byte body is the next record (RFC 8446 5.1 allows a
// handshake message over several records; the key change follows its last
// byte, which ends its record): the data under the new keys arrives.
func TestTLSRecordKeyUpdateSplit(t *testing.T) {
	url, recs := craftServer(t, func(s *recSealer, w io.Writer) {
		var b []byte
		b = append(b, s.seal(ctData, frame(0, 64), 0)...)
		b = append(b, s.seal(ctHandshake, []byte{24, 0}, 0)...)
		b = append(b, s.seal(ctHandshake, []byte{0, 1}, 0)...)
		b = append(b, s.seal(ctHandshake, []byte{0}, 0)...)
		s.update()
		b = append(b, s.seal(ctData, frame(1, 64), 0)...)
		b = append(b, s.seal(ctAlert, []byte{1, 0}, 0)...)
		w.Write(b)
	})
	craftClean(t, talaris.Config{}, url, recs, 2)
}

// TestTLSRecordUserCanceled: user_canceled before close_notify (JDK 11
// servers close so). Both libraries skip user_canceled in TLS 1.3 (a few
// in a row), so the record layer does too: the data after it arrives and
// the close_notify ends the connection as usual, not "TLS alert 90".
// The same with NoTLSRecordLayer shows the library's behaviour.
func TestTLSRecordUserCanceled(t *testing.T) {
	for _, off := range []bool{false, true} {
		t.Run(map[bool]string{false: "ours", true: "library"}[off], func(t *testing.T) {
			url, recs := craftServer(t, func(s *recSealer, w io.Writer) {
				var b []byte
				b = append(b, s.seal(ctData, frame(0, 64), 0)...)
				b = append(b, s.seal(ctAlert, []byte{1, 90}, 0)...)
				b = append(b, s.seal(ctData, frame(1, 64), 0)...)
				b = append(b, s.seal(ctAlert, []byte{1, 90}, 0)...)
				b = append(b, s.seal(ctAlert, []byte{1, 0}, 0)...)
				w.Write(b)
			})
			craftClean(t, talaris.Config{NoTLSRecordLayer: off}, url, recs, 2)
		})
	}
}

// TestTLSRecordKeyUpdateFlood: 64 KeyUpdates with update_requested in a
// row, then data. RFC 8446 4.6.3: a receiver of several KeyUpdates while
// silent answers with a single one - not one per record, which a peer that
// does not read would pile up in our send buffer without bound. The
// client's records after the hand-over are its KeyUpdate(s) and its
// close_notify: a handful, never one per request.
func TestTLSRecordKeyUpdateFlood(t *testing.T) {
	const n = 64
	url, recs := craftServer(t, func(s *recSealer, w io.Writer) {
		var b []byte
		b = append(b, s.seal(ctData, frame(0, 64), 0)...)
		for range n {
			b = append(b, s.seal(ctHandshake, keyUpdateMsg(1), 0)...)
			s.update()
		}
		b = append(b, s.seal(ctData, frame(1, 64), 0)...)
		b = append(b, s.seal(ctAlert, []byte{1, 0}, 0)...)
		w.Write(b)
	})
	crecs := craftClean(t, talaris.Config{}, url, recs, 2)
	t.Logf("client records after the hand-over: %d", crecs)
	if crecs < 2 || crecs > n/4 {
		t.Errorf("client sent %d records for %d KeyUpdate requests, want a KeyUpdate per burst and a close_notify", crecs, n)
	}
}

// TestTLSRecordCraftedBad: records our layer must refuse, each after one
// good frame: nothing of the bad record arrives, the error is ErrTLS.
func TestTLSRecordCraftedBad(t *testing.T) {
	big := bytes.Repeat([]byte{0}, 1<<14+1)
	cases := []struct {
		name, want string
		rec        func(s *recSealer) []byte
	}{
		{"all-padding", "without a content type", func(s *recSealer) []byte { return s.seal(0, nil, 10) }},
		{"inner-type-20", "unexpected inner content type", func(s *recSealer) []byte { return s.seal(20, []byte{1}, 0) }},
		{"inner-type-99", "unexpected inner content type", func(s *recSealer) []byte { return s.seal(99, frame(1, 64), 0) }},
		{"content-2^14+1", "bad record length", func(s *recSealer) []byte { return s.seal(ctData, big, 0) }},
		{"inner-over-2^14+1", "bad record length", func(s *recSealer) []byte { return s.seal(ctData, frame(1, 64), 1<<14) }},
		{"alert-3-bytes", "malformed alert", func(s *recSealer) []byte { return s.seal(ctAlert, []byte{1, 0, 0}, 0) }},
		{"fatal-alert", "alert 40", func(s *recSealer) []byte { return s.seal(ctAlert, []byte{2, 40}, 0) }},
		{"user-canceled-x5", "too many user_canceled", func(s *recSealer) []byte {
			var r []byte
			for range 5 {
				r = append(r, s.seal(ctAlert, []byte{1, 90}, 0)...)
			}
			return r
		}},
		// RFC 8446 5.1: no other record type inside a handshake message;
		// a close_notify there is no clean end (a NewSessionTicket
		// announcing 100 body bytes, 10 sent).
		{"close-notify-inside-ticket", "alert inside a handshake message", func(s *recSealer) []byte {
			r := s.seal(ctHandshake, append([]byte{4, 0, 0, 100}, make([]byte, 10)...), 0)
			return append(r, s.seal(ctAlert, []byte{1, 0}, 0)...)
		}},
		{"keyupdate-2", "unknown request", func(s *recSealer) []byte { return s.seal(ctHandshake, keyUpdateMsg(2), 0) }},
		{"keyupdate-then-more", "not at the end of its record", func(s *recSealer) []byte {
			return s.seal(ctHandshake, append(keyUpdateMsg(0), 4, 0, 0, 1, 0), 0)
		}},
		{"keyupdate-len-2", "malformed KeyUpdate", func(s *recSealer) []byte { return s.seal(ctHandshake, []byte{24, 0, 0, 2, 0, 0}, 0) }},
		{"certificate-request", "unexpected post-handshake", func(s *recSealer) []byte { return s.seal(ctHandshake, []byte{13, 0, 0, 1, 0}, 0) }},
		{"outer-type-22", "unexpected record type", func(s *recSealer) []byte { r := s.seal(ctData, frame(1, 64), 0); r[0] = 22; return r }},
		{"outer-version", "bad record version", func(s *recSealer) []byte { r := s.seal(ctData, frame(1, 64), 0); r[2] = 4; return r }},
		{"skipped-seq", "bad record MAC", func(s *recSealer) []byte { s.seq++; return s.seal(ctData, frame(1, 64), 0) }},
		{"repeated-seq", "bad record MAC", func(s *recSealer) []byte { s.seq--; return s.seal(ctData, frame(1, 64), 0) }},
		{"short", "bad record length", func(s *recSealer) []byte { return []byte{23, 3, 3, 0, 16} }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url, recs := craftServer(t, func(s *recSealer, w io.Writer) {
				b := s.seal(ctData, frame(0, 64), 0)
				b = append(b, tc.rec(s)...)
				b = append(b, s.seal(ctData, frame(1, 64), 0)...)
				w.Write(b)
				w.(interface{ CloseWrite() error }).CloseWrite()
			})
			got, f, _, _ := craftRun(t, talaris.Config{}, url, recs, 64)
			if got != 1 {
				t.Errorf("got %d messages, want 1", got)
			}
			if f == nil || f.Kind != talaris.EventError || !errors.Is(f.Err, talaris.ErrTLS) {
				t.Fatalf("final %+v, want EventError ErrTLS", f)
			}
			if !strings.Contains(f.Err.Error(), tc.want) {
				t.Errorf("error %q, want one naming %q", f.Err, tc.want)
			}
		})
	}
}
