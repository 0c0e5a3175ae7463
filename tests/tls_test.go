//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// TLS tests: real handshakes against Go crypto/tls servers (gorilla and
// coder), `openssl s_server` and Node's ws over https, with either TLS
// backend (go test ./ and go test -tags talaris_openssl ./). Timeouts are
// hang guards only.

// runStreamTLS is runStream with dial options.
func runStreamTLS(t *testing.T, p *talaris.Pool, url string, opts *talaris.DialOptions, spec streamSpec, afterBatch func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), tlsDialTimeout)
	defer cancel()
	c, err := p.Dial(ctx, url+spec.path(), opts)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	st := newStreamState(spec)
	pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
		if cc != c {
			t.Errorf("event %v for unknown connection %#x (dialed %#x)", ev.Kind, cc.ID(), c.ID())
			return
		}
		st.on(ev)
	}, func() bool { return st.final != nil }, afterBatch)
	st.verify(t, spec.String())
	if s := c.State(); s != talaris.StateClosed {
		t.Errorf("state after the final event: %v", s)
	}
}

// TestTLSIntegrity is the integrity suite over wss://: every message of
// sequence-numbered, checksummed streams arrives complete and in order,
// through several buffer and ring configurations. The streams end with a
// close handshake followed by close_notify, which must give EventClose.
func TestTLSIntegrity(t *testing.T) {
	t.Logf("TLS backend %s", talaris.TLSBackend())
	type poolCase struct {
		name  string
		cfg   talaris.Config
		specs []streamSpec
		slow  time.Duration
		check func(t *testing.T, s testhook.PoolStats)
	}
	// 512-byte slots: every 16 KiB record spans 32+ slots, and 4 slots
	// cannot hold one record.
	splitSpecs := []streamSpec{
		{n: 100, size: 65536},
		{n: 8, size: 1 << 20, text: true},
		{n: 2000, size: 300, frag: 4, ping: true},
		{n: scaled(50_000), size: 16},
	}
	cases := []poolCase{
		{name: "default", cfg: talaris.Config{}, specs: allSpecs(true)},
		{
			name: "tinybufs", cfg: talaris.Config{BufSize: 4096, BufCount: 4},
			specs: append([]streamSpec{{n: scaled(200_000), size: 16}}, sizeSpecs()...),
			check: func(t *testing.T, s testhook.PoolStats) {
				// With recv bundles (the default) a bundle empties the
				// ring and ends; without them (the nobundle rows) the
				// recv runs out of buffers (-ENOBUFS).
				if s.Rearms == 0 {
					t.Errorf("tiny buffer ring: Rearms=0, want > 0")
				}
			},
		},
		{
			// 512-byte slots: every 16 KiB record spans 32+ slots, and
			// 4 slots cannot hold one record.
			name: "splitrecords", cfg: talaris.Config{BufSize: 512, BufCount: 4},
			specs: splitSpecs,
			check: func(t *testing.T, s testhook.PoolStats) {
				if s.Rearms == 0 {
					t.Errorf("512-byte slots: Rearms=0, want > 0")
				}
			},
		},
		{
			name: "nobundle-tinybufs", cfg: testhook.WithKnobs(talaris.Config{BufSize: 4096, BufCount: 4}, testhook.Knobs{NoRecvBundle: true}),
			specs: append([]streamSpec{{n: scaled(200_000), size: 16}}, sizeSpecs()...),
			check: func(t *testing.T, s testhook.PoolStats) {
				if s.NoBufs == 0 || s.Rearms == 0 {
					t.Errorf("tiny buffer ring: NoBufs=%d Rearms=%d, want both > 0", s.NoBufs, s.Rearms)
				}
			},
		},
		{
			// 512-byte slots: every 16 KiB record spans 32+ slots, and
			// 4 slots cannot hold one record.
			name: "nobundle-splitrecords", cfg: testhook.WithKnobs(talaris.Config{BufSize: 512, BufCount: 4}, testhook.Knobs{NoRecvBundle: true}),
			specs: splitSpecs,
			check: func(t *testing.T, s testhook.PoolStats) {
				if s.NoBufs == 0 {
					t.Errorf("512-byte slots: NoBufs=0, want > 0")
				}
			},
		},
		{
			name:  "slowconsumer",
			cfg:   testhook.WithKnobs(talaris.Config{ArenaSize: 4 << 20, MaxMessageSize: 2 << 20}, testhook.Knobs{EventRingSize: 64}),
			specs: []streamSpec{{n: scaled(20000), size: 16}, {n: 20, size: 1 << 20}, {n: 500, size: 65536, text: true}, {n: 2000, size: 100, frag: 3, ping: true}},
			slow:  time.Millisecond,
			check: func(t *testing.T, s testhook.PoolStats) {
				if s.Stalls == 0 {
					t.Errorf("slow consumer: Stalls=0, want > 0")
				}
			},
		},
	}
	cfg := serverTLS(t, testCertFile, testKeyFile, 0, 0)
	for _, pc := range cases {
		t.Run(pc.name, func(t *testing.T) {
			forEachTLSServer(t, cfg, func(t *testing.T, srv *wstest.Server) {
				p := newTestPool(t, pc.cfg, 5*hangGuard)
				var after func()
				if pc.slow > 0 {
					after = func() { time.Sleep(pc.slow) }
				}
				for _, spec := range pc.specs {
					runStreamTLS(t, p, srv.URL, tlsOpts, spec, after)
					if t.Failed() {
						t.Logf("stats %+v", testhook.Stats(p))
						return
					}
				}
				s := testhook.Stats(p)
				t.Logf("stats %+v", s)
				if pc.check != nil {
					pc.check(t, s)
				}
			})
		})
	}
}

