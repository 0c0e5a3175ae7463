// Package testcerts makes test certificates: Issue for a certificate of
// any shape (the TLS tests build their PKIs with it), and Generate for the
// committed test PKI in testdata/: a CA, a server certificate for
// localhost/127.0.0.1/::1 signed by it, an expired server certificate and
// an unrelated CA. Tests load the committed files; run
// `go run ./internal/testcerts/gen -out testdata` to make new ones.
package testcerts

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
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

// Template describes a certificate for Issue.
type Template struct {
	CN        string
	DNS       []string
	IPs       []net.IP
	CA        bool      // a CA (basic constraints CA:TRUE, may sign); else CA:FALSE
	NotBefore time.Time // zero: an hour ago
	NotAfter  time.Time // zero: a day from now
	EKU       []x509.ExtKeyUsage
	RSA       bool // an RSA 2048 key; else ECDSA P-256
}

// Cert is a certificate and its private key.
type Cert struct {
	Cert *x509.Certificate
	DER  []byte
	Key  crypto.Signer
}

// Issue makes a certificate from tpl, signed by issuer, or self-signed when
// issuer is nil.
func Issue(tpl Template, issuer *Cert) (*Cert, error) {
	var key crypto.Signer
	var err error
	if tpl.RSA {
		key, err = rsa.GenerateKey(rand.Reader, 2048)
	} else {
		key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	}
	if err != nil {
		return nil, err
	}
	if tpl.NotBefore.IsZero() {
		tpl.NotBefore = time.Now().Add(-time.Hour)
	}
	if tpl.NotAfter.IsZero() {
		tpl.NotAfter = time.Now().Add(24 * time.Hour)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	x := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: tpl.CN, Organization: []string{"talaris tests"}},
		DNSNames:              tpl.DNS,
		IPAddresses:           tpl.IPs,
		NotBefore:             tpl.NotBefore,
		NotAfter:              tpl.NotAfter,
		BasicConstraintsValid: true,
		IsCA:                  tpl.CA,
		ExtKeyUsage:           tpl.EKU,
		KeyUsage:              x509.KeyUsageDigitalSignature,
	}
	if tpl.CA {
		x.KeyUsage |= x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	}
	parent, signer := x, key
	if issuer != nil {
		parent, signer = issuer.Cert, issuer.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, x, parent, key.Public(), signer)
	if err != nil {
		return nil, err
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &Cert{Cert: c, DER: der, Key: key}, nil
}

// CertPEM returns the certificate in PEM.
func (c *Cert) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.DER})
}

// KeyPEM returns the private key in PEM: PKCS#1 for RSA, SEC 1 for ECDSA
// (the forms `openssl genrsa` and `openssl ecparam -genkey` write).
func (c *Cert) KeyPEM() ([]byte, error) {
	switch k := c.Key.(type) {
	case *rsa.PrivateKey:
		return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), nil
	case *ecdsa.PrivateKey:
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
	}
	return nil, fmt.Errorf("testcerts: key type %T", c.Key)
}

// TLS returns c as a crypto/tls certificate presenting chain after it.
func (c *Cert) TLS(chain ...*Cert) tls.Certificate {
	tc := tls.Certificate{Certificate: [][]byte{c.DER}, PrivateKey: c.Key}
	for _, x := range chain {
		tc.Certificate = append(tc.Certificate, x.DER)
	}
	return tc
}

// SPKIPin returns the SHA-256 of c's SubjectPublicKeyInfo (a public key
// pin, as in talaris.TLSOptions.Pins).
func (c *Cert) SPKIPin() []byte {
	s := sha256.Sum256(c.Cert.RawSubjectPublicKeyInfo)
	return s[:]
}

func writeFile(path string, b []byte) error { return os.WriteFile(path, b, 0o644) }

func writePair(dir, name string, c *Cert) error {
	if err := writeFile(filepath.Join(dir, name+".pem"), c.CertPEM()); err != nil {
		return err
	}
	k, err := c.KeyPEM()
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(dir, name+"-key.pem"), k)
}

// Generate writes ca.pem, server.pem, server-key.pem, expired.pem,
// expired-key.pem and other-ca.pem into dir.
func Generate(dir string) error {
	far := time.Now().AddDate(30, 0, 0)
	ca, err := Issue(Template{CN: "talaris test CA", CA: true, NotAfter: far}, nil)
	if err != nil {
		return err
	}
	other, err := Issue(Template{CN: "talaris unrelated CA", CA: true, NotAfter: far}, nil)
	if err != nil {
		return err
	}
	leaf := Template{CN: "localhost", DNS: []string{"localhost"},
		IPs: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		EKU: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, NotAfter: far}
	server, err := Issue(leaf, ca)
	if err != nil {
		return err
	}
	leaf.NotBefore = time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	leaf.NotAfter = time.Date(2002, 1, 1, 0, 0, 0, 0, time.UTC)
	expired, err := Issue(leaf, ca)
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "ca.pem"), ca.CertPEM()); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "other-ca.pem"), other.CertPEM()); err != nil {
		return err
	}
	if err := writePair(dir, "server", server); err != nil {
		return err
	}
	return writePair(dir, "expired", expired)
}
