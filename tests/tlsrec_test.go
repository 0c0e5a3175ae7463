//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// talaris' own TLS 1.3 record layer (csrc/tlsrec.c, Config.NoTLSRecordLayer):
// once the library has read the first application data (the 101, after the
// server's session tickets), the loop opens the server's AES-GCM records
// itself, from the receive slots into the plaintext slots.
// PoolStats.TLSRecords counts the application-data records it opened, so
// these tests know which path ran.

// recOpts dials with only the given TLS 1.3 suite offered (0: the default).
func recOpts(suite uint16) *talaris.DialOptions {
	o := *tlsOpts
	if suite != 0 {
		o.TLS.CipherSuites = []uint16{suite}
	}
	return &o
}

// recServer is ipServer with one TLS record per write from the start
// (crypto/tls otherwise cuts the first 128 KiB into ~1 KiB records), so
// tests can count records.
// The suite it negotiated last is stored in *suite (nil: not kept).
func recServer(t *testing.T, s ipStream, v uint16, suite *atomic.Uint32) string {
	cfg := serverTLS(t, testCertFile, testKeyFile, v, v)
	cfg.NextProtos = []string{"http/1.1"}
	cfg.DynamicRecordSizingDisabled = true
	return tlsRawServer(t, cfg, func(tc *tls.Conn, bc *batchConn, br *bufio.Reader) {
		if suite != nil {
			suite.Store(uint32(tc.ConnectionState().CipherSuite))
		}
		s.serve(tc, bc, br)
	})
}

// TestTLSRecordLayer: every message of a wss feed from a Go server arrives
// intact and in order through our record layer, for both AES-GCM suites,
// with one frame per record, many, frames straddling records and tiny
// records, over recv bundles and over one 4 KiB slot per completion (every
// full record straddles slots). The count of records it opened is exact:
// every record after the 101 (the library's last) is ours, none lost or
// read twice. ChaCha20, TLS 1.2 and NoTLSRecordLayer keep SSL_read (0).
func TestTLSRecordLayer(t *testing.T) {
	t.Logf("TLS backend %s", talaris.TLSBackend())
	n := scaled(20_000)
	type row struct {
		name    string
		suite   uint16
		version uint16
		cfg     talaris.Config
		ours    bool
	}
	rows := []row{
		{"aes128", tls.TLS_AES_128_GCM_SHA256, tls.VersionTLS13, talaris.Config{}, true},
		{"aes256", tls.TLS_AES_256_GCM_SHA384, tls.VersionTLS13, talaris.Config{}, true},
		{"aes128-1slot", tls.TLS_AES_128_GCM_SHA256, tls.VersionTLS13, talaris.Config{NoRecvBundle: true, BufSize: 4096}, true},
		{"aes256-1slot", tls.TLS_AES_256_GCM_SHA384, tls.VersionTLS13, talaris.Config{NoRecvBundle: true, BufSize: 4096}, true},
		{"aes128-libgcm", tls.TLS_AES_128_GCM_SHA256, tls.VersionTLS13, talaris.Config{TLSLibraryGCM: true}, true},
		{"aes256-libgcm-1slot", tls.TLS_AES_256_GCM_SHA384, tls.VersionTLS13, talaris.Config{TLSLibraryGCM: true, NoRecvBundle: true, BufSize: 4096}, true},
		{"chacha20", tls.TLS_CHACHA20_POLY1305_SHA256, tls.VersionTLS13, talaris.Config{}, true},
		{"tls12", 0, tls.VersionTLS12, talaris.Config{}, false},
		{"off", 0, tls.VersionTLS13, talaris.Config{NoTLSRecordLayer: true}, false},
	}
	for _, r := range rows {
		for _, chunk := range []int{0, 16000, 1000, 97} {
			t.Run(fmt.Sprintf("%s/chunk%d", r.name, chunk), func(t *testing.T) {
				s := ipStream{msgs: uniform(n, 256, 1), chunk: chunk}
				var suite atomic.Uint32
				url := recServer(t, s, r.version, &suite)
				p := newTestPool(t, r.cfg, hangGuard)
				res := map[talaris.Conn]*ipResult{}
				c, err := p.DialAsync(url, recOpts(r.suite))
				if err != nil {
					t.Fatal(err)
				}
				res[c] = &ipResult{}
				pumpUntil(t, p, func(c talaris.Conn, ev talaris.Event) { res[c].check(p, s, ev) }, func() bool { return res[c].final != nil }, nil)
				if res[c].err != nil {
					t.Fatal(res[c].err)
				}
				expectClean(t, []*ipResult{res[c]}, s)
				// The records after the 101 (the library's last): one per
				// frame (chunk 0) or per chunk, then the one with the rest
				// and the close frame.
				got, want := p.Stats().TLSRecords, uint64(n+1)
				if chunk > 0 {
					want = uint64(n*(256+4)/chunk + 1)
				}
				// BoringSSL offers every TLS 1.3 suite whatever CipherSuites
				// says (it has no setting for them), and crypto/tls then
				// picks AES-128-GCM: what ran is what the server negotiated.
				neg := uint16(suite.Load())
				ours := r.ours && (neg == tls.TLS_AES_128_GCM_SHA256 || neg == tls.TLS_AES_256_GCM_SHA384)
				t.Logf("negotiated %s", tls.CipherSuiteName(neg))
				if r.suite != 0 && neg != r.suite {
					t.Logf("asked for %s (this backend does not restrict TLS 1.3 suites)", tls.CipherSuiteName(r.suite))
				}
				if !ours {
					want = 0
				}
				if got != want {
					t.Errorf("PoolStats.TLSRecords = %d, want %d", got, want)
				}
				// Which AES-GCM opened them: ours where the CPU runs it,
				// unless TLSLibraryGCM; every record or none.
				if own := p.Stats().TLSRecordsOwnGCM; testhook.OwnGCM() && !r.cfg.TLSLibraryGCM {
					if own != got {
						t.Errorf("PoolStats.TLSRecordsOwnGCM = %d of %d records", own, got)
					}
				} else if own != 0 {
					t.Errorf("PoolStats.TLSRecordsOwnGCM = %d with TLSLibraryGCM %v, own GCM %v", own, r.cfg.TLSLibraryGCM, testhook.OwnGCM())
				}
			})
		}
	}
}

