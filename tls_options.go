package talaris

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/cpu"
)

// TLS policy: TLSOptions checked at Dial and translated for the C core
// (csrc/transport/tls_verify.c). Pure Go, no cgo: the same checks on every platform.

// tlsSuite maps a crypto/tls suite ID to the name both TLS libraries use.
type tlsSuite struct {
	name string
	v13  bool
}

// tlsSuites are the suites TLSOptions.CipherSuites accepts: crypto/tls's
// secure suites (tls.CipherSuites()) with ECDHE key exchange.
var tlsSuites = map[uint16]tlsSuite{
	tls.TLS_AES_128_GCM_SHA256:                        {"TLS_AES_128_GCM_SHA256", true},
	tls.TLS_AES_256_GCM_SHA384:                        {"TLS_AES_256_GCM_SHA384", true},
	tls.TLS_CHACHA20_POLY1305_SHA256:                  {"TLS_CHACHA20_POLY1305_SHA256", true},
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256:       {"ECDHE-ECDSA-AES128-GCM-SHA256", false},
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256:         {"ECDHE-RSA-AES128-GCM-SHA256", false},
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384:       {"ECDHE-ECDSA-AES256-GCM-SHA384", false},
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384:         {"ECDHE-RSA-AES256-GCM-SHA384", false},
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256: {"ECDHE-ECDSA-CHACHA20-POLY1305", false},
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256:   {"ECDHE-RSA-CHACHA20-POLY1305", false},
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA:          {"ECDHE-ECDSA-AES128-SHA", false},
	tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA:            {"ECDHE-RSA-AES128-SHA", false},
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA:          {"ECDHE-ECDSA-AES256-SHA", false},
	tls.TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA:            {"ECDHE-RSA-AES256-SHA", false},
}

// hasAESHardware mirrors crypto/tls: AES-GCM is fast where the CPU has AES
// (and carry-less multiply) instructions.
var hasAESHardware = (cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ) || (cpu.ARM64.HasAES && cpu.ARM64.HasPMULL) ||
	cpu.S390X.HasAESGCM

// defaultCipherSuites returns the suites offered when TLSOptions.CipherSuites
// is nil: TLS 1.3 AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305, then TLS 1.2
// ECDHE with AES-GCM and ChaCha20-Poly1305, then ECDHE AES-CBC-SHA. Where
// the CPU has no AES instructions ChaCha20-Poly1305 comes first in each
// version.
func defaultCipherSuites() []uint16 {
	aes13 := []uint16{tls.TLS_AES_128_GCM_SHA256, tls.TLS_AES_256_GCM_SHA384}
	cha13 := []uint16{tls.TLS_CHACHA20_POLY1305_SHA256}
	aes12 := []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384}
	cha12 := []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256}
	cbc12 := []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA, tls.TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA}
	var out []uint16
	if hasAESHardware {
		out = append(append(append(out, aes13...), cha13...), aes12...)
		out = append(out, cha12...)
	} else {
		out = append(append(append(out, cha13...), aes13...), cha12...)
		out = append(out, aes12...)
	}
	return append(out, cbc12...)
}

// tlsPolicy is TLSOptions checked and translated for the C core.
type tlsPolicy struct {
	clientCert, clientKey  string // PEM: certificate chain (leaf first), PKCS#8 key
	minVersion, maxVersion uint16 // maxVersion 0: TLS 1.3
	ciphers12, ciphers13   string // colon-separated library names
	pins                   []byte // n x 32 bytes
	digest                 [32]byte
}