// TestTLSVersions: servers limited to TLS 1.2 (with each AEAD family) or to
// TLS 1.3.
func TestTLSVersions(t *testing.T) {
	cases := []struct {
		name       string
		minV, maxV uint16
		suites     []uint16
	}{
		{"tls12-aesgcm", tls.VersionTLS12, tls.VersionTLS12, []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}},
		{"tls12-chacha", tls.VersionTLS12, tls.VersionTLS12, []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305}},
		{"tls12-aes256", tls.VersionTLS12, tls.VersionTLS12, []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384}},
		{"tls13", tls.VersionTLS13, tls.VersionTLS13, nil},
	}
	specs := []streamSpec{{n: scaled(100_000), size: 16}, {n: 8, size: 1 << 20}, {n: 2000, size: 125, text: true}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := serverTLS(t, testCertFile, testKeyFile, tc.minV, tc.maxV)
			cfg.CipherSuites = tc.suites
			var mu sync.Mutex
			var seen []string
			cfg.VerifyConnection = func(cs tls.ConnectionState) error {
				mu.Lock()
				seen = append(seen, fmt.Sprintf("%s/%s/alpn=%q", tls.VersionName(cs.Version), tls.CipherSuiteName(cs.CipherSuite), cs.NegotiatedProtocol))
				mu.Unlock()
				return nil
			}
			forEachTLSServer(t, cfg, func(t *testing.T, srv *wstest.Server) {
				p := newTestPool(t, talaris.Config{}, hangGuard)
				for _, spec := range specs {
					runStreamTLS(t, p, srv.URL, tlsOpts, spec, nil)
				}
			})
			mu.Lock()
			defer mu.Unlock()
			if len(seen) == 0 {
				t.Fatal("no handshake seen by the server")
			}
			for _, s := range seen {
				if !strings.Contains(s, `alpn="http/1.1"`) {
					t.Errorf("handshake %s: ALPN http/1.1 not negotiated", s)
				}
			}
			t.Logf("server saw %s", seen[0])
		})
	}
}

// trackedListener is a test server's loopback listener: the connections
// it tracks are closed and the goroutines it runs are waited for when the
// test ends (after the listener closes, so Accept returns), so no server
// goroutine outlives its test.
type trackedListener struct {
	net.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
	closed bool
}

func newTrackedListener(t *testing.T) *trackedListener {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &trackedListener{Listener: ln}
	t.Cleanup(func() {
		ln.Close()
		l.mu.Lock()
		l.closed = true
		for _, c := range l.conns {
			c.Close()
		}
		l.mu.Unlock()
		l.wg.Wait()
	})
	return l
}

// track closes cs when the test ends, or at once if it has ended (a
// connection accepted during the cleanup must not keep a goroutine
// blocked on it).
func (l *trackedListener) track(cs ...net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		for _, c := range cs {
			c.Close()
		}
		return
	}
	l.conns = append(l.conns, cs...)
}