// TestTLSRecordKeyUpdate: openssl s_server sends KeyUpdate without (k) and
// with (K) update_requested, under each AES-GCM suite: our record layer
// rekeys (the data after each arrives, opened by it: TLSRecords grows) and
// for K the library sends our KeyUpdate, which s_server prints, before any
// further data (the client sends nothing else).
func TestTLSRecordKeyUpdate(t *testing.T) {
	for _, suite := range []string{"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384"} {
		t.Run(suite, func(t *testing.T) {
			s := startSServer(t, "-tls1_3", "-ciphersuites", suite)
			p := newTestPool(t, talaris.Config{}, hangGuard)
			c := sServerSession(t, p, s, tlsOpts)
			const size = 24
			chk := wstest.NewChecker(size)
			next := 0
			ours := p.Stats().TLSRecords
			batch := func(n int) {
				t.Helper()
				s.write(sFrames(next, n, size))
				next += n
				if f := pumpCount(t, p, c, chk, next); f != nil {
					t.Fatalf("connection ended after %d messages: %+v", chk.Count(), *f)
				}
				now := p.Stats().TLSRecords
				if now <= ours {
					t.Fatalf("TLSRecords %d -> %d: the batch did not go through our record layer", ours, now)
				}
				ours = now
			}
			batch(50)
			batch(50) // the first batch may have been the library's first application data
			for range 2 {
				off := s.outLen()
				s.command("K")
				_, off = s.waitFor(sentKeyUpdate, off)
				s.waitFor(rcvdKeyUpdate, off)
				batch(100)
				off = s.outLen()
				s.command("k")
				s.waitFor(sentKeyUpdate, off)
				batch(100)
			}
			if !strings.Contains(s.tail(1<<20), strings.ReplaceAll(suite, "TLS_", "")) {
				t.Logf("s_server output does not name %s (informational)", suite)
			}
			// Our writes still work under the library's new write key.
			off := s.outLen()
			s.write(ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(1000, "done")))
			s.waitForBytes([]byte{0x88, 0x86}, off)
			go func() {
				time.Sleep(50 * time.Millisecond)
				io.WriteString(s.stdin, "Q\n")
			}()
			f := pumpCount(t, p, c, chk, next+1)
			if f == nil || f.Kind != talaris.EventClose || f.Code != 1000 {
				t.Fatalf("final event %+v, want EventClose 1000", f)
			}
			if chk.Count() != next {
				t.Errorf("got %d messages, want %d", chk.Count(), next)
			}
		})
	}
}

