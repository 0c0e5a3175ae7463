//go:build linux && cgo

package talaris_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testcerts"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// The TLS policy, against real servers on loopback (Go
// crypto/tls behind gorilla, and `openssl s_server`), with certificates
// made here by internal/testcerts. Run once per backend: go test ./ and
// go test -tags talaris_openssl ./.

// issue makes a certificate or fails the test.
func issue(t testing.TB, tpl testcerts.Template, issuer *testcerts.Cert) *testcerts.Cert {
	t.Helper()
	c, err := testcerts.Issue(tpl, issuer)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// keyPEM is c's private key in PEM or fails the test.
func keyPEM(t testing.TB, c *testcerts.Cert) []byte {
	t.Helper()
	k, err := c.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var (
	serverEKU = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	clientEKU = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
)

// issueCA makes a self-signed CA named cn.
func issueCA(t testing.TB, cn string) *testcerts.Cert {
	return issue(t, testcerts.Template{CN: cn, CA: true}, nil)
}

// issueLeaf makes a server certificate for localhost and 127.0.0.1.
func issueLeaf(t testing.TB, issuer *testcerts.Cert) *testcerts.Cert {
	return issue(t, testcerts.Template{CN: "localhost", DNS: []string{"localhost"},
		IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, EKU: serverEKU}, issuer)
}

// tlsLog records the server side of every TLS handshake of a server:
// crypto/tls calls VerifyConnection for full and resumed handshakes alike.
type tlsLog struct {
	mu     sync.Mutex
	states []tls.ConnectionState
}

// start serves gorilla over TLS with cfg, recording its handshakes.
func (l *tlsLog) start(t testing.TB, cfg *tls.Config) *wstest.Server {
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		l.mu.Lock()
		l.states = append(l.states, cs)
		l.mu.Unlock()
		return nil
	}
	return wstest.NewGorilla().StartTLS(t, cfg)
}

func (l *tlsLog) last(t testing.TB) tls.ConnectionState {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.states) == 0 {
		t.Fatal("the server saw no handshake")
	}
	return l.states[len(l.states)-1]
}

// startTLSServer serves gorilla over TLS with cfg and a log of its
// handshakes.
func startTLSServer(t testing.TB, cfg *tls.Config) (*wstest.Server, *tlsLog) {
	l := &tlsLog{}
	return l.start(t, cfg), l
}

// portOf is the port of a server URL.
func portOf(url string) string { return url[strings.LastIndexByte(url, ':')+1:] }

// dialClose dials url's /echo and, when that worked, closes the
// connection and pumps until its final event (a clean EventClose). It
// returns the dial's error and the stats seen while open.
func dialClose(t testing.TB, p *talaris.Pool, url string, opts *talaris.DialOptions) (talaris.ConnStats, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), tlsDialTimeout)
	defer cancel()
	c, err := p.Dial(ctx, url+"/echo", opts)
	if err != nil {
		return talaris.ConnStats{}, err
	}
	st := c.Stats()
	if err := c.Close(talaris.CloseNormal, ""); err != nil {
		t.Errorf("Close: %v", err)
	}
	var final *finalEvent
	pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
		if cc == c && (ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError) {
			f := copyFinal(ev)
			final = &f
		}
	}, func() bool { return final != nil }, nil)
	if final.Kind != talaris.EventClose || final.Code != talaris.CloseNormal {
		t.Errorf("connection ended with %+v, want a clean close", *final)
	}
	return st, nil
}