// run runs f in a goroutine the test's end waits for. Called from the
// test or from a goroutine run started (which holds the wait open).
func (l *trackedListener) run(f func()) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f()
	}()
}

// TestTLSManyRecordsPerSlot: the server writes every frame as its own TLS
// record but sends ~64 KiB of records per TCP write, so one buffer slot
// holds hundreds of records (and records straddle slot boundaries).
func TestTLSManyRecordsPerSlot(t *testing.T) {
	n := scaled(200_000)
	const size = 16
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		t.Run(tls.VersionName(v), func(t *testing.T) {
			cfg := serverTLS(t, testCertFile, testKeyFile, v, v)
			cfg.NextProtos = []string{"http/1.1"}
			url := tlsRawServer(t, cfg, func(tc *tls.Conn, bc *batchConn, br *bufio.Reader) {
				bc.hold = true
				var fr []byte
				for i := range n {
					fr = ws.AppendFrame(fr[:0], true, ws.OpBinary, wstest.Payload(i, size))
					if _, err := tc.Write(fr); err != nil { // one record
						return
					}
					if len(bc.buf) >= 64<<10 {
						if bc.Flush() != nil {
							return
						}
					}
				}
				tc.Write(ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(1000, "done")))
				if bc.Flush() != nil {
					return
				}
				bc.hold = false
				readClose(br)
				tc.Close()
			})
			p := newTestPool(t, talaris.Config{}, hangGuard)
			runStreamTLS(t, p, url, tlsOpts, streamSpec{n: n, size: size}, nil)
			t.Logf("stats %+v", testhook.Stats(p))
		})
	}
}

// TestTLSVerification: the ways to trust a server, and that verification
// is on by default.
func TestTLSVerification(t *testing.T) {
	good := serverTLS(t, testCertFile, testKeyFile, 0, 0)
	expired := serverTLS(t, expiredCert, expiredKey, 0, 0)
	srv := wstest.NewGorilla().StartTLS(t, good)
	expSrv := wstest.NewGorilla().StartTLS(t, expired)
	caPEM, err := os.ReadFile(testCAFile)
	if err != nil {
		t.Fatal(err)
	}
	port := srv.URL[strings.LastIndexByte(srv.URL, ':')+1:]
	p := newTestPool(t, talaris.Config{}, hangGuard)
	ok := []struct {
		name string
		url  string
		opts *talaris.DialOptions
	}{
		{"RootCAFile", srv.URL, tlsOpts},
		{"RootCAPEM", srv.URL, &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAPEM: caPEM}}},
		{"localhost", "wss://localhost:" + port, tlsOpts},
		{"ServerName", srv.URL, &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAFile: testCAFile, ServerName: "localhost"}}},
		{"InsecureSkipVerify", srv.URL, &talaris.DialOptions{TLS: talaris.TLSOptions{InsecureSkipVerify: true}}},
		{"InsecureSkipVerify-wrongname", srv.URL, &talaris.DialOptions{TLS: talaris.TLSOptions{InsecureSkipVerify: true, ServerName: "wrong.example"}}},
		{"InsecureSkipVerify-expired", expSrv.URL, &talaris.DialOptions{TLS: talaris.TLSOptions{InsecureSkipVerify: true}}},
		{"InsecureSkipVerify-otherCA", expSrv.URL, &talaris.DialOptions{TLS: talaris.TLSOptions{InsecureSkipVerify: true, RootCAFile: otherCAFile}}},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			runStreamTLS(t, p, tc.url, tc.opts, streamSpec{n: 100, size: 200}, nil)
		})
	}
}

var tlsSentinels = []error{talaris.ErrTLSUnknownCA, talaris.ErrTLSHostname, talaris.ErrTLSExpired, talaris.ErrTLSALPN, talaris.ErrTLSNotTLS, talaris.ErrTimeout, talaris.ErrConnectionLost}

// wantDialErr checks that err matches want (and parent, when non-nil) and
// none of the other causes.
func wantDialErr(t *testing.T, err, want, parent error) {
	t.Helper()
	if err == nil {
		t.Fatalf("Dial succeeded, want %v", want)
	}
	t.Logf("error: %v", err)
	if !errors.Is(err, want) {
		t.Errorf("errors.Is(%v, %v) = false", err, want)
	}
	if parent != nil && !errors.Is(err, parent) {
		t.Errorf("errors.Is(%v, %v) = false", err, parent)
	}
	for _, s := range tlsSentinels {
		if s != want && errors.Is(err, s) {
			t.Errorf("error %v also matches %v", err, s)
		}
	}
}