// TestTLSRecordChaCha: a server that allows only ChaCha20-Poly1305 (openssl
// s_server): the library's SSL_read opens every record (TLSRecords stays
// 0) and every message arrives.
func TestTLSRecordChaCha(t *testing.T) {
	s := startSServer(t, "-tls1_3", "-ciphersuites", "TLS_CHACHA20_POLY1305_SHA256")
	p := newTestPool(t, talaris.Config{}, hangGuard)
	c := sServerSession(t, p, s, tlsOpts)
	const size = 24
	chk := wstest.NewChecker(size)
	s.write(sFrames(0, 100, size))
	if f := pumpCount(t, p, c, chk, 100); f != nil {
		t.Fatalf("connection ended after %d messages: %+v", chk.Count(), *f)
	}
	s.write(sFrames(100, 100, size))
	if f := pumpCount(t, p, c, chk, 200); f != nil {
		t.Fatalf("connection ended after %d messages: %+v", chk.Count(), *f)
	}
	if n := p.Stats().TLSRecords; n != 0 {
		t.Errorf("TLSRecords = %d under ChaCha20, want 0 (SSL_read)", n)
	}
	c.Close(1000, "")
}

// TestTLSRecordCloseNotify: the server sends frames, then close_notify
// while its TCP side stays open (CloseWrite). Our record layer reports the
// clean TLS end: every frame arrives, the connection ends as on a TCP EOF
// without a close frame (ErrConnectionLost, 1006), and the client answers
// with its own close_notify and FIN, which the server reads as EOF.
func TestTLSRecordCloseNotify(t *testing.T) {
	n := scaled(5000)
	sawEOF := make(chan error, 1)
	cfg := serverTLS(t, testCertFile, testKeyFile, tls.VersionTLS13, tls.VersionTLS13)
	cfg.NextProtos = []string{"http/1.1"}
	url := tlsRawServer(t, cfg, func(tc *tls.Conn, bc *batchConn, br *bufio.Reader) {
		for i := range n {
			if _, err := tc.Write(ws.AppendFrame(nil, true, ws.OpBinary, wstest.Payload(i, 256))); err != nil {
				sawEOF <- err
				return
			}
		}
		if err := tc.CloseWrite(); err != nil { // close_notify, no FIN
			sawEOF <- err
			return
		}
		_, err := io.Copy(io.Discard, br)
		sawEOF <- err // nil: the client's close_notify ended the stream
	})
	p := newTestPool(t, talaris.Config{}, hangGuard)
	c, err := p.DialAsync(url, tlsOpts)
	if err != nil {
		t.Fatal(err)
	}
	chk := wstest.NewChecker(256)
	f := pumpCount(t, p, c, chk, 1<<30)
	if chk.Count() != n {
		t.Errorf("got %d messages, want %d", chk.Count(), n)
	}
	if f == nil || f.Kind != talaris.EventError || !errors.Is(f.Err, talaris.ErrConnectionLost) || f.Code != 1006 {
		t.Errorf("final %+v, want EventError ErrConnectionLost 1006", f)
	}
	select {
	case err := <-sawEOF:
		if err != nil {
			t.Errorf("server: %v, want the client's close_notify", err)
		}
	case <-time.After(hangGuard):
		t.Fatal("the server never saw the client's close_notify")
	}
	if p.Stats().TLSRecords == 0 {
		t.Error("TLSRecords = 0: the record layer did not run")
	}
}

// corruptProxy forwards TCP between the client and upstream, and in the
// server's direction flips one byte in the middle of the body of the
// nth TLS record whose length is recLen (a frame record; the handshake's
// and the 101's records have other lengths). It returns its address.
func corruptProxy(t *testing.T, upstream string, recLen, nth int) string {
	t.Helper()
	l := newTrackedListener(t)
	l.run(func() {
		cc, err := l.Accept()
		if err != nil {
			return
		}
		sc, err := net.Dial("tcp4", upstream)
		if err != nil {
			cc.Close()
			return
		}
		l.track(cc, sc)
		l.run(func() { io.Copy(sc, cc); sc.(*net.TCPConn).CloseWrite() })
		l.run(func() {
			defer cc.(*net.TCPConn).CloseWrite()
			br := bufio.NewReader(sc)
			seen := 0
			for {
				var hdr [5]byte
				if _, err := io.ReadFull(br, hdr[:]); err != nil {
					return
				}
				body := make([]byte, int(hdr[3])<<8|int(hdr[4]))
				if _, err := io.ReadFull(br, body); err != nil {
					return
				}
				if hdr[0] == 23 && len(body) == recLen {
					if seen++; seen == nth {
						body[len(body)/2] ^= 0x40
					}
				}
				if _, err := cc.Write(append(hdr[:], body...)); err != nil {
					return
				}
			}
		})
	})
	return l.Addr().String()
}