// wantVerdict checks err against a verdict: nil, or the sentinel want and
// none of the other causes (with ErrTLS as parent unless it is a config
// error).
func wantVerdict(t *testing.T, err, want error) {
	t.Helper()
	if want == nil {
		if err != nil {
			t.Fatalf("dial failed: %v, want success", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("dial succeeded, want %v", want)
	}
	t.Logf("error: %v", err)
	if !errors.Is(err, want) {
		t.Fatalf("errors.Is(%v, %v) = false", err, want)
	}
	for _, s := range append(tlsSentinels, talaris.ErrTLSPin, talaris.ErrInvalidConfig) {
		if s != want && errors.Is(err, s) {
			t.Errorf("error %v also matches %v", err, s)
		}
	}
	if want != talaris.ErrInvalidConfig && !errors.Is(err, talaris.ErrTLS) {
		t.Errorf("errors.Is(%v, ErrTLS) = false", err)
	}
}

// TestTLSVerdicts is the table in docs/ARCHITECTURE.md (TLS): one verdict
// per situation, whichever backend this binary links.
func TestTLSVerdicts(t *testing.T) {
	t.Logf("TLS backend %s", talaris.TLSBackend())
	root := issueCA(t, "verdict root")
	other := issueCA(t, "verdict untrusted root")
	inter := issue(t, testcerts.Template{CN: "verdict intermediate", CA: true}, root)
	past := time.Now().Add(-48 * time.Hour)
	future := time.Now().Add(48 * time.Hour)
	local := []string{"localhost"}
	selfLeaf := issue(t, testcerts.Template{CN: "localhost", DNS: local, EKU: serverEKU}, nil)
	selfCA := issue(t, testcerts.Template{CN: "localhost", DNS: local, CA: true, EKU: serverEKU}, nil)
	interLeaf := issueLeaf(t, inter)

	cases := []struct {
		name     string
		cert     tls.Certificate
		roots    *testcerts.Cert
		host     string // dial host ("localhost" unless set)
		min, max uint16 // server versions
		want     error
	}{
		{name: "good", cert: issueLeaf(t, root).TLS(), roots: root},
		{name: "good-ip-san", cert: issueLeaf(t, root).TLS(), roots: root, host: "127.0.0.1"},
		{name: "untrusted-root", cert: issueLeaf(t, other).TLS(), roots: root, want: talaris.ErrTLSUnknownCA},
		{name: "expired", cert: issue(t, testcerts.Template{CN: "localhost", DNS: local, EKU: serverEKU,
			NotBefore: past.Add(-time.Hour), NotAfter: past}, root).TLS(), roots: root, want: talaris.ErrTLSExpired},
		{name: "not-yet-valid", cert: issue(t, testcerts.Template{CN: "localhost", DNS: local, EKU: serverEKU,
			NotBefore: future, NotAfter: future.Add(time.Hour)}, root).TLS(), roots: root, want: talaris.ErrTLSExpired},
		{name: "wrong-host", cert: issue(t, testcerts.Template{CN: "localhost", DNS: []string{"wrong.example"}, EKU: serverEKU}, root).TLS(),
			roots: root, want: talaris.ErrTLSHostname},
		{name: "wrong-ip", cert: issue(t, testcerts.Template{CN: "127.0.0.1", DNS: local, EKU: serverEKU}, root).TLS(),
			roots: root, host: "127.0.0.1", want: talaris.ErrTLSHostname},
		{name: "cn-only", cert: issue(t, testcerts.Template{CN: "localhost", EKU: serverEKU}, root).TLS(), roots: root, want: talaris.ErrTLSHostname},
		{name: "self-signed-ca-false-as-root", cert: selfLeaf.TLS(), roots: selfLeaf},
		{name: "self-signed-ca-true-as-root", cert: selfCA.TLS(), roots: selfCA},
		{name: "leaf-plus-intermediate", cert: interLeaf.TLS(inter), roots: root},
		{name: "missing-intermediate", cert: interLeaf.TLS(), roots: root, want: talaris.ErrTLSUnknownCA},
		{name: "eku-client-auth-only", cert: issue(t, testcerts.Template{CN: "localhost", DNS: local, EKU: clientEKU}, root).TLS(),
			roots: root, want: talaris.ErrTLS},
		{name: "tls10-11-only-server", cert: issueLeaf(t, root).TLS(), roots: root,
			min: tls.VersionTLS10, max: tls.VersionTLS11, want: talaris.ErrTLS},
	}
	p := newTestPool(t, talaris.Config{}, hangGuard)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := wstest.NewGorilla().StartTLS(t, &tls.Config{Certificates: []tls.Certificate{tc.cert}, MinVersion: tc.min, MaxVersion: tc.max})
			host := tc.host
			if host == "" {
				host = "localhost"
			}
			_, err := dialClose(t, p, "wss://"+host+":"+portOf(srv.URL), &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAPEM: tc.roots.CertPEM()}})
			wantVerdict(t, err, tc.want)
		})
	}
}

// mtlsPKI is a server chain and a client chain with separate roots.
type mtlsPKI struct {
	root, leaf, clientCA, rsaClient, ecClient *testcerts.Cert
	clientCAs                                 *x509.CertPool
}

func newMTLSPKI(t testing.TB) *mtlsPKI {
	k := &mtlsPKI{root: issueCA(t, "mtls root"), clientCA: issueCA(t, "mtls client CA")}
	k.leaf = issueLeaf(t, k.root)
	k.rsaClient = issue(t, testcerts.Template{CN: "rsa client", EKU: clientEKU, RSA: true}, k.clientCA)
	k.ecClient = issue(t, testcerts.Template{CN: "ecdsa client", EKU: clientEKU}, k.clientCA)
	k.clientCAs = x509.NewCertPool()
	k.clientCAs.AddCert(k.clientCA.Cert)
	return k
}