// TestTLSErrors: each failure a user can act on gives its own error.
func TestTLSErrors(t *testing.T) {
	good := serverTLS(t, testCertFile, testKeyFile, 0, 0)
	srv := wstest.NewGorilla().StartTLS(t, good)
	p := newTestPool(t, talaris.Config{}, hangGuard)
	dialErr := func(url string, opts *talaris.DialOptions) error {
		ctx, cancel := context.WithTimeout(context.Background(), tlsDialTimeout)
		defer cancel()
		c, err := p.Dial(ctx, url+"/echo", opts)
		if err == nil {
			c.Close(1000, "")
		}
		return err
	}
	t.Run("UnknownCA-file", func(t *testing.T) {
		wantDialErr(t, dialErr(srv.URL, &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAFile: otherCAFile}}), talaris.ErrTLSUnknownCA, talaris.ErrTLS)
	})
	t.Run("UnknownCA-pem", func(t *testing.T) {
		pem, _ := os.ReadFile(otherCAFile)
		wantDialErr(t, dialErr(srv.URL, &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAPEM: pem}}), talaris.ErrTLSUnknownCA, talaris.ErrTLS)
	})
	t.Run("UnknownCA-system", func(t *testing.T) {
		wantDialErr(t, dialErr(srv.URL, nil), talaris.ErrTLSUnknownCA, talaris.ErrTLS)
	})
	t.Run("Hostname", func(t *testing.T) {
		wantDialErr(t, dialErr(srv.URL, &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAFile: testCAFile, ServerName: "wrong.example"}}), talaris.ErrTLSHostname, talaris.ErrTLS)
	})
	t.Run("Expired", func(t *testing.T) {
		exp := wstest.NewGorilla().StartTLS(t, serverTLS(t, expiredCert, expiredKey, 0, 0))
		wantDialErr(t, dialErr(exp.URL, tlsOpts), talaris.ErrTLSExpired, talaris.ErrTLS)
	})
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		t.Run("ALPN-refused-"+tls.VersionName(v), func(t *testing.T) {
			// No protocol in common: crypto/tls aborts with
			// no_application_protocol. (Only "h2" would not do: Go lets
			// http/1.1 clients in as if they had not sent ALPN.)
			cfg := serverTLS(t, testCertFile, testKeyFile, v, v)
			cfg.NextProtos = []string{"x-talaris-other"}
			s := wstest.NewGorilla().StartTLS(t, cfg)
			wantDialErr(t, dialErr(s.URL, tlsOpts), talaris.ErrTLSALPN, talaris.ErrTLS)
		})
	}
	t.Run("ALPN-h2-only-accepted", func(t *testing.T) {
		// crypto/tls treats an h2-only server and an http/1.1 client as no
		// ALPN at all; the client accepts "nothing selected".
		cfg := serverTLS(t, testCertFile, testKeyFile, 0, 0)
		cfg.NextProtos = []string{"h2"}
		s := wstest.NewGorilla().StartTLS(t, cfg)
		if err := dialErr(s.URL, tlsOpts); err != nil {
			t.Fatalf("Dial: %v", err)
		}
	})
	t.Run("ALPN-selected-other", func(t *testing.T) {
		// A TLS 1.2 server whose ServerHello selects "h2xxxxxx", which
		// the client never offered (a proxy rewrites the plaintext
		// ServerHello of a crypto/tls server that selected http/1.1).
		cfg := serverTLS(t, testCertFile, testKeyFile, tls.VersionTLS12, tls.VersionTLS12)
		s := wstest.NewGorilla().StartTLS(t, cfg)
		url := rewriteProxy(t, strings.TrimPrefix(s.URL, "wss://"), []byte("\x08http/1.1"), []byte("\x08h2xxxxxx"))
		wantDialErr(t, dialErr(url, tlsOpts), talaris.ErrTLSALPN, talaris.ErrTLS)
	})
	t.Run("HandshakeTimeout", func(t *testing.T) {
		// Accepts TCP and never says a word.
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		var held []net.Conn
		var mu sync.Mutex
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				held = append(held, c)
				mu.Unlock()
			}
		}()
		defer func() {
			ln.Close()
			<-done
			mu.Lock()
			for _, c := range held {
				c.Close()
			}
			mu.Unlock()
		}()
		err = dialErr("wss://"+ln.Addr().String(), &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAFile: testCAFile}, HandshakeTimeout: 500 * time.Millisecond})
		wantDialErr(t, err, talaris.ErrTimeout, nil)
		if errors.Is(err, talaris.ErrTLS) {
			t.Errorf("timeout %v also matches ErrTLS", err)
		}
	})
	t.Run("NotTLS", func(t *testing.T) {
		plain := wstest.NewGorilla().Start(t) // ws:// server answers a ClientHello with HTTP 400
		wantDialErr(t, dialErr("wss://"+strings.TrimPrefix(plain.URL, "ws://"), tlsOpts), talaris.ErrTLSNotTLS, talaris.ErrTLS)
	})
	t.Run("NotTLS-silent-close", func(t *testing.T) {
		// A server that reads the ClientHello and hangs up: not a TLS
		// verdict, the connection was lost during the handshake.
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Read(make([]byte, 4096))
			c.Close()
		}()
		err = dialErr("wss://"+ln.Addr().String(), tlsOpts)
		if err == nil {
			t.Fatal("Dial succeeded")
		}
		t.Logf("error: %v", err)
		if !errors.Is(err, talaris.ErrConnectionLost) {
			t.Errorf("errors.Is(%v, ErrConnectionLost) = false", err)
		}
	})
}

