//go:build linux

package main

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testcerts"
	"github.com/talaris-go/talaris/internal/wstest"
)

func TestTLSFlags(t *testing.T) {
	sum := sha256.Sum256([]byte("spki"))
	for _, s := range []string{
		hex.EncodeToString(sum[:]),
		base64.StdEncoding.EncodeToString(sum[:]),
		"sha256/" + base64.StdEncoding.EncodeToString(sum[:]),
		base64.RawURLEncoding.EncodeToString(sum[:]),
	} {
		b, err := parsePin(s)
		if err != nil || !bytes.Equal(b, sum[:]) {
			t.Errorf("parsePin(%q) = %x, %v", s, b, err)
		}
	}
	for _, s := range []string{"", "abcd", hex.EncodeToString(sum[:31]), base64.StdEncoding.EncodeToString(sum[:31])} {
		if _, err := parsePin(s); err == nil {
			t.Errorf("parsePin(%q) succeeded", s)
		}
	}
	fs := flag.NewFlagSet("cat", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := addTLSFlags(fs)
	if err := fs.Parse([]string{"--cert", "c.pem", "--key", "k.pem", "--tls-min", "1.3", "--pin", hex.EncodeToString(sum[:]), "--pin", hex.EncodeToString(sum[:])}); err != nil {
		t.Fatal(err)
	}
	var o talaris.TLSOptions
	if err := f.apply(&o); err != nil {
		t.Fatal(err)
	}
	if o.ClientCertFile != "c.pem" || o.ClientKeyFile != "k.pem" || o.MinVersion != tls.VersionTLS13 || len(o.Pins) != 2 {
		t.Fatalf("options %+v", o)
	}
	*f.min = "1.1"
	if err := f.apply(&o); err == nil {
		t.Fatal("--tls-min 1.1 accepted")
	}
}

// TestCatTLSFlags runs `talaris cat` with --ca, --cert, --key, --tls-min
// and --pin against a crypto/tls server that requires a client
// certificate: it reads the whole stream; a wrong pin fails with the pin
// hint; a server at TLS 1.2 fails with --tls-min 1.3; bad flag values fail
// before dialing.
func TestCatTLSFlags(t *testing.T) {
	issue := func(tpl testcerts.Template, issuer *testcerts.Cert) *testcerts.Cert {
		c, err := testcerts.Issue(tpl, issuer)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	root := issue(testcerts.Template{CN: "cat root", CA: true}, nil)
	leaf := issue(testcerts.Template{CN: "localhost", IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		EKU: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, root)
	client := issue(testcerts.Template{CN: "cat client", EKU: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, RSA: true}, root)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	key, err := client.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	caF, certF, keyF := write("ca.pem", root.CertPEM()), write("client.pem", client.CertPEM()), write("client-key.pem", key)
	pool := x509.NewCertPool()
	pool.AddCert(root.Cert)
	cfg := &tls.Config{Certificates: []tls.Certificate{leaf.TLS()}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	srv := wstest.NewGorilla().StartTLS(t, cfg)
	cfg12 := cfg.Clone()
	cfg12.MaxVersion = tls.VersionTLS12
	srv12 := wstest.NewGorilla().StartTLS(t, cfg12)
	pin := base64.StdEncoding.EncodeToString(leaf.SPKIPin())
	wrong := sha256.Sum256([]byte("not the key"))
	tlsArgs := []string{"-q", "--timeout", "30s", "--ca", caF, "--cert", certF, "--key", keyF}

	if err := catMain(append(tlsArgs, "--tls-min", "1.3", "--pin", pin, "--count", "20", srv.URL+"/stream?n=20&size=16")); err != nil {
		t.Fatalf("cat with client certificate and pin: %v", err)
	}
	for _, tc := range []struct {
		name, url, want string
		args            []string
	}{
		{"wrong-pin", srv.URL, "matches no --pin", []string{"--pin", hex.EncodeToString(wrong[:])}},
		{"tls-min-1.3-vs-1.2", srv12.URL, "TLS", []string{"--tls-min", "1.3"}},
		{"bad-pin", srv.URL, "not a SHA-256 digest", []string{"--pin", "abcd"}},
		{"bad-tls-min", srv.URL, "want 1.2 or 1.3", []string{"--tls-min", "1.1"}},
		{"key-file-missing", srv.URL, "options", []string{"--key", filepath.Join(dir, "missing.pem")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := catMain(append(append(append([]string{}, tlsArgs...), tc.args...), tc.url+"/stream?n=1"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one that says %q", err, tc.want)
			}
			t.Logf("error: %v", err)
		})
	}
}