// serverConfig requires and verifies a client certificate, at most
// version maxV (0: TLS 1.3).
func (k *mtlsPKI) serverConfig(maxV uint16) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{k.leaf.TLS()}, ClientAuth: tls.RequireAndVerifyClientCert,
		ClientCAs: k.clientCAs, MaxVersion: maxV}
}

// wantNoCertRefused checks the dial of a client without a certificate to a
// server that requires one failed. With TLS 1.3 the client's handshake is
// over before the server reads its (empty) certificate, so the refusal
// arrives as an alert (ErrTLS) or as the connection's end.
func wantNoCertRefused(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		t.Fatal("dial without a client certificate succeeded")
	}
	t.Logf("error: %v", err)
	if !errors.Is(err, talaris.ErrTLS) && !errors.Is(err, talaris.ErrConnectionLost) {
		t.Fatalf("error %v is not a TLS failure", err)
	}
}

// TestTLSClientCert: mutual TLS against crypto/tls with
// RequireAndVerifyClientCert, RSA and ECDSA client keys from memory and
// from files, at TLS 1.2 and 1.3; refused without a certificate.
func TestTLSClientCert(t *testing.T) {
	k := newMTLSPKI(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	if err := os.WriteFile(certFile, k.rsaClient.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM(t, k.rsaClient), 0o600); err != nil {
		t.Fatal(err)
	}
	p := newTestPool(t, talaris.Config{}, hangGuard)
	for _, ver := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		srv, log := startTLSServer(t, k.serverConfig(ver))
		vname := tls.VersionName(ver)
		for _, tc := range []struct {
			name string
			c    *testcerts.Cert
			tls  talaris.TLSOptions
		}{
			{"rsa-pem", k.rsaClient, talaris.TLSOptions{ClientCertPEM: k.rsaClient.CertPEM(), ClientKeyPEM: keyPEM(t, k.rsaClient)}},
			{"ecdsa-pem", k.ecClient, talaris.TLSOptions{ClientCertPEM: k.ecClient.CertPEM(), ClientKeyPEM: keyPEM(t, k.ecClient)}},
			{"rsa-files", k.rsaClient, talaris.TLSOptions{ClientCertFile: certFile, ClientKeyFile: keyFile}},
		} {
			t.Run(vname+"/"+tc.name, func(t *testing.T) {
				opts := tc.tls
				opts.RootCAPEM = k.root.CertPEM()
				if _, err := dialClose(t, p, srv.URL, &talaris.DialOptions{TLS: opts}); err != nil {
					t.Fatalf("dial: %v", err)
				}
				st := log.last(t)
				if len(st.PeerCertificates) == 0 || !st.PeerCertificates[0].Equal(tc.c.Cert) {
					t.Fatalf("server saw client certificates %v", st.PeerCertificates)
				}
				if st.Version != ver {
					t.Fatalf("version %s, want %s", tls.VersionName(st.Version), vname)
				}
			})
		}
		t.Run(vname+"/no-cert-refused", func(t *testing.T) {
			_, err := dialClose(t, p, srv.URL, &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAPEM: k.root.CertPEM()}})
			wantNoCertRefused(t, err)
		})
	}
}