// rewriteProxy forwards TCP to target, replacing the first occurrence of
// from with to (same length) in the server's bytes. Returns wss://addr.
func rewriteProxy(t *testing.T, target string, from, to []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp4", target)
			if err != nil {
				c.Close()
				continue
			}
			wg.Add(2)
			go func() { defer wg.Done(); io.Copy(s, c); s.Close() }()
			go func() {
				defer wg.Done()
				defer c.Close()
				var seen []byte
				buf := make([]byte, 32<<10)
				done := false
				s.SetReadDeadline(time.Now().Add(hangGuard))
				for {
					n, err := s.Read(buf)
					if n > 0 {
						out := buf[:n]
						if !done {
							seen = append(seen, out...)
							if i := bytes.Index(seen, from); i >= 0 {
								copy(seen[i:], to)
								done = true
							}
							// Hold bytes until the pattern is found (the
							// ServerHello comes first and is small).
							if !done && len(seen) < 64<<10 {
								continue
							}
							out = seen
						}
						if _, werr := c.Write(out); werr != nil {
							return
						}
						seen = nil
					}
					if err != nil {
						if len(seen) > 0 {
							c.Write(seen)
						}
						return
					}
				}
			}()
		}
	}()
	return "wss://" + ln.Addr().String()
}

// TestTLSEndings: how a wss:// stream ends. A completed close handshake
// followed by close_notify is EventClose (TestTLSIntegrity); a server that
// goes away without a close frame is ErrConnectionLost whether it sent
// close_notify, just closed TCP, or closed TCP in the middle of a record,
// identically on both backends.
func TestTLSEndings(t *testing.T) {
	cfg := serverTLS(t, testCertFile, testKeyFile, 0, 0)
	cases := []struct{ name, query string }{
		{"close_notify", ""},
		{"truncated", "&trunc=1"},
		{"truncated-mid-record", "&trunc=1&partial=1"},
		{"truncated-rst", "&trunc=1&rst=1"},
	}
	forEachTLSServer(t, cfg, func(t *testing.T, srv *wstest.Server) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				const n = 5000
				ctx, cancel := context.WithTimeout(context.Background(), tlsDialTimeout)
				defer cancel()
				c, err := p.Dial(ctx, srv.URL+fmt.Sprintf("/drop?n=%d&size=100", n)+tc.query, tlsOpts)
				if err != nil {
					t.Fatal(err)
				}
				chk := wstest.NewChecker(100)
				var chkErr error
				f := pumpOne(t, p, c, func(ev talaris.Event) {
					if ev.Kind == talaris.EventBinary && chkErr == nil {
						chkErr = chk.Check(ev.Payload)
					}
				})
				if chkErr != nil {
					t.Error(chkErr)
				}
				// With rst=1 the reset may destroy data still in flight.
				if chk.Count() != n && !strings.Contains(tc.query, "rst") {
					t.Errorf("got %d messages, want %d", chk.Count(), n)
				}
				if f.Kind != talaris.EventError || !errors.Is(f.Err, talaris.ErrConnectionLost) || f.Code != talaris.CloseAbnormal {
					t.Errorf("final event %+v, want EventError ErrConnectionLost 1006", f)
				} else {
					t.Logf("final: %v", f.Err)
				}
			})
		}
	})
}

