//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testcerts"
	"github.com/talaris-go/talaris/internal/wstest"
)

// Dials through proxies (DialOptions.Proxy): a real HTTP CONNECT proxy and
// a real SOCKS5 server on loopback, relaying bytes to the test servers.

// testProxy is an HTTP CONNECT proxy (kind "http") or a SOCKS5 server
// ("socks5"), with optional credentials and misbehaviours.
type testProxy struct {
	kind       string
	user, pass string            // required credentials ("": none)
	mode       string            // "": relay; "hang", "closemid", "huge": misbehave after the request
	names      map[string]string // host -> address the proxy dials instead
	ln         net.Listener
	tunnels    atomic.Int32 // tunnels that relayed
	lastTarget atomic.Value // the target the client asked for (string)
	wg         sync.WaitGroup
	mu         sync.Mutex
	conns      []net.Conn
}

func startProxy(t *testing.T, p *testProxy) *testProxy {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, nc)
			p.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer nc.Close()
				if p.kind == "http" {
					p.serveHTTP(nc)
				} else {
					p.serveSOCKS(nc)
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// URL is the proxy's URL with userinfo (user, pass) when user is not "".
func (p *testProxy) URL(scheme, user, pass string) *url.URL {
	u := &url.URL{Scheme: scheme, Host: p.ln.Addr().String()}
	if user != "" {
		u.User = url.UserPassword(user, pass)
	}
	return u
}

func (p *testProxy) dialUpstream(target string) (net.Conn, error) {
	p.lastTarget.Store(target)
	host, port, _ := net.SplitHostPort(target)
	if a, ok := p.names[host]; ok {
		host = a
	}
	return net.DialTimeout("tcp", net.JoinHostPort(host, port), 5*time.Second)
}

// misbehave acts out p.mode after the client's request; true when it did.
func (p *testProxy) misbehave(nc net.Conn, partial []byte) bool {
	switch p.mode {
	case "hang":
		io.Copy(io.Discard, nc) // until the client gives up
		return true
	case "closemid":
		nc.Write(partial)
		time.Sleep(20 * time.Millisecond)
		return true
	case "huge":
		// A reply head that never ends: 64 KiB of headers.
		nc.Write([]byte("HTTP/1.1 200 Connection established\r\n"))
		line := []byte("X-Filler: " + strings.Repeat("a", 100) + "\r\n")
		for range 600 {
			if _, err := nc.Write(line); err != nil {
				break
			}
		}
		return true
	}
	return false
}

func relay(a, b net.Conn, ra io.Reader) {
	done := make(chan struct{}, 2)
	go func() { io.Copy(b, ra); b.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { io.Copy(a, b); a.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
}

func (p *testProxy) serveHTTP(nc net.Conn) {
	br := bufio.NewReader(nc)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		nc.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		return
	}
	if p.user != "" {
		want := "Basic " + base64.StdEncoding.EncodeToString([]byte(p.user+":"+p.pass))
		if req.Header.Get("Proxy-Authorization") != want {
			nc.Write([]byte("HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"t\"\r\nContent-Length: 0\r\n\r\n"))
			return
		}
	}
	if req.Host != req.RequestURI {
		nc.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
		return
	}
	if p.misbehave(nc, []byte("HTTP/1.1 200 Conn")) {
		return
	}
	up, err := p.dialUpstream(req.RequestURI)
	if err != nil {
		nc.Write([]byte("HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n"))
		return
	}
	defer up.Close()
	// HTTP/1.0 status line, split across two writes: both must be taken.
	nc.Write([]byte("HTTP/1.0 200 Connection"))
	time.Sleep(5 * time.Millisecond)
	nc.Write([]byte(" established\r\nVia: test\r\n\r\n"))
	p.tunnels.Add(1)
	relay(nc, up, br)
}

func (p *testProxy) serveSOCKS(nc net.Conn) {
	br := bufio.NewReader(nc)
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(br, hdr); err != nil || hdr[0] != 5 {
		return
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(br, methods); err != nil {
		return
	}
	want := byte(0)
	if p.user != "" {
		want = 2
	}
	if !strings.ContainsRune(string(methods), rune(want)) {
		nc.Write([]byte{5, 0xFF})
		return
	}
	nc.Write([]byte{5, want})
	if want == 2 {
		b := make([]byte, 2)
		if _, err := io.ReadFull(br, b); err != nil || b[0] != 1 {
			return
		}
		user := make([]byte, b[1])
		io.ReadFull(br, user)
		pl, _ := br.ReadByte()
		pass := make([]byte, pl)
		io.ReadFull(br, pass)
		if string(user) != p.user || string(pass) != p.pass {
			nc.Write([]byte{1, 1})
			return
		}
		nc.Write([]byte{1, 0})
	}
	req := make([]byte, 4)
	if _, err := io.ReadFull(br, req); err != nil || req[0] != 5 || req[1] != 1 {
		return
	}
	var host string
	switch req[3] {
	case 1, 4:
		a := make([]byte, 4)
		if req[3] == 4 {
			a = make([]byte, 16)
		}
		io.ReadFull(br, a)
		host = net.IP(a).String()
	case 3:
		n, _ := br.ReadByte()
		a := make([]byte, n)
		io.ReadFull(br, a)
		host = string(a)
	}
	pb := make([]byte, 2)
	io.ReadFull(br, pb)
	target := net.JoinHostPort(host, strconv.Itoa(int(binary.BigEndian.Uint16(pb))))
	if p.misbehave(nc, []byte{5, 0, 0}) {
		return
	}
	up, err := p.dialUpstream(target)
	if err != nil {
		nc.Write([]byte{5, 5, 0, 1, 0, 0, 0, 0, 0, 0})
		return
	}
	defer up.Close()
	// A domain-name bound address, in two writes.
	nc.Write([]byte{5, 0, 0, 3, 9})
	time.Sleep(5 * time.Millisecond)
	nc.Write([]byte("localhost\x00\x00"))
	p.tunnels.Add(1)
	relay(nc, up, br)
}

// proxyEcho dials url through proxy u on a fresh pool, echoes one message
// and closes.
func proxyEcho(t *testing.T, url string, opts talaris.DialOptions, u *url.URL) {
	t.Helper()
	opts.Proxy = http.ProxyURL(u)
	p, c := dialOpts(t, smallPool(), url, &opts)
	echoOnce(t, p, c)
}

func echoOnce(t *testing.T, p *talaris.Pool, c talaris.Conn) {
	t.Helper()
	if err := c.SendText([]byte("through the proxy")); err != nil {
		t.Fatal(err)
	}
	got := ""
	pumpUntil(t, p, func(_ talaris.Conn, ev talaris.Event) {
		if ev.Kind == talaris.EventText {
			got = string(ev.Payload)
		}
	}, func() bool { return got != "" }, nil)
	if got != "through the proxy" {
		t.Fatalf("echo %q", got)
	}
	c.Close(1000, "")
}

// venueURL is srv's URL with the host "localhost" (the test certificate's
// name): the proxy resolves it, or the client for socks5.
func venueURL(srv *wstest.Server, path string) string {
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(srv.URL, "wss://"), "ws://"))
	scheme := "ws"
	if strings.HasPrefix(srv.URL, "wss") {
		scheme = "wss"
	}
	return scheme + "://localhost:" + port + path
}

func TestProxyEcho(t *testing.T) {
	for _, kind := range []struct{ name, scheme string }{{"http", "http"}, {"socks5", "socks5"}, {"socks5h", "socks5h"}} {
		for _, auth := range []bool{false, true} {
			for _, sc := range schemes() {
				if tlsOnly && sc.name == "ws" {
					continue
				}
				name := kind.name + "/" + sc.name
				if auth {
					name += "/auth"
				}
				t.Run(name, func(t *testing.T) {
					srv := wstest.NewGorilla()
					if sc.name == "wss" {
						srv.StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
					} else {
						srv.Start(t)
					}
					pk := "http"
					if kind.scheme != "http" {
						pk = "socks5"
					}
					px := &testProxy{kind: pk}
					user := ""
					if auth {
						px.user, px.pass, user = "alice", "s3cret:x", "alice"
					}
					startProxy(t, px)
					proxyEcho(t, venueURL(srv, "/echo"), sc.opts, px.URL(kind.scheme, user, px.pass))
					if px.tunnels.Load() != 1 {
						t.Fatalf("%d tunnels, want 1", px.tunnels.Load())
					}
					target, _ := px.lastTarget.Load().(string)
					if wantName := kind.scheme != "socks5"; wantName != strings.HasPrefix(target, "localhost:") {
						t.Fatalf("the proxy was asked for %q", target)
					}
				})
			}
		}
	}
}

// TestProxyFromEnvironment runs in a child process: http.ProxyFromEnvironment
// reads the environment once per process.
func TestProxyFromEnvironment(t *testing.T) {
	if os.Getenv("TALARIS_PROXY_ENV_CHILD") == "" {
		px := startProxy(t, &testProxy{kind: "http", names: map[string]string{"venue.test": "127.0.0.1"}})
		t.Setenv("HTTPS_PROXY", px.URL("http", "", "").String())
		t.Setenv("NO_PROXY", "")
		t.Setenv("TALARIS_PROXY_ENV_CHILD", "1")
		cmd := exec.Command(os.Args[0], "-test.run=^TestProxyFromEnvironment$", "-test.v", "-test.count=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestProxyFromEnvironment") {
			t.Fatalf("child: %v\n%s", err, out)
		}
		if px.tunnels.Load() != 1 {
			t.Fatalf("%d tunnels, want 1", px.tunnels.Load())
		}
		return
	}
	ca, err := testcerts.Issue(testcerts.Template{CN: "proxy test CA", CA: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := testcerts.Issue(testcerts.Template{CN: "venue.test", DNS: []string{"venue.test"}}, ca)
	if err != nil {
		t.Fatal(err)
	}
	srv := wstest.NewGorilla().StartTLS(t, &tls.Config{Certificates: []tls.Certificate{leaf.TLS()}})
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "wss://"))
	opts := talaris.DialOptions{Proxy: http.ProxyFromEnvironment, TLS: talaris.TLSOptions{RootCAPEM: ca.CertPEM()}}
	p, c := dialOpts(t, smallPool(), "wss://venue.test:"+port+"/echo", &opts)
	echoOnce(t, p, c)
}

// proxyDialErr dials url through u and returns the *ProxyError.
func proxyDialErr(t *testing.T, url string, u *url.URL, opts talaris.DialOptions) *talaris.ProxyError {
	t.Helper()
	opts.Proxy = http.ProxyURL(u)
	p := newTestPool(t, smallPool(), hangGuard)
	ctx, cancel := dialCtx(t)
	defer cancel()
	_, err := p.Dial(ctx, url, &opts)
	var pe *talaris.ProxyError
	if !errors.Is(err, talaris.ErrProxy) || !errors.As(err, &pe) {
		t.Fatalf("Dial: %v, want a ProxyError", err)
	}
	if strings.Contains(pe.Proxy, "s3cret") || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("the password shows: %v", err)
	}
	return pe
}