// TestTLSClientCertSServer: `openssl s_server -Verify 1` requires a client
// certificate signed by the client CA; with one the scripted upgrade opens
// the connection (and s_server names the client), without one the dial
// fails.
func TestTLSClientCertSServer(t *testing.T) {
	k := newMTLSPKI(t)
	caFile := filepath.Join(t.TempDir(), "client-ca.pem")
	if err := os.WriteFile(caFile, k.clientCA.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	withCert := &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAFile: testCAFile, ClientCertPEM: k.ecClient.CertPEM(), ClientKeyPEM: keyPEM(t, k.ecClient)}}
	for _, ver := range []string{"-tls1_2", "-tls1_3"} {
		t.Run(ver[1:]+"/with-cert", func(t *testing.T) {
			s := startSServer(t, ver, "-Verify", "1", "-CAfile", caFile)
			p := newTestPool(t, talaris.Config{}, hangGuard)
			c := sServerSession(t, p, s, withCert)
			s.waitFor(regexp.MustCompile(`depth=0 .*CN ?= ?ecdsa client`), 0) // s_server verified it
			const size = 24
			chk := wstest.NewChecker(size)
			s.write(sFrames(0, 10, size))
			if f := pumpCount(t, p, c, chk, 10); f != nil {
				t.Fatalf("connection ended after %d messages: %+v", chk.Count(), *f)
			}
			off := s.outLen()
			s.write(ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(1000, "done")))
			s.waitForBytes([]byte{0x88, 0x86}, off) // the client's close: code + "done", masked
			go func() {
				// The client ends its side once the close handshake is
				// complete (close_notify, FIN), so s_server may be gone
				// already; if not, close TCP from its side. The write may
				// fail either way.
				time.Sleep(50 * time.Millisecond)
				io.WriteString(s.stdin, "Q\n")
			}()
			f := pumpCount(t, p, c, chk, 11)
			if f == nil || f.Kind != talaris.EventClose || f.Code != 1000 || f.Reason != "done" {
				t.Fatalf("final event %+v, want EventClose 1000 done", f)
			}
		})
		t.Run(ver[1:]+"/without-cert", func(t *testing.T) {
			s := startSServer(t, ver, "-Verify", "1", "-CAfile", caFile)
			p := newTestPool(t, talaris.Config{}, hangGuard)
			ctx, cancel := context.WithTimeout(context.Background(), tlsDialTimeout)
			defer cancel()
			_, err := p.Dial(ctx, "wss://127.0.0.1:"+s.port+"/feed", tlsOpts)
			wantNoCertRefused(t, err)
		})
	}
}

// TestTLSPins: a matching pin passes, a wrong one fails with ErrTLSPin even
// though the chain verifies, any matching pin of several passes, and pins
// are enforced with InsecureSkipVerify.
func TestTLSPins(t *testing.T) {
	root := issueCA(t, "pin root")
	leaf := issueLeaf(t, root)
	srv := wstest.NewGorilla().StartTLS(t, &tls.Config{Certificates: []tls.Certificate{leaf.TLS()}})
	wrong := sha256.Sum256([]byte("not a key"))
	p := newTestPool(t, talaris.Config{}, hangGuard)
	for _, tc := range []struct {
		name string
		opts talaris.TLSOptions
		want error
	}{
		{"match", talaris.TLSOptions{RootCAPEM: root.CertPEM(), Pins: [][]byte{leaf.SPKIPin()}}, nil},
		{"mismatch", talaris.TLSOptions{RootCAPEM: root.CertPEM(), Pins: [][]byte{wrong[:]}}, talaris.ErrTLSPin},
		{"second-matches", talaris.TLSOptions{RootCAPEM: root.CertPEM(), Pins: [][]byte{wrong[:], leaf.SPKIPin()}}, nil},
		{"root-key-is-not-the-leaf", talaris.TLSOptions{RootCAPEM: root.CertPEM(), Pins: [][]byte{root.SPKIPin()}}, talaris.ErrTLSPin},
		{"insecure-match", talaris.TLSOptions{InsecureSkipVerify: true, Pins: [][]byte{leaf.SPKIPin()}}, nil},
		{"insecure-mismatch", talaris.TLSOptions{InsecureSkipVerify: true, Pins: [][]byte{wrong[:]}}, talaris.ErrTLSPin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := dialClose(t, p, srv.URL, &talaris.DialOptions{TLS: tc.opts})
			wantVerdict(t, err, tc.want)
		})
	}
}