var wsKeyRe = regexp.MustCompile(`Sec-WebSocket-Key: ([A-Za-z0-9+/=]+)\r\n`)

// frames builds n binary frames of messages from..from+n-1, each kept under
// PIPE_BUF together so that one write reaches s_server whole.
func sFrames(from, n, size int) []byte {
	var b []byte
	for i := from; i < from+n; i++ {
		b = ws.AppendFrame(b, true, ws.OpBinary, wstest.Payload(i, size))
	}
	return b
}

var (
	sentKeyUpdate = regexp.MustCompile(`>>> TLS 1\.3, Handshake \[length [0-9a-f]+\], KeyUpdate`)
	rcvdKeyUpdate = regexp.MustCompile(`<<< TLS 1\.3, Handshake \[length [0-9a-f]+\], KeyUpdate`)
)

// TestTLSKeyUpdate: openssl s_server sends KeyUpdate with update_requested
// (K) and without (k) on a connection where the client never sends data.
// The client must acknowledge K with its own KeyUpdate before any further
// data arrives, and keep receiving across every key change.
func TestTLSKeyUpdate(t *testing.T) {
	s := startSServer(t, "-tls1_3")
	p := newTestPool(t, talaris.Config{}, hangGuard)
	c := sServerSession(t, p, s, tlsOpts)
	const size = 24
	chk := wstest.NewChecker(size)
	next := 0
	batch := func(n int) {
		s.write(sFrames(next, n, size))
		next += n
		if f := pumpCount(t, p, c, chk, next); f != nil {
			t.Fatalf("connection ended after %d messages: %+v", chk.Count(), *f)
		}
	}
	batch(100)
	for round := range 3 {
		off := s.outLen()
		s.command("K")
		_, off = s.waitFor(sentKeyUpdate, off)
		// The acknowledgement must come without any more server data:
		// the client sends nothing else on this connection.
		s.waitFor(rcvdKeyUpdate, off)
		batch(100)
		off = s.outLen()
		s.command("k")
		s.waitFor(sentKeyUpdate, off)
		batch(100)
		t.Logf("round %d: %d messages so far", round, chk.Count())
	}
	// The client's own writes still work under the new keys: a ping is
	// answered with a pong that s_server prints (masked, so look for the
	// opcode byte only), then a server close completes the handshake.
	if err := c.SendBinary([]byte("after key updates")); err != nil {
		t.Fatal(err)
	}
	off := s.outLen()
	s.write(ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(1000, "done")))
	s.waitForBytes([]byte{0x88, 0x86}, off) // client close: code + "done", masked
	var final *finalEvent
	go func() {
		// The client ends its side once the close handshake is complete
		// (close_notify, FIN), so s_server may be gone already; if not,
		// close TCP from its side. Either way the write may fail.
		time.Sleep(50 * time.Millisecond)
		io.WriteString(s.stdin, "Q\n")
	}()
	final = pumpCount(t, p, c, chk, next+1)
	if final == nil || final.Kind != talaris.EventClose || final.Code != 1000 || final.Reason != "done" {
		t.Fatalf("final event %+v, want EventClose 1000 done", final)
	}
	if chk.Count() != next {
		t.Errorf("got %d messages, want %d", chk.Count(), next)
	}
}