func TestProxyFailures(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	venue := venueURL(srv, "/echo")
	t.Run("http/407", func(t *testing.T) {
		px := startProxy(t, &testProxy{kind: "http", user: "alice", pass: "right"})
		pe := proxyDialErr(t, venue, px.URL("http", "alice", "s3cret"), talaris.DialOptions{})
		if pe.Status != 407 {
			t.Fatalf("%+v", pe)
		}
	})
	t.Run("socks5/auth", func(t *testing.T) {
		px := startProxy(t, &testProxy{kind: "socks5", user: "alice", pass: "right"})
		pe := proxyDialErr(t, venue, px.URL("socks5", "alice", "s3cret"), talaris.DialOptions{})
		if pe.Reply != 1 {
			t.Fatalf("%+v", pe)
		}
	})
	t.Run("socks5/no-method", func(t *testing.T) {
		px := startProxy(t, &testProxy{kind: "socks5", user: "alice", pass: "right"})
		pe := proxyDialErr(t, venue, px.URL("socks5", "", ""), talaris.DialOptions{})
		if pe.Reply != 255 {
			t.Fatalf("%+v", pe)
		}
	})
	for _, k := range []string{"http", "socks5h"} {
		kind := strings.TrimSuffix(k, "h")
		t.Run(k+"/unreachable", func(t *testing.T) {
			px := startProxy(t, &testProxy{kind: kind})
			pe := proxyDialErr(t, "ws://"+refusedAddr(t)+"/", px.URL(k, "", ""), talaris.DialOptions{})
			if (k == "http" && pe.Status != 502) || (k != "http" && pe.Reply != 5) {
				t.Fatalf("%+v", pe)
			}
		})
		t.Run(k+"/hang", func(t *testing.T) {
			px := startProxy(t, &testProxy{kind: kind, mode: "hang"})
			start := time.Now()
			pe := proxyDialErr(t, venue, px.URL(k, "", ""), talaris.DialOptions{HandshakeTimeout: 300 * time.Millisecond})
			if !errors.Is(pe, talaris.ErrTimeout) || time.Since(start) > 10*time.Second {
				t.Fatalf("%v after %v", pe, time.Since(start))
			}
		})
		t.Run(k+"/closemid", func(t *testing.T) {
			px := startProxy(t, &testProxy{kind: kind, mode: "closemid"})
			pe := proxyDialErr(t, venue, px.URL(k, "", ""), talaris.DialOptions{})
			if !errors.Is(pe, talaris.ErrConnectionLost) {
				t.Fatalf("%v", pe)
			}
		})
	}
	t.Run("http/huge", func(t *testing.T) {
		px := startProxy(t, &testProxy{kind: "http", mode: "huge"})
		pe := proxyDialErr(t, venue, px.URL("http", "", ""), talaris.DialOptions{})
		if !strings.Contains(pe.Detail, "8 KiB") {
			t.Fatalf("%v", pe)
		}
	})
	t.Run("https", func(t *testing.T) {
		pe := proxyDialErr(t, venue, &url.URL{Scheme: "https", Host: "127.0.0.1:1"}, talaris.DialOptions{})
		if !strings.Contains(pe.Detail, "https proxies are not supported") {
			t.Fatalf("%v", pe)
		}
	})
	t.Run("proxy-refused", func(t *testing.T) {
		pe := proxyDialErr(t, venue, &url.URL{Scheme: "http", Host: refusedAddr(t)}, talaris.DialOptions{})
		if !errors.Is(pe, talaris.ErrDial) {
			t.Fatalf("%v", pe)
		}
	})
}

// TestProxyReconnect: each attempt of a reconnecting handle goes through
// the proxy again.
func TestProxyReconnect(t *testing.T) {
	for _, k := range []string{"http", "socks5"} {
		t.Run(k, func(t *testing.T) {
			srv := wstest.NewGorilla().Start(t)
			px := startProxy(t, &testProxy{kind: k})
			opts := talaris.DialOptions{Proxy: http.ProxyURL(px.URL(k, "", "")),
				Reconnect: &talaris.ReconnectPolicy{MinDelay: 10 * time.Millisecond, MaxDelay: 20 * time.Millisecond}}
			p, c := dialOpts(t, smallPool(), venueURL(srv, "/drop?n=1&size=16"), &opts)
			opens := 0
			pumpUntil(t, p, func(_ talaris.Conn, ev talaris.Event) {
				if ev.Kind == talaris.EventOpen {
					opens++
				}
			}, func() bool { return opens >= 2 }, nil)
			c.Abort()
			if n := px.tunnels.Load(); n < 2 {
				t.Fatalf("%d tunnels, want at least 2 (the dial and its reconnect)", n)
			}
		})
	}
}