// TestTLSVersionAndSuites: MinVersion 1.3 against a TLS 1.2 server fails;
// the chosen suites are the ones the server reports.
func TestTLSVersionAndSuites(t *testing.T) {
	root := issueCA(t, "suites root")
	leaf := issueLeaf(t, root)
	srv12, log12 := startTLSServer(t, &tls.Config{Certificates: []tls.Certificate{leaf.TLS()}, MaxVersion: tls.VersionTLS12})
	srv, log := startTLSServer(t, &tls.Config{Certificates: []tls.Certificate{leaf.TLS()}})
	p := newTestPool(t, talaris.Config{}, hangGuard)
	base := talaris.TLSOptions{RootCAPEM: root.CertPEM()}

	t.Run("min13-vs-12-server", func(t *testing.T) {
		o := base
		o.MinVersion = tls.VersionTLS13
		_, err := dialClose(t, p, srv12.URL, &talaris.DialOptions{TLS: o})
		wantVerdict(t, err, talaris.ErrTLS)
	})
	t.Run("min13", func(t *testing.T) {
		o := base
		o.MinVersion = tls.VersionTLS13
		if _, err := dialClose(t, p, srv.URL, &talaris.DialOptions{TLS: o}); err != nil {
			t.Fatal(err)
		}
		if v := log.last(t).Version; v != tls.VersionTLS13 {
			t.Fatalf("version %s", tls.VersionName(v))
		}
	})
	t.Run("default-12", func(t *testing.T) {
		if _, err := dialClose(t, p, srv12.URL, &talaris.DialOptions{TLS: base}); err != nil {
			t.Fatal(err)
		}
		st := log12.last(t)
		if st.Version != tls.VersionTLS12 {
			t.Fatalf("version %s", tls.VersionName(st.Version))
		}
		t.Logf("default at TLS 1.2: %s", tls.CipherSuiteName(st.CipherSuite))
	})
	for _, id := range []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA} {
		t.Run("tls12-only-"+tls.CipherSuiteName(id), func(t *testing.T) {
			o := base
			o.CipherSuites = []uint16{id} // no TLS 1.3 suite: TLS 1.3 is off
			if _, err := dialClose(t, p, srv.URL, &talaris.DialOptions{TLS: o}); err != nil {
				t.Fatal(err)
			}
			st := log.last(t)
			if st.CipherSuite != id || st.Version != tls.VersionTLS12 {
				t.Fatalf("server reports %s %s, want %s at TLS 1.2", tls.VersionName(st.Version),
					tls.CipherSuiteName(st.CipherSuite), tls.CipherSuiteName(id))
			}
		})
	}
	for _, id := range []uint16{tls.TLS_CHACHA20_POLY1305_SHA256, tls.TLS_AES_256_GCM_SHA384} {
		t.Run("tls13-"+tls.CipherSuiteName(id), func(t *testing.T) {
			o := base
			o.CipherSuites = []uint16{id}
			if _, err := dialClose(t, p, srv.URL, &talaris.DialOptions{TLS: o}); err != nil {
				t.Fatal(err)
			}
			st := log.last(t)
			t.Logf("server reports %s %s", tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite))
			if st.Version != tls.VersionTLS13 {
				t.Fatalf("version %s, want TLS 1.3", tls.VersionName(st.Version))
			}
			// BoringSSL offers its own TLS 1.3 suites whatever the list
			// says (documented on TLSOptions.CipherSuites).
			if talaris.TLSBackend() == "openssl" && st.CipherSuite != id {
				t.Fatalf("suite %s, want %s", tls.CipherSuiteName(st.CipherSuite), tls.CipherSuiteName(id))
			}
		})
	}
}

// TestTLSInvalidOptions: bad values fail at Dial with ErrInvalidConfig
// and a message naming the field, for wss:// and ws:// alike.
func TestTLSInvalidOptions(t *testing.T) {
	ca := issueCA(t, "cfg CA")
	a := issue(t, testcerts.Template{CN: "a"}, ca)
	b := issue(t, testcerts.Template{CN: "b"}, ca)
	p := newTestPool(t, talaris.Config{}, hangGuard)
	for _, tc := range []struct {
		name, msg string
		opts      talaris.TLSOptions
	}{
		{"unknown-suite", "unknown or unsupported suite 0x0005", talaris.TLSOptions{CipherSuites: []uint16{0x0005}}},
		{"rsa-kx-suite", "unsupported suite", talaris.TLSOptions{CipherSuites: []uint16{tls.TLS_RSA_WITH_AES_128_GCM_SHA256}}},
		{"empty-suites", "empty list", talaris.TLSOptions{CipherSuites: []uint16{}}},
		{"min13-no-13-suite", "no TLS 1.3 suite", talaris.TLSOptions{MinVersion: tls.VersionTLS13,
			CipherSuites: []uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256}}},
		{"min-tls11", "MinVersion", talaris.TLSOptions{MinVersion: tls.VersionTLS11}},
		{"min-junk", "MinVersion", talaris.TLSOptions{MinVersion: 7}},
		{"short-pin", "Pins[1]: 31 bytes", talaris.TLSOptions{Pins: [][]byte{make([]byte, 32), make([]byte, 31)}}},
		{"cert-without-key", "needs ClientKeyPEM", talaris.TLSOptions{ClientCertPEM: a.CertPEM()}},
		{"key-without-cert", "needs ClientCertPEM", talaris.TLSOptions{ClientKeyPEM: keyPEM(t, a)}},
		{"unparsable-cert", "ClientCert/ClientKey", talaris.TLSOptions{ClientCertPEM: []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"), ClientKeyPEM: keyPEM(t, a)}},
		{"unparsable-key", "ClientCert/ClientKey", talaris.TLSOptions{ClientCertPEM: a.CertPEM(), ClientKeyPEM: []byte("junk")}},
		{"key-mismatch", "does not match", talaris.TLSOptions{ClientCertPEM: a.CertPEM(), ClientKeyPEM: keyPEM(t, b)}},
		{"missing-file", "ClientCertFile", talaris.TLSOptions{ClientCertFile: "/nonexistent/cert.pem", ClientKeyPEM: keyPEM(t, a)}},
		{"missing-ca-file", "RootCAFile: open /nonexistent/ca.pem: no such file or directory", talaris.TLSOptions{RootCAFile: "/nonexistent/ca.pem"}},
		{"ca-file-without-pem", "RootCAFile: go.mod holds no PEM certificate", talaris.TLSOptions{RootCAFile: "go.mod"}},
		{"pem-and-file", "both set", talaris.TLSOptions{ClientCertFile: "x", ClientCertPEM: a.CertPEM(), ClientKeyPEM: keyPEM(t, a)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, url := range []string{"wss://127.0.0.1:1/", "ws://127.0.0.1:1/"} {
				_, err := dialClose(t, p, url, &talaris.DialOptions{TLS: tc.opts})
				wantVerdict(t, err, talaris.ErrInvalidConfig)
				if !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("message %q does not say %q", err, tc.msg)
				}
			}
			if _, err := p.DialAsync("wss://127.0.0.1:1/", &talaris.DialOptions{TLS: tc.opts}); !errors.Is(err, talaris.ErrInvalidConfig) {
				t.Fatalf("DialAsync: %v, want ErrInvalidConfig", err)
			}
		})
	}
	if n := p.ConnCount(); n != 0 {
		t.Fatalf("refused dials hold %d connections", n)
	}
}