func tlsConfigErr(format string, args ...any) error {
	return fmt.Errorf("%w: TLSOptions.%s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// policy checks o and builds what the C core needs. Every bad value is an
// ErrInvalidConfig naming the field.
func (o *TLSOptions) policy() (*tlsPolicy, error) {
	pol := &tlsPolicy{minVersion: tls.VersionTLS12}
	switch o.MinVersion {
	case 0, tls.VersionTLS12:
	case tls.VersionTLS13:
		pol.minVersion = tls.VersionTLS13
	default:
		return nil, tlsConfigErr("MinVersion: 0x%04x is not tls.VersionTLS12 or tls.VersionTLS13", o.MinVersion)
	}

	suites := o.CipherSuites
	if suites == nil {
		suites = defaultCipherSuites()
	} else if len(suites) == 0 {
		return nil, tlsConfigErr("CipherSuites: empty list (nil means the default)")
	}
	var n12, n13 []string
	seen := map[uint16]bool{}
	for _, id := range suites {
		s, ok := tlsSuites[id]
		if !ok {
			return nil, tlsConfigErr("CipherSuites: unknown or unsupported suite 0x%04x (%s)", id, tls.CipherSuiteName(id))
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		if s.v13 {
			n13 = append(n13, s.name)
		} else {
			n12 = append(n12, s.name)
		}
	}
	// A version none of whose suites is listed is off.
	if len(n12) == 0 {
		pol.minVersion = tls.VersionTLS13
	}
	if len(n13) == 0 {
		if pol.minVersion == tls.VersionTLS13 {
			return nil, tlsConfigErr("CipherSuites: MinVersion is TLS 1.3 but no TLS 1.3 suite is listed")
		}
		pol.maxVersion = tls.VersionTLS12
	}
	pol.ciphers12 = strings.Join(n12, ":")
	pol.ciphers13 = strings.Join(n13, ":")

	for i, p := range o.Pins {
		if len(p) != sha256.Size {
			return nil, tlsConfigErr("Pins[%d]: %d bytes, want a 32-byte SHA-256 of the SubjectPublicKeyInfo", i, len(p))
		}
		pol.pins = append(pol.pins, p...)
	}

	if err := pol.loadClientCert(o); err != nil {
		return nil, err
	}
	// The roots file is read here, once per dial, so that a missing or
	// unreadable file is an error naming it and the OS's reason (the
	// digest below needs its bytes anyway); the loop loads it again.
	var caFile []byte
	if o.RootCAFile != "" {
		b, err := os.ReadFile(o.RootCAFile)
		if err != nil {
			return nil, tlsConfigErr("RootCAFile: %v", err)
		}
		if !bytes.Contains(b, []byte("-----BEGIN CERTIFICATE-----")) {
			return nil, tlsConfigErr("RootCAFile: %s holds no PEM certificate", o.RootCAFile)
		}
		caFile = b
	}

	// The digest keys the session cache: a session made under one set of
	// trust settings is never offered under another (a resumed handshake
	// skips certificate verification).
	h := sha256.New()
	field := func(b []byte) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field([]byte(o.RootCAFile))
	if o.RootCAFile != "" {
		field(caFile)
	}
	field(o.RootCAPEM)
	if o.InsecureSkipVerify {
		field([]byte{1})
	} else {
		field([]byte{0})
	}
	field([]byte(pol.clientCert))
	field([]byte{byte(pol.minVersion >> 8), byte(pol.minVersion), byte(pol.maxVersion >> 8), byte(pol.maxVersion)})
	field([]byte(pol.ciphers12 + "/" + pol.ciphers13))
	field(pol.pins)
	h.Sum(pol.digest[:0])
	return pol, nil
}

// sessionKey names the session cache entry for addr (the resolved
// ip:port the dial connects to), serverName (SNI) and these options.
func (pol *tlsPolicy) sessionKey(addr, serverName string) string {
	return addr + "|" + serverName + "|" + hex.EncodeToString(pol.digest[:])
}

// pemOf returns the PEM given inline, or read from file: one of the two
// (what names the option pair in errors).
func pemOf(what string, inline []byte, file string) ([]byte, error) {
	if file == "" {
		return inline, nil
	}
	if len(inline) > 0 {
		return nil, tlsConfigErr("%sFile and %sPEM are both set", what, what)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, tlsConfigErr("%sFile: %v", what, err)
	}
	return b, nil
}

func (pol *tlsPolicy) loadClientCert(o *TLSOptions) error {
	certPEM, err := pemOf("ClientCert", o.ClientCertPEM, o.ClientCertFile)
	if err != nil {
		return err
	}
	keyPEM, err := pemOf("ClientKey", o.ClientKeyPEM, o.ClientKeyFile)
	if err != nil {
		return err
	}
	switch {
	case len(certPEM) == 0 && len(keyPEM) == 0:
		return nil
	case len(keyPEM) == 0:
		return tlsConfigErr("ClientCertPEM/ClientCertFile: a client certificate needs ClientKeyPEM or ClientKeyFile")
	case len(certPEM) == 0:
		return tlsConfigErr("ClientKeyPEM/ClientKeyFile: a client key needs ClientCertPEM or ClientCertFile")
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tlsConfigErr("ClientCert/ClientKey: %v", err)
	}
	switch pair.PrivateKey.(type) {
	case *rsa.PrivateKey, *ecdsa.PrivateKey:
	default:
		return tlsConfigErr("ClientKey: %T is not an RSA or ECDSA key", pair.PrivateKey)
	}
	der, err := x509.MarshalPKCS8PrivateKey(pair.PrivateKey)
	if err != nil {
		return tlsConfigErr("ClientKey: %v", err)
	}
	var sb strings.Builder
	for _, c := range pair.Certificate {
		sb.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c}))
	}
	pol.clientCert = sb.String()
	pol.clientKey = string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	return nil
}
