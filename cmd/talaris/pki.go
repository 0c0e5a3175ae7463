//go:build linux

// Command talaris is the command-line face of the talaris WebSocket client:
//
//	talaris demo            a local feed server in a child process, a Pool reading from it, live rates and latency
//	talaris cat URL         subscribe to any ws:// or wss:// URL and print what arrives
//	talaris bench           talaris side by side with gorilla, gobwas, gws, coder (and the Rust talaris crate)
//
// Run "talaris COMMAND -h" for the flags of each command.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki names the files of a test CA and a server certificate for localhost,
// 127.0.0.1 and ::1.
type pki struct {
	CAFile, CertFile, KeyFile string
	tmp                       string // removed by cleanup when we generated the files
}

func (p *pki) cleanup() {
	if p != nil && p.tmp != "" {
		os.RemoveAll(p.tmp)
	}
}

// findTestdata returns the repository's testdata directory when the
// working directory is inside the repository: the nearest ancestor with a
// go.mod and a testdata directory (cmd/talaris has a go.mod of its own), or
// else the nearest go.mod's.
func findTestdata() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	first := ""
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			td := filepath.Join(dir, "testdata")
			if st, err := os.Stat(td); err == nil && st.IsDir() {
				return td
			}
			if first == "" {
				first = td
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return first
		}
		dir = parent
	}
}

// loadPKI uses testdata/ca.pem with a matching server certificate and key
// when the repository has them, and otherwise generates a throw-away CA and
// server certificate in a temporary directory.
func loadPKI() (*pki, error) {
	if td := findTestdata(); td != "" {
		ca := filepath.Join(td, "ca.pem")
		if _, err := os.Stat(ca); err == nil {
			for _, pair := range [][2]string{
				{"server.pem", "server-key.pem"}, {"server.pem", "server.key"},
				{"server.crt", "server.key"}, {"server-cert.pem", "server-key.pem"},
				{"localhost.pem", "localhost-key.pem"},
			} {
				c, k := filepath.Join(td, pair[0]), filepath.Join(td, pair[1])
				if _, err := os.Stat(c); err != nil {
					continue
				}
				if _, err := os.Stat(k); err != nil {
					continue
				}
				return &pki{CAFile: ca, CertFile: c, KeyFile: k}, nil
			}
		}
	}
	return generatePKI()
}

func generatePKI() (*pki, error) {
	dir, err := os.MkdirTemp("", "talaris-pki-")
	if err != nil {
		return nil, err
	}
	p := &pki{tmp: dir, CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem")}
	fail := func(err error) (*pki, error) {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("generating the test PKI: %w", err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fail(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "talaris demo CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return fail(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fail(err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return fail(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return fail(err)
	}
	for _, f := range []struct {
		name, typ string
		der       []byte
	}{{p.CAFile, "CERTIFICATE", caDER}, {p.CertFile, "CERTIFICATE", srvDER}, {p.KeyFile, "EC PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(f.name, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			return fail(err)
		}
	}
	return p, nil
}