// TestTLSResumption: a second Dial to the same address on the same Pool
// resumes, at TLS 1.3 and 1.2, and reports it in ConnStats.Resumed (the
// server agrees); other TLS options, another server name or another Pool
// do not resume; a pin is checked on a resumed handshake too.
func TestTLSResumption(t *testing.T) {
	root := issueCA(t, "resume root")
	leaf := issueLeaf(t, root)
	wrong := sha256.Sum256([]byte("not a key"))
	for _, ver := range []uint16{tls.VersionTLS13, tls.VersionTLS12} {
		t.Run(tls.VersionName(ver), func(t *testing.T) {
			srv, log := startTLSServer(t, &tls.Config{Certificates: []tls.Certificate{leaf.TLS()}, MaxVersion: ver})
			p := newTestPool(t, talaris.Config{}, hangGuard)
			opts := &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAPEM: root.CertPEM(), Pins: [][]byte{leaf.SPKIPin()}}}
			st, err := dialClose(t, p, srv.URL, opts)
			if err != nil {
				t.Fatal(err)
			}
			if st.Resumed || log.last(t).DidResume {
				t.Fatal("first dial resumed")
			}
			for i := 0; i < 3; i++ {
				st, err = dialClose(t, p, srv.URL, opts)
				if err != nil {
					t.Fatal(err)
				}
				if !st.Resumed || !log.last(t).DidResume {
					t.Fatalf("dial %d: Resumed %v, server DidResume %v", i+2, st.Resumed, log.last(t).DidResume)
				}
			}
			// Other trust settings: no session of the first ones is offered.
			st, err = dialClose(t, p, srv.URL, &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAPEM: root.CertPEM()}})
			if err != nil || st.Resumed {
				t.Fatalf("other options: err %v, Resumed %v", err, st.Resumed)
			}
			// Another SNI name for the same address: its own entry.
			sni := &talaris.DialOptions{TLS: opts.TLS}
			sni.TLS.ServerName = "localhost"
			if st, err = dialClose(t, p, srv.URL, sni); err != nil || st.Resumed {
				t.Fatalf("other SNI: err %v, Resumed %v", err, st.Resumed)
			}
			if st, err = dialClose(t, p, srv.URL, sni); err != nil || !st.Resumed {
				t.Fatalf("other SNI, again: err %v, Resumed %v", err, st.Resumed)
			}
			// Another Pool has its own cache.
			st, err = dialClose(t, newTestPool(t, talaris.Config{}, hangGuard), srv.URL, opts)
			if err != nil || st.Resumed {
				t.Fatalf("other pool: err %v, Resumed %v", err, st.Resumed)
			}
			// A plain ws:// dial on the pool reports Resumed false.
			plain := wstest.NewGorilla().Start(t)
			if st, err = dialClose(t, p, plain.URL, nil); err != nil || st.Resumed {
				t.Fatalf("ws://: err %v, Resumed %v", err, st.Resumed)
			}
			// InsecureSkipVerify with a wrong pin, twice: the second
			// handshake (its options differ, so its own cache entry) must
			// fail on the pin as the first did.
			bad := &talaris.DialOptions{TLS: talaris.TLSOptions{InsecureSkipVerify: true, Pins: [][]byte{wrong[:]}}}
			for i := 0; i < 2; i++ {
				_, err = dialClose(t, p, srv.URL, bad)
				wantVerdict(t, err, talaris.ErrTLSPin)
			}
		})
	}
}