// TestTLSRenegotiation: a TLS 1.2 server asks for renegotiation mid-stream
// (s_server r). The client refuses (BoringSSL never renegotiates; OpenSSL
// is set up the same way): everything before the request arrives intact
// and the connection ends with an ErrTLS error, on both backends.
func TestTLSRenegotiation(t *testing.T) {
	s := startSServer(t, "-tls1_2")
	p := newTestPool(t, talaris.Config{}, hangGuard)
	c := sServerSession(t, p, s, tlsOpts)
	const size = 40
	chk := wstest.NewChecker(size)
	s.write(sFrames(0, 50, size))
	if f := pumpCount(t, p, c, chk, 50); f != nil {
		t.Fatalf("connection ended early: %+v", *f)
	}
	off := s.outLen()
	s.command("r")
	s.waitFor(regexp.MustCompile(`>>> TLS 1\.2, Handshake \[length [0-9a-f]+\], HelloRequest`), off)
	// Data after the request, in case the server keeps going; it may be
	// gone already (the client's refusal is fatal), so errors are fine.
	s.writeNoFatal(sFrames(50, 50, size))
	f := pumpCount(t, p, c, chk, 1<<30)
	t.Logf("after the renegotiation request: %d messages, final %+v", chk.Count(), f)
	if f == nil || f.Kind != talaris.EventError || !errors.Is(f.Err, talaris.ErrTLS) {
		t.Fatalf("final event %+v, want EventError ErrTLS", f)
	}
}

// ---- Node ws over https ----

// TestTLSNodeWS streams sequence-numbered messages from Node's ws package
// over https: an independent TLS and WebSocket stack. build.sh installs ws
// into build/node.
func TestTLSNodeWS(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found")
	}
	modDir, _ := filepath.Abs("../build/node/node_modules")
	if d := os.Getenv("TALARIS_NODE_MODULES"); d != "" {
		modDir = d
	}
	if _, err := os.Stat(filepath.Join(modDir, "ws")); err != nil {
		t.Skipf("Node module ws not found in %s (./build.sh test installs it)", modDir)
	}
	for _, tc := range []struct {
		n, size int
		tlsMax  string
	}{{scaled(200_000), 32, "TLSv1.3"}, {200, 65536, "TLSv1.2"}, {4, 1 << 20, "TLSv1.3"}} {
		t.Run(fmt.Sprintf("n%d_size%d_%s", tc.n, tc.size, tc.tlsMax), func(t *testing.T) {
			cmd := exec.Command(node, "../testdata/node/wss_server.js", testCertFile, testKeyFile, tc.tlsMax)
			cmd.Env = append(os.Environ(), "NODE_PATH="+modDir)
			cmd.Stderr = os.Stderr
			url := "wss://127.0.0.1:" + startListener(t, "node server", cmd)
			p := newTestPool(t, talaris.Config{}, hangGuard)
			runStreamTLS(t, p, url, tlsOpts, streamSpec{n: tc.n, size: tc.size}, nil)
		})
	}
}

// certPool is unused by the client (it loads PEM itself) but documents the
// chain the Go servers present; it also checks the test PKI parses.
func TestTLSTestPKI(t *testing.T) {
	ca, err := os.ReadFile(testCAFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		t.Fatal("ca.pem holds no certificate")
	}
	cert, err := tls.LoadX509KeyPair(testCertFile, testKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "localhost"}); err != nil {
		t.Fatalf("server.pem does not verify against ca.pem: %v", err)
	}
}

// TestTLSCloseNotifyLater: the server answers our close frame, then, in a
// later TCP segment, ends its TLS stream, and keeps TCP open until we end
// (or closes it). Both close frames have crossed, so the connection ends
// at once, never waiting out CloseTimeout, for every way the stream ends:
//   - close_notify: its close_notify, a clean end (EventClose 1000; the
//     loop must read the bytes after the close frame to see it);
//   - junk: a record no key opens. That is a failure even after the close
//     handshake (a tampered or forged record is no end of stream):
//     EventError ErrTLS;
//   - junk2, junk2+fin: two such records in one segment, then nothing or a
//     FIN: the first fails the connection at once (the second, still
//     queued, holds nothing up).
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
					p := newTestPool(t, talaris.Config{CloseTimeout: 2 * time.Second, Tuning: talaris.Tuning{NoTLSRecordLayer: lib}}, hangGuard)
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
					if end == "close_notify" {
						if f == nil || f.Kind != talaris.EventClose || f.Code != 1000 {
							t.Fatalf("final %+v, want EventClose 1000 (the close handshake crossed and the stream ended)", f)
						}
						return
					}
					if f == nil || f.Kind != talaris.EventError || !errors.Is(f.Err, talaris.ErrTLS) || errors.Is(f.Err, talaris.ErrCloseTimeout) {
						t.Fatalf("final %+v, want EventError ErrTLS (a record that does not open, after the close handshake)", f)
					}
				})
			}
		}
	}
}
