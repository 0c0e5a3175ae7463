// Command reach is the consumer program of build.sh's check_reach: built in
// a scratch module outside the repository (a replace points at the clone),
// with plain `go build`, it proves that a user's build of the library links
// and runs. It starts a WebSocket echo server written with the standard
// library only (a hand-rolled upgrade and framing, enough for one message
// and the close handshake), dials it over ws:// and over wss:// (a
// certificate made here, trusted through TLSOptions.RootCAPEM), sends one
// text message on each, checks the echo, closes, and checks that
// talaris.TLSBackend() names the TLS library the build was meant to link.
//
//	reach -backend boringssl|openssl
//
// It lives under testdata/ so that the library module's go build, vet and
// test never see it (it is package main and imports only the library and
// the standard library).
package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/talaris-go/talaris"
)

func main() {
	backend := flag.String("backend", "", "the TLS library talaris.TLSBackend() must name: boringssl or openssl")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("reach: ")
	if got := talaris.TLSBackend(); got != *backend {
		log.Fatalf("TLSBackend() = %q, want %q", got, *backend)
	}
	cert, caPEM, err := selfSigned()
	if err != nil {
		log.Fatal(err)
	}
	plain, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer plain.Close()
	secure, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	secure = tls.NewListener(secure, &tls.Config{Certificates: []tls.Certificate{cert}})
	defer secure.Close()
	serverErr := make(chan error, 2)
	go func() { serverErr <- serveOne(plain) }()
	go func() { serverErr <- serveOne(secure) }()

	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	for _, url := range []string{"ws://" + plain.Addr().String() + "/echo", "wss://" + secure.Addr().String() + "/echo"} {
		if err := echoOnce(p, url, caPEM); err != nil {
			log.Fatalf("%s: %v", url, err)
		}
	}
	for range 2 {
		select {
		case err := <-serverErr:
			if err != nil {
				log.Fatalf("server: %v", err)
			}
		case <-time.After(10 * time.Second):
			log.Fatal("server: no close handshake in 10 s")
		}
	}
	if err := p.Close(); err != nil {
		log.Fatalf("Pool.Close: %v", err)
	}
	fmt.Printf("reach: %s: ws:// and wss:// echoed one message each and closed cleanly\n", talaris.TLSBackend())
}

// echoOnce dials url, sends one text message, waits for its echo, closes
// and pumps until the connection's final event, which must be a clean close.
func echoOnce(p *talaris.Pool, url string, caPEM []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.Dial(ctx, url, &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAPEM: caPEM}})
	if err != nil {
		return fmt.Errorf("Dial: %w", err)
	}
	msg := "hello over " + strings.SplitN(url, ":", 2)[0] + " from " + talaris.TLSBackend()
	if err := c.SendText([]byte(msg)); err != nil {
		return fmt.Errorf("SendText: %w", err)
	}
	echoed, closed := false, false
	var final error
	deadline := time.AfterFunc(10*time.Second, func() { c.Abort() })
	defer deadline.Stop()
	for !closed {
		if _, err := p.Pump(func(_ talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventText:
				if got := string(ev.Payload); got != msg {
					final = fmt.Errorf("echo %q, want %q", got, msg)
				}
				echoed = true
				if err := c.Close(talaris.CloseNormal, "done"); err != nil && final == nil {
					final = fmt.Errorf("Close: %w", err)
				}
			case talaris.EventClose:
				closed = true
				if ev.Code != talaris.CloseNormal && final == nil {
					final = fmt.Errorf("closed with code %d, want %d", ev.Code, talaris.CloseNormal)
				}
			case talaris.EventError:
				closed = true
				if final == nil {
					final = fmt.Errorf("connection failed: %w", ev.Err)
				}
			}
		}); err != nil {
			return fmt.Errorf("Pump: %w", err)
		}
	}
	if final == nil && !echoed {
		final = errors.New("closed before the echo")
	}
	return final
}

// serveOne accepts one connection on l, upgrades it (RFC 6455 section 4.2),
// echoes its first data frame and answers its close frame.
func serveOne(l net.Listener) error {
	nc, err := l.Accept()
	if err != nil {
		return err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(nc)
	req, err := http.ReadRequest(br)
	if err != nil {
		return fmt.Errorf("upgrade request: %w", err)
	}
	key := req.Header.Get("Sec-WebSocket-Key")
	if !strings.EqualFold(req.Header.Get("Upgrade"), "websocket") || key == "" {
		return fmt.Errorf("not a WebSocket upgrade: %v", req.Header)
	}
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	if _, err := fmt.Fprintf(nc, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
		base64.StdEncoding.EncodeToString(sum[:])); err != nil {
		return err
	}
	for {
		op, payload, err := readFrame(br)
		if err != nil {
			return err
		}
		if err := writeFrame(nc, op, payload); err != nil { // the echo; a close frame answers the close
			return err
		}
		if op == 8 {
			return nil
		}
	}
}

// readFrame reads one unfragmented client frame (masked, as clients send).
func readFrame(r io.Reader) (op byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	if h[0]&0x80 == 0 || h[1]&0x80 == 0 {
		return 0, nil, fmt.Errorf("frame header %x: fragmented or unmasked", h)
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	if n > 1<<20 {
		return 0, nil, fmt.Errorf("frame of %d bytes", n)
	}
	var mask [4]byte
	if _, err := io.ReadFull(r, mask[:]); err != nil {
		return 0, nil, err
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	for i := range payload {
		payload[i] ^= mask[i%4]
	}
	return h[0] & 0x0f, payload, nil
}

// writeFrame writes one unmasked final frame, as servers send.
func writeFrame(w io.Writer, op byte, payload []byte) error {
	b := []byte{0x80 | op}
	switch n := len(payload); {
	case n < 126:
		b = append(b, byte(n))
	case n < 1<<16:
		b = binary.BigEndian.AppendUint16(append(b, 126), uint16(n))
	default:
		b = binary.BigEndian.AppendUint64(append(b, 127), uint64(n))
	}
	_, err := w.Write(append(b, payload...))
	return err
}

// selfSigned makes a P-256 certificate for 127.0.0.1, valid for an hour,
// and returns it with its PEM (the one root the client trusts).
func selfSigned() (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "talaris reach"},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, caPEM, nil
}