// TestTLSResumptionTiming measures Dial (TCP connect, TLS handshake,
// upgrade on loopback) with full and resumed TLS 1.3 handshakes against a
// crypto/tls server: go test -run TestTLSResumptionTiming -v
// [-tags talaris_openssl]. It asserts only that each dial resumed or not
// as expected; the figures are logged. Skipped with -short.
func TestTLSResumptionTiming(t *testing.T) {
	if testing.Short() {
		t.Skip("timing")
	}
	root := issueCA(t, "timing root")
	leaf := issueLeaf(t, root)
	full := wstest.NewGorilla().StartTLS(t, &tls.Config{Certificates: []tls.Certificate{leaf.TLS()}, SessionTicketsDisabled: true})
	res := wstest.NewGorilla().StartTLS(t, &tls.Config{Certificates: []tls.Certificate{leaf.TLS()}})
	p := newTestPool(t, talaris.Config{}, 2*hangGuard)
	opts := &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAPEM: root.CertPEM()}}
	const n = 200
	measure := func(url string, wantResumed bool) time.Duration {
		dialClose(t, p, url, opts) // warm up, fill the cache
		var d []time.Duration
		for i := 0; i < n; i++ {
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), tlsDialTimeout)
			c, err := p.Dial(ctx, url+"/echo", opts)
			el := time.Since(t0)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			if c.Stats().Resumed != wantResumed {
				t.Fatalf("Resumed %v, want %v", c.Stats().Resumed, wantResumed)
			}
			c.Close(talaris.CloseNormal, "")
			pumpOne(t, p, c, nil)
			d = append(d, el)
		}
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		t.Logf("%s resumed=%v: p10 %v p50 %v p90 %v (%d dials)", talaris.TLSBackend(), wantResumed,
			d[n/10].Round(time.Microsecond), d[n/2].Round(time.Microsecond), d[n*9/10].Round(time.Microsecond), n)
		return d[n/2]
	}
	f := measure(full.URL, false)
	r := measure(res.URL, true)
	t.Logf("%s: median dial full %v, resumed %v", talaris.TLSBackend(), f.Round(time.Microsecond), r.Round(time.Microsecond))
}

