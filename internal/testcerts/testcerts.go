// Package testcerts creates the test PKI in testdata/: a CA, a server
// certificate for localhost/127.0.0.1/::1 signed by it, an expired server
// certificate and an unrelated CA. Tests load the committed files; run
// `go run ./internal/testcerts/gen -out testdata` to make new ones.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

type pair struct {
	cert *x509.Certificate
	der  []byte
	key  *ecdsa.PrivateKey
}

func newKey() *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return k
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err)
	}
	return n
}

func makeCA(name string) pair {
	k := newKey()
	tpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"talaris tests"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(30, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &k.PublicKey, k)
	if err != nil {
		panic(err)
	}
	c, _ := x509.ParseCertificate(der)
	return pair{c, der, k}
}

func makeLeaf(ca pair, notBefore, notAfter time.Time) pair {
	k := newKey()
	tpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tpl, ca.cert, &k.PublicKey, ca.key)
	if err != nil {
		panic(err)
	}
	c, _ := x509.ParseCertificate(der)
	return pair{c, der, k}
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o644)
}

func writePair(dir, name string, p pair) error {
	if err := writePEM(filepath.Join(dir, name+".pem"), "CERTIFICATE", p.der); err != nil {
		return err
	}
	kd, err := x509.MarshalECPrivateKey(p.key)
	if err != nil {
		return err
	}
	return writePEM(filepath.Join(dir, name+"-key.pem"), "EC PRIVATE KEY", kd)
}

// Generate writes ca.pem, server.pem, server-key.pem, expired.pem,
// expired-key.pem and other-ca.pem into dir.
func Generate(dir string) error {
	ca := makeCA("talaris test CA")
	other := makeCA("talaris unrelated CA")
	leaf := makeLeaf(ca, time.Now().Add(-time.Hour), time.Now().AddDate(30, 0, 0))
	expired := makeLeaf(ca, time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2002, 1, 1, 0, 0, 0, 0, time.UTC))
	if err := writePEM(filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.der); err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, "other-ca.pem"), "CERTIFICATE", other.der); err != nil {
		return err
	}
	if err := writePair(dir, "server", leaf); err != nil {
		return err
	}
	return writePair(dir, "expired", expired)
}
