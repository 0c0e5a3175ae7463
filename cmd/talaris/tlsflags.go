//go:build linux

package main

import (
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"flag"
	"fmt"
	"strings"

	"github.com/talaris-go/talaris"
)

// tlsFlags are cat's client certificate, version and pinning flags.
type tlsFlags struct {
	cert, key, min *string
	pins           multiFlag
}

func addTLSFlags(fs *flag.FlagSet) *tlsFlags {
	f := &tlsFlags{
		cert: fs.String("cert", "", "PEM file of the client certificate (mutual TLS), optionally followed by its chain"),
		key:  fs.String("key", "", "PEM file of the client certificate's RSA or ECDSA private key"),
		min:  fs.String("tls-min", "1.2", "minimum TLS version: 1.2 or 1.3"),
	}
	fs.Var(&f.pins, "pin", "SHA-256 of the server's SubjectPublicKeyInfo, as 64 hex digits or base64 (an optional\n"+
		"'sha256/' prefix is allowed), e.g. from: openssl x509 -in cert.pem -pubkey -noout |\n"+
		"openssl pkey -pubin -outform DER | openssl dgst -sha256 -binary | base64\n"+
		"(repeatable: any match passes; checked even with --insecure)")
	return f
}

// apply fills o from the flags.
func (f *tlsFlags) apply(o *talaris.TLSOptions) error {
	o.ClientCertFile, o.ClientKeyFile = *f.cert, *f.key
	switch *f.min {
	case "1.2", "":
		o.MinVersion = tls.VersionTLS12
	case "1.3":
		o.MinVersion = tls.VersionTLS13
	default:
		return fmt.Errorf("--tls-min %q: want 1.2 or 1.3", *f.min)
	}
	for _, p := range f.pins {
		b, err := parsePin(p)
		if err != nil {
			return err
		}
		o.Pins = append(o.Pins, b)
	}
	return nil
}

// parsePin reads a SHA-256 pin written as hex or base64 (standard or URL
// alphabet, padded or not), with an optional "sha256/" prefix.
func parsePin(s string) ([]byte, error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "sha256/")
	if len(s) == 64 {
		if b, err := hex.DecodeString(s); err == nil {
			return b, nil
		}
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil && len(b) == 32 {
			return b, nil
		}
	}
	return nil, fmt.Errorf("--pin %q: not a SHA-256 digest in hex (64 digits) or base64 (32 bytes)", s)
}