// TestTLSDialRacesClose: dials with a client certificate and pins (Dial
// and DialAsync) race Conn.Close and Pool.Close from other goroutines
// while a goroutine pumps; afterwards every handle answers as ended. No
// crash, no hang (every wait below ends because Pool.Close ends every
// dial, pump and connection), and only the errors of closing appear.
func TestTLSDialRacesClose(t *testing.T) {
	k := newMTLSPKI(t)
	srv := wstest.NewGorilla().StartTLS(t, k.serverConfig(0))
	opts := &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAPEM: k.root.CertPEM(), ClientCertPEM: k.ecClient.CertPEM(),
		ClientKeyPEM: keyPEM(t, k.ecClient), Pins: [][]byte{k.leaf.SPKIPin()}}}
	closing := func(err error) bool {
		return err == nil || errors.Is(err, talaris.ErrClosed) || errors.Is(err, talaris.ErrPoolClosed)
	}
	rounds := 12
	if testing.Short() {
		rounds = 4
	}
	for round := 0; round < rounds; round++ {
		p, err := talaris.NewPool(talaris.Config{MaxConns: 64})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var all []talaris.Conn
		conns := make(chan talaris.Conn, 64)
		var dialers, others sync.WaitGroup
		others.Add(1)
		go func() { // the pumper: every connection error is one of closing
			defer others.Done()
			for {
				_, err := p.Pump(func(c talaris.Conn, ev talaris.Event) {
					if ev.Kind == talaris.EventError && !closing(ev.Err) {
						t.Errorf("round %d: connection error %v", round, ev.Err)
					}
				})
				if poolEmptied(err) {
					// No connection yet (or none left): Pump does not
					// block on an empty pool, so wait for a dial or for
					// Pool.Close, which ends this loop.
					continue
				}
				if err != nil {
					if !errors.Is(err, talaris.ErrPoolClosed) {
						t.Errorf("Pump: %v", err)
					}
					return
				}
			}
		}()
		for d := 0; d < 4; d++ {
			dialers.Add(1)
			go func() {
				defer dialers.Done()
				for i := 0; i < 4; i++ {
					var c talaris.Conn
					var err error
					if (d+i)%2 == 0 {
						ctx, cancel := context.WithTimeout(context.Background(), tlsDialTimeout)
						c, err = p.Dial(ctx, srv.URL+"/echo", opts)
						cancel()
					} else {
						c, err = p.DialAsync(srv.URL+"/echo", opts)
					}
					if err != nil {
						if !closing(err) {
							t.Errorf("round %d: dial: %v", round, err)
						}
						continue
					}
					mu.Lock()
					all = append(all, c)
					mu.Unlock()
					conns <- c
				}
			}()
		}
		others.Add(1)
		go func() { // Conn.Close on every other connection as it appears
			defer others.Done()
			n := 0
			for c := range conns {
				if n++; n%2 == 0 {
					if err := c.Close(talaris.CloseNormal, ""); !closing(err) {
						t.Errorf("Conn.Close: %v", err)
					}
				}
			}
		}()
		// Pool.Close at a different point of the dials each round.
		time.Sleep(time.Duration(round) * 3 * time.Millisecond)
		if err := p.Close(); err != nil {
			t.Errorf("Pool.Close: %v", err)
		}
		// A Dial returns once the pool is closed, Pump returns
		// ErrPoolClosed: these waits end by construction.
		dialers.Wait()
		close(conns)
		others.Wait()
		mu.Lock()
		t.Logf("round %d: %d connections dialed before Pool.Close", round, len(all))
		for _, c := range all {
			if err := c.Close(talaris.CloseNormal, ""); !errors.Is(err, talaris.ErrClosed) && !errors.Is(err, talaris.ErrPoolClosed) {
				t.Errorf("Close after Pool.Close: %v, want ErrClosed or ErrPoolClosed", err)
			}
			if s := c.State(); s != talaris.StateClosed && s != talaris.StateIdle {
				t.Errorf("State after Pool.Close: %v", s)
			}
			if st := c.Stats(); st.Resumed || st.MsgsIn != 0 {
				t.Errorf("Stats after Pool.Close: %+v", st)
			}
		}
		mu.Unlock()
	}
}

// TestTLSServerNameTrailingDot: an absolute name ("localhost.") as
// TLSOptions.ServerName is sent in SNI without its root dot (RFC 6066 3)
// and verified against the certificate's names, as crypto/tls does. Found
// by a hostile review: the dot went out verbatim and a crypto/tls server
// refused the hello with a decode_error alert.
func TestTLSServerNameTrailingDot(t *testing.T) {
	root := issueCA(t, "dot root")
	leaf := issueLeaf(t, root)
	var mu sync.Mutex
	var sni []string
	srv := wstest.NewGorilla().StartTLS(t, &tls.Config{
		Certificates: []tls.Certificate{leaf.TLS()},
		GetConfigForClient: func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
			mu.Lock()
			sni = append(sni, chi.ServerName)
			mu.Unlock()
			return nil, nil
		},
	})
	p := newTestPool(t, talaris.Config{}, hangGuard)
	if _, err := dialClose(t, p, srv.URL, &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAPEM: root.CertPEM(), ServerName: "localhost."}}); err != nil {
		t.Fatalf("dial with ServerName \"localhost.\": %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sni) != 1 || sni[0] != "localhost" {
		t.Fatalf("SNI seen by the server %q, want [localhost]", sni)
	}
}

// TestTLSEd25519Server: a server with an Ed25519 certificate verifies on
// both backends, TLS 1.2 and 1.3. Found by a hostile review: BoringSSL
// leaves Ed25519 out of its verify list by default (handshake_failure)
// where OpenSSL offers it; new_ctx now adds it (tls.c).
func TestTLSEd25519Server(t *testing.T) {
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		NotBefore:    time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           serverEKU,
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, pub, key)
	if err != nil {
		t.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	root := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	p := newTestPool(t, talaris.Config{}, hangGuard)
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		t.Run(tls.VersionName(v), func(t *testing.T) {
			srv := wstest.NewGorilla().StartTLS(t, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: v, MaxVersion: v})
			if _, err := dialClose(t, p, "wss://localhost:"+portOf(srv.URL), &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAPEM: root}}); err != nil {
				t.Fatalf("%s backend: %v", talaris.TLSBackend(), err)
			}
		})
	}
}