// TestTLSRecordCorrupt: a proxy flips one ciphertext byte of the 50th
// frame record (10 frames each). The record's tag does not verify: the
// connection fails with ErrTLS naming the bad record, and exactly the
// frames of the 49 records before it are delivered - nothing of the
// corrupted record. The same with the library's SSL_read (the error text
// is the library's).
func TestTLSRecordCorrupt(t *testing.T) {
	const per, size, nth = 10, 256, 50
	for _, off := range []bool{false, true} {
		t.Run(map[bool]string{false: "ours", true: "library"}[off], func(t *testing.T) {
			s := ipStream{msgs: uniform(scaled(2000)+nth*per, size, 1), chunk: per * (size + 4)}
			url := recServer(t, s, tls.VersionTLS13, nil)
			addr := corruptProxy(t, strings.TrimPrefix(url, "wss://"), per*(size+4)+1+16, nth)
			p := newTestPool(t, talaris.Config{NoTLSRecordLayer: off}, hangGuard)
			c, err := p.DialAsync("wss://"+addr, tlsOpts)
			if err != nil {
				t.Fatal(err)
			}
			r := &ipResult{}
			pumpUntil(t, p, func(_ talaris.Conn, ev talaris.Event) { r.check(p, s, ev) }, func() bool { return r.final != nil }, nil)
			_ = c
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.got != (nth-1)*per {
				t.Errorf("%d messages delivered, want %d (the records before the corrupted one)", r.got, (nth-1)*per)
			}
			if r.final.Kind != talaris.EventError || !errors.Is(r.final.Err, talaris.ErrTLS) {
				t.Fatalf("final %+v, want EventError ErrTLS", *r.final)
			}
			t.Logf("error: %v", r.final.Err)
			if !off && !regexp.MustCompile(`bad record MAC`).MatchString(r.final.Err.Error()) {
				t.Errorf("error %q does not name the bad record MAC", r.final.Err)
			}
			if ours := p.Stats().TLSRecords; (ours > 0) == off {
				t.Errorf("TLSRecords = %d with NoTLSRecordLayer %v", ours, off)
			}
		})
	}
}

// TestTLSRecordKeyUpdateFirst: s_server sends a KeyUpdate with
// update_requested (K) before its first application data (the 101). The
// library reads it (the hand-over waits for the first application data),
// our record layer follows it (tl_tlsrec_shadow) and takes over under the
// new keys: every message after it arrives, opened by us, and the library
// answered with our KeyUpdate.
func TestTLSRecordKeyUpdateFirst(t *testing.T) {
	for _, suite := range []string{"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384"} {
		t.Run(suite, func(t *testing.T) {
			s := startSServer(t, "-tls1_3", "-ciphersuites", suite)
			p := newTestPool(t, talaris.Config{}, hangGuard)
			c := sServerSessionThen(t, p, s, tlsOpts, func() error {
				off := s.outLen()
				time.Sleep(20 * time.Millisecond)
				if _, err := io.WriteString(s.stdin, "K\n"); err != nil {
					return err
				}
				_, _, err := s.find(sentKeyUpdate, off)
				time.Sleep(20 * time.Millisecond)
				return err
			})
			s.waitFor(rcvdKeyUpdate, 0)
			const size = 24
			chk := wstest.NewChecker(size)
			for i := range 3 {
				s.write(sFrames(i*100, 100, size))
				if f := pumpCount(t, p, c, chk, (i+1)*100); f != nil {
					t.Fatalf("connection ended after %d messages: %+v", chk.Count(), *f)
				}
			}
			if n := p.Stats().TLSRecords; n == 0 {
				t.Error("TLSRecords = 0: our record layer did not take over after the KeyUpdate")
			}
			c.Close(1000, "")
		})
	}
}
