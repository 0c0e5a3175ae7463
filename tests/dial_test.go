//go:build linux && cgo

package talaris_test

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
)

// Dial errors and addressing: HandshakeError with the
// server's status, headers, body and Retry-After; errno wrapping; every
// address of a name tried; LocalAddr.

// refusing429 starts a raw server that answers every upgrade with 429,
// the header lines first (each without its CRLF), retryAfter and a body in
// one write.
func refusing429(t *testing.T, retryAfter, body string, first ...string) *wstest.RawServer {
	s := wstest.NewRaw(nil)
	s.Response = "HTTP/1.1 429 Too Many Requests\r\n"
	for _, h := range first {
		s.Response += h + "\r\n"
	}
	s.Response += "Retry-After: " + retryAfter +
		"\r\nContent-Type: text/plain\r\nX-Venue: test\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
	s.Extra = []byte(body)
	return s.Start(t)
}

// checkHandshake429 checks err is the 429 HandshakeError of refusing429.
func checkHandshake429(t *testing.T, err error, body string, minRetry, maxRetry time.Duration) {
	t.Helper()
	var he *talaris.HandshakeError
	if !errors.As(err, &he) {
		t.Fatalf("error %v (%T) is not a *HandshakeError", err, err)
	}
	if !errors.Is(err, talaris.ErrHandshake) || !errors.Is(err, talaris.ErrBadStatus) {
		t.Errorf("%v: want errors.Is ErrHandshake and ErrBadStatus", err)
	}
	var ce *talaris.ConnError
	if !errors.As(err, &ce) || ce.Code != 429 {
		t.Errorf("ConnError under it: %+v", ce)
	}
	if he.StatusCode != 429 {
		t.Errorf("StatusCode %d, want 429", he.StatusCode)
	}
	if he.Header.Get("X-Venue") != "test" || he.Header.Get("Content-Type") != "text/plain" {
		t.Errorf("Header %v lacks the server's headers", he.Header)
	}
	if string(he.Body) != body {
		t.Errorf("Body %q, want %q", he.Body, body)
	}
	if he.RetryAfter < minRetry || he.RetryAfter > maxRetry {
		t.Errorf("RetryAfter %v, want within [%v, %v]", he.RetryAfter, minRetry, maxRetry)
	}
}

// TestHandshakeError: a 429 with Retry-After and a body, through Dial's
// error and through DialAsync's EventError; Retry-After as seconds and as
// an HTTP-date; a body longer than the bound is cut.
func TestHandshakeError(t *testing.T) {
	p := newTestPool(t, talaris.Config{}, hangGuard)
	body := "slow down, you are over the limit\n"
	t.Run("seconds", func(t *testing.T) {
		srv := refusing429(t, "1", body)
		ctx, cancel := dialCtx(t)
		defer cancel()
		_, err := p.Dial(ctx, srv.URL, nil)
		checkHandshake429(t, err, body, time.Second, time.Second)
	})
	t.Run("http-date", func(t *testing.T) {
		srv := refusing429(t, time.Now().Add(5*time.Second).UTC().Format(http.TimeFormat), body)
		ctx, cancel := dialCtx(t)
		defer cancel()
		_, err := p.Dial(ctx, srv.URL, nil)
		// whole seconds in the header, and the test may be slow
		checkHandshake429(t, err, body, time.Second, 5*time.Second)
	})
	t.Run("plain-to-tls-server", func(t *testing.T) {
		// ws:// to an https server: Go's server answers the plain
		// request with an HTTP/1.0 400 and a body saying why; the
		// HandshakeError carries both.
		srv := httptest.NewTLSServer(http.NotFoundHandler())
		defer srv.Close()
		ctx, cancel := dialCtx(t)
		defer cancel()
		_, err := p.Dial(ctx, "ws://"+srv.Listener.Addr().String()+"/", nil)
		var he *talaris.HandshakeError
		if !errors.As(err, &he) {
			t.Fatalf("error %v (%T) is not a *HandshakeError", err, err)
		}
		if he.StatusCode != 400 || !strings.Contains(string(he.Body), "HTTP request to an HTTPS server") {
			t.Errorf("StatusCode %d Body %q, want 400 and Go's plain-to-TLS text", he.StatusCode, he.Body)
		}
	})
	t.Run("absent-and-async", func(t *testing.T) {
		srv := refusing429(t, "soon", body) // malformed: 0
		c, err := p.DialAsync(srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		ev := pumpOne(t, p, c, nil)
		if ev.Kind != talaris.EventError {
			t.Fatalf("final event %v, want error", ev.Kind)
		}
		checkHandshake429(t, ev.Err, body, 0, 0)
	})
	t.Run("long-head", func(t *testing.T) {
		// A head over 5 KiB (a long Content-Security-Policy) reaches the
		// HandshakeError whole: Retry-After, the headers after it, the
		// body, as the reconnect policy reads them. Found by a hostile
		// review: Go got the first 5 KiB only (RetryAfter 0, one header,
		// no body).
		srv := refusing429(t, "7", body, "Content-Security-Policy: "+strings.Repeat("a", 6000))
		ctx, cancel := dialCtx(t)
		defer cancel()
		_, err := p.Dial(ctx, srv.URL, nil)
		checkHandshake429(t, err, body, 7*time.Second, 7*time.Second)
	})
	t.Run("long-body", func(t *testing.T) {
		long := strings.Repeat("x", 3000)
		srv := refusing429(t, "2", long)
		ctx, cancel := dialCtx(t)
		defer cancel()
		_, err := p.Dial(ctx, srv.URL, nil)
		var he *talaris.HandshakeError
		if !errors.As(err, &he) {
			t.Fatalf("%v is not a HandshakeError", err)
		}
		if len(he.Body) == 0 || len(he.Body) > 1024 || !strings.HasPrefix(long, string(he.Body)) {
			t.Errorf("Body of %d bytes, want a prefix of at most 1024", len(he.Body))
		}
		if he.RetryAfter != 2*time.Second {
			t.Errorf("RetryAfter %v", he.RetryAfter)
		}
	})
	t.Run("wss", func(t *testing.T) {
		// The same refusal over TLS (run with -tags talaris_openssl for the
		// other backend).
		ln, err := tls.Listen("tcp4", "127.0.0.1:0", serverTLS(t, testCertFile, testKeyFile, 0, 0))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		answerRequests(ln, func(nc net.Conn) {
			io.WriteString(nc, "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nX-Venue: test\r\n"+
				"Content-Type: text/plain\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
		})
		url := "wss://" + ln.Addr().String() + "/"
		ctx, cancel := dialCtx(t)
		defer cancel()
		_, err = p.Dial(ctx, url, tlsOpts)
		var he *talaris.HandshakeError
		if !errors.As(err, &he) || !errors.Is(err, talaris.ErrBadStatus) {
			t.Fatalf("wss 503: %v, want a HandshakeError matching ErrBadStatus", err)
		}
		if he.StatusCode != 503 || he.RetryAfter != 7*time.Second || string(he.Body) != body || he.Header.Get("X-Venue") != "test" {
			t.Errorf("wss 503: status %d retry %v body %q header %v", he.StatusCode, he.RetryAfter, he.Body, he.Header)
		}
		c, err := p.DialAsync(url, tlsOpts)
		if err != nil {
			t.Fatal(err)
		}
		ev := pumpOne(t, p, c, nil)
		if !errors.As(ev.Err, &he) || he.StatusCode != 503 || he.RetryAfter != 7*time.Second {
			t.Errorf("wss 503 through the pump: %v", ev.Err)
		}
	})
	t.Run("bad-accept", func(t *testing.T) {
		srv := wstest.NewRaw(nil)
		srv.Response = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: AAAAAAAAAAAAAAAAAAAAAAAAAAA=\r\n\r\n"
		srv.Start(t)
		ctx, cancel := dialCtx(t)
		defer cancel()
		_, err := p.Dial(ctx, srv.URL, nil)
		var he *talaris.HandshakeError
		if !errors.As(err, &he) || !errors.Is(err, talaris.ErrBadAccept) || !errors.Is(err, talaris.ErrHandshake) {
			t.Fatalf("%v: want a HandshakeError matching ErrBadAccept", err)
		}
		if he.StatusCode != 101 || he.Header.Get("Upgrade") != "websocket" {
			t.Errorf("StatusCode %d Header %v", he.StatusCode, he.Header)
		}
	})
}

// TestDialErrno: connect failures wrap the errno, from Dial and from
// DialAsync's event.
func TestDialErrno(t *testing.T) {
	p := newTestPool(t, talaris.Config{}, hangGuard)
	ctx, cancel := dialCtx(t)
	defer cancel()
	_, err := p.Dial(ctx, "ws://"+refusedAddr(t), nil)
	if !errors.Is(err, syscall.ECONNREFUSED) || !errors.Is(err, talaris.ErrDial) {
		t.Fatalf("refused: %v; want ErrDial and ECONNREFUSED", err)
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) || errno != syscall.ECONNREFUSED {
		t.Errorf("errors.As errno: %v", errno)
	}
}

// dualResolver answers every A query with 127.0.0.1 and every AAAA query
// with ::1: a name with both families, served by a DNS server on
// loopback (no change to /etc/hosts).
func dualResolver(t *testing.T) *net.Resolver {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := buf[:n]
			if len(q) < 12 || binary.BigEndian.Uint16(q[4:]) != 1 {
				continue
			}
			// the question: labels, then type and class
			i := 12
			for i < len(q) && q[i] != 0 {
				i += int(q[i]) + 1
			}
			if i+5 > len(q) {
				continue
			}
			qtype := binary.BigEndian.Uint16(q[i+1:])
			end := i + 5
			resp := append([]byte{}, q[:end]...)
			binary.BigEndian.PutUint16(resp[2:], 0x8180) // response, recursion available, no error
			binary.BigEndian.PutUint16(resp[8:], 0)      // no authority
			binary.BigEndian.PutUint16(resp[10:], 0)     // no additional (drops the client's OPT)
			var rdata []byte
			switch qtype {
			case 1:
				rdata = net.IPv4(127, 0, 0, 1).To4()
			case 28:
				rdata = net.IPv6loopback
			}
			if rdata != nil {
				binary.BigEndian.PutUint16(resp[6:], 1)
				resp = append(resp, 0xc0, 12) // the name: a pointer to the question's
				resp = binary.BigEndian.AppendUint16(resp, qtype)
				resp = binary.BigEndian.AppendUint16(resp, 1) // IN
				resp = binary.BigEndian.AppendUint32(resp, 60)
				resp = binary.BigEndian.AppendUint16(resp, uint16(len(rdata)))
				resp = append(resp, rdata...)
			} else {
				binary.BigEndian.PutUint16(resp[6:], 0)
			}
			pc.WriteTo(resp, from)
		}
	}()
	addr := pc.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp4", addr)
	}}
}

// TestDialEveryAddress: a name resolving to 127.0.0.1 and ::1, served
// only on [::1]:port (127.0.0.1:port refuses): the dial tries IPv4, is
// refused, then connects over IPv6.
func TestDialEveryAddress(t *testing.T) {
	ln6, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	port := ln6.Addr().(*net.TCPAddr).Port
	// Keep 127.0.0.1:port refusing: bound, not listening.
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Skipf("127.0.0.1:%d is taken: %v", port, err)
	}
	remote := make(chan string, 4)
	up := websocket.Upgrader{}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		remote <- r.RemoteAddr
		c.WriteMessage(websocket.TextMessage, []byte("over v6"))
		c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(1000, "bye"), time.Now().Add(time.Second))
		c.ReadMessage()
		c.Close()
	})}
	go hs.Serve(ln6)
	defer hs.Close()
	p := newTestPool(t, talaris.Config{}, hangGuard)
	url := "ws://dual.talaris.test:" + strconv.Itoa(port) + "/"
	opts := &talaris.DialOptions{Resolver: dualResolver(t)}
	ctx, cancel := dialCtx(t)
	defer cancel()
	c, err := p.Dial(ctx, url, opts)
	if err != nil {
		t.Fatalf("Dial %s: %v", url, err)
	}
	var got string
	ev := pumpOne(t, p, c, func(ev talaris.Event) {
		if ev.Kind == talaris.EventText {
			got = string(ev.Payload)
		}
	})
	if got != "over v6" || ev.Kind != talaris.EventClose {
		t.Errorf("got %q, final %v", got, ev.Kind)
	}
	if r := <-remote; !strings.HasPrefix(r, "[::1]:") {
		t.Errorf("server saw %s, want [::1]", r)
	}
	// With an IPv4 LocalAddr only 127.0.0.1 is tried: refused.
	_, err = p.Dial(ctx, url, &talaris.DialOptions{Resolver: opts.Resolver, LocalAddr: "127.0.0.1"})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("IPv4-only dial: %v, want ECONNREFUSED", err)
	}
	// A name that does not resolve.
	_, err = p.Dial(ctx, "ws://nowhere.invalid/", nil)
	if !errors.Is(err, talaris.ErrResolve) {
		t.Errorf("unresolvable name: %v, want ErrResolve", err)
	}
}

// TestLocalAddr: DialOptions.LocalAddr binds the source address (and
// port), as the server sees it; bad values are refused.
func TestLocalAddr(t *testing.T) {
	remote := make(chan net.Addr, 4)
	srv := wstest.NewRaw(func(c *wstest.RawConn) {
		remote <- c.Conn.RemoteAddr()
		c.WriteClose(1000, "")
		c.ExpectClose()
	}).Start(t)
	p := newTestPool(t, talaris.Config{}, hangGuard)
	// A free port on 127.0.0.2.
	l, err := net.Listen("tcp4", "127.0.0.2:0")
	if err != nil {
		t.Skipf("127.0.0.2 unusable: %v", err)
	}
	freePort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	for _, tc := range []struct {
		local, wantIP string
		wantPort      int
	}{
		{"127.0.0.2", "127.0.0.2", 0},
		{"127.0.0.2:" + strconv.Itoa(freePort), "127.0.0.2", freePort},
	} {
		ctx, cancel := dialCtx(t)
		c, err := p.Dial(ctx, srv.URL, &talaris.DialOptions{LocalAddr: tc.local})
		cancel()
		if err != nil {
			t.Fatalf("LocalAddr %s: %v", tc.local, err)
		}
		ra := (<-remote).(*net.TCPAddr)
		if ra.IP.String() != tc.wantIP || (tc.wantPort != 0 && ra.Port != tc.wantPort) {
			t.Errorf("LocalAddr %s: server saw %v", tc.local, ra)
		}
		pumpOne(t, p, c, nil)
	}
	ctx, cancel := dialCtx(t)
	defer cancel()
	for _, bad := range []string{"nonsense", "127.0.0.2:99999", "fe80::1%eth0"} {
		if _, err := p.Dial(ctx, srv.URL, &talaris.DialOptions{LocalAddr: bad}); !errors.Is(err, talaris.ErrBadURL) {
			t.Errorf("LocalAddr %q: %v, want ErrBadURL", bad, err)
		}
	}
	// IPv6 source, IPv4 server: no address to try.
	if _, err := p.Dial(ctx, srv.URL, &talaris.DialOptions{LocalAddr: "::1"}); !errors.Is(err, talaris.ErrResolve) {
		t.Errorf("LocalAddr ::1 to an IPv4 server: %v, want ErrResolve", err)
	}
	// An address this host does not have: bind fails, errno wrapped.
	_, err = p.Dial(ctx, srv.URL, &talaris.DialOptions{LocalAddr: "192.0.2.77"})
	if !errors.Is(err, talaris.ErrDial) || !errors.Is(err, syscall.EADDRNOTAVAIL) {
		t.Errorf("LocalAddr not on this host: %v, want ErrDial wrapping EADDRNOTAVAIL", err)
	}
}

// TestManyResponseHeaders: a 101 with 70 header lines (a CDN's, 2 KB in
// all) opens; the limit is 256 lines within the 16 KiB head. Found by a
// hostile review: more than 64 lines were refused as "too large".
func TestManyResponseHeaders(t *testing.T) {
	srv := wstest.NewRaw(func(rc *wstest.RawConn) {
		rc.WriteClose(1000, "")
		rc.SetDeadline(2 * time.Second)
		rc.ExpectClose()
	})
	srv.Header = http.Header{}
	for i := range 67 {
		srv.Header.Set(fmt.Sprintf("X-Edge-%d", i), "v")
	}
	srv.Start(t)
	p := newTestPool(t, talaris.Config{}, hangGuard)
	ctx, cancel := dialCtx(t)
	defer cancel()
	c, err := p.Dial(ctx, srv.URL, nil)
	if err != nil {
		t.Fatalf("Dial with 70 response header lines: %v", err)
	}
	if f := pumpOne(t, p, c, nil); f.Kind != talaris.EventClose || f.Code != 1000 {
		t.Fatalf("final %+v, want EventClose 1000", f)
	}
}

// TestHandshakeErrorLateBody: a refusal whose body comes in later
// segments than its head, as net/http writes it when the handler flushes
// the head first, still carries the body in HandshakeError: chunked
// (decoded) and with a Content-Length, ws and wss, through Dial and
// DialAsync; a body without either header ends at the server's close. A
// body the head announces that never comes holds the refusal back for
// 200 ms at most, not for the handshake timeout. Found by a hostile
// review: Body was empty whenever the body came in a segment of its own.
func TestHandshakeErrorLateBody(t *testing.T) {
	p := newTestPool(t, talaris.Config{}, hangGuard)
	const body = "venue closed for maintenance until 06:00 UTC\n"
	late := func(length bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "3")
			w.Header().Set("X-Venue", "test")
			if length {
				w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			w.(http.Flusher).Flush()
			time.Sleep(30 * time.Millisecond)
			io.WriteString(w, body[:10])
			w.(http.Flusher).Flush()
			time.Sleep(20 * time.Millisecond)
			io.WriteString(w, body[10:])
		}
	}
	check := func(t *testing.T, err error, status int, want string) {
		t.Helper()
		var he *talaris.HandshakeError
		if !errors.As(err, &he) || !errors.Is(err, talaris.ErrBadStatus) {
			t.Fatalf("%v (%T): want a HandshakeError matching ErrBadStatus", err, err)
		}
		if he.StatusCode != status || string(he.Body) != want {
			t.Errorf("status %d body %q, want %d %q", he.StatusCode, he.Body, status, want)
		}
		if status == http.StatusServiceUnavailable && (he.RetryAfter != 3*time.Second || he.Header.Get("X-Venue") != "test") {
			t.Errorf("RetryAfter %v Header %v", he.RetryAfter, he.Header)
		}
	}
	for _, tc := range []struct {
		name   string
		length bool
	}{{"chunked", false}, {"content-length", true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(late(tc.length))
			defer srv.Close()
			url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/"
			ctx, cancel := dialCtx(t)
			defer cancel()
			_, err := p.Dial(ctx, url, nil)
			check(t, err, 503, body)
			c, err := p.DialAsync(url, nil)
			if err != nil {
				t.Fatal(err)
			}
			ev := pumpOne(t, p, c, nil)
			check(t, ev.Err, 503, body)
		})
		t.Run(tc.name+"-wss", func(t *testing.T) {
			// Run with -tags talaris_openssl for the other backend.
			srv := httptest.NewUnstartedServer(late(tc.length))
			srv.TLS = serverTLS(t, testCertFile, testKeyFile, 0, 0)
			srv.StartTLS()
			defer srv.Close()
			ctx, cancel := dialCtx(t)
			defer cancel()
			_, err := p.Dial(ctx, "wss"+strings.TrimPrefix(srv.URL, "https")+"/", tlsOpts)
			check(t, err, 503, body)
		})
	}
	// raw answers every request with head, then (after 30 ms) tail, then
	// holds the connection open for hold before it closes it.
	raw := func(t *testing.T, head, tail string, hold time.Duration) string {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		t.Cleanup(func() { close(done); ln.Close() })
		answerRequests(ln, func(nc net.Conn) {
			io.WriteString(nc, head)
			time.Sleep(30 * time.Millisecond)
			io.WriteString(nc, tail)
			select {
			case <-time.After(hold):
			case <-done:
			}
		})
		return "ws://" + ln.Addr().String() + "/"
	}
	t.Run("close-delimited", func(t *testing.T) {
		url := raw(t, "HTTP/1.1 403 Forbidden\r\nConnection: close\r\n\r\n", body, 0)
		ctx, cancel := dialCtx(t)
		defer cancel()
		_, err := p.Dial(ctx, url, nil)
		check(t, err, 403, body)
	})
	t.Run("body-never-comes", func(t *testing.T) {
		// Content-Length 100, 10 bytes sent, the connection held open: the
		// refusal comes with those 10 bytes after the 200 ms wait, long
		// before the 10 s handshake timeout.
		url := raw(t, "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3\r\nX-Venue: test\r\nContent-Length: 100\r\n\r\n", body[:10], time.Minute)
		ctx, cancel := dialCtx(t)
		defer cancel()
		start := time.Now()
		_, err := p.Dial(ctx, url, nil)
		check(t, err, 503, body[:10])
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("the refusal took %v: it waited for the handshake timeout", d)
		}
	})
	t.Run("chunked-framing", func(t *testing.T) {
		// Found by a review of the wait: an end spelled otherwise than
		// "0\r\n\r\n" (extensions, trailers, padded sizes) was waited out
		// for 200 ms, and chunk data holding "\r\n0\r\n\r\n" ended the
		// body early. The end is found by walking the chunks
		// (tl_http_chunked_end, test_http.c).
		const refused = "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3\r\nX-Venue: test\r\nTransfer-Encoding: chunked\r\n\r\n"
		for _, tc := range []struct{ tail, want string }{
			{"5\r\nhello\r\n0;why=maint\r\n\r\n", "hello"},
			{"5\r\nhello\r\n0\r\nX-Reason: maint\r\n\r\n", "hello"},
			{"005\r\nhello\r\n000\r\n\r\n", "hello"},
			{"11\r\nline1\r\n0\r\n\r\nline3\r\n0\r\n\r\n", "line1\r\n0\r\n\r\nline3"},
		} {
			url := raw(t, refused, tc.tail, time.Minute)
			ctx, cancel := dialCtx(t)
			_, err := p.Dial(ctx, url, nil)
			cancel()
			check(t, err, 503, tc.want)
		}
	})
	t.Run("trailer", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Reason")
			w.Header().Set("Retry-After", "3")
			w.Header().Set("X-Venue", "test")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.(http.Flusher).Flush()
			time.Sleep(20 * time.Millisecond)
			io.WriteString(w, body)
			w.Header().Set("X-Reason", "maintenance")
		}))
		defer srv.Close()
		ctx, cancel := dialCtx(t)
		defer cancel()
		_, err := p.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/", nil)
		check(t, err, 503, body)
	})
	t.Run("context-ends-during-wait", func(t *testing.T) {
		// Dial's context ends while the refusal waits for its body: the
		// refusal is what Dial returns (status, Retry-After, the body so
		// far), not the context's timeout. Found by the same review: the
		// 503 was lost behind "timed out".
		url := raw(t, "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3\r\nX-Venue: test\r\nContent-Length: 100\r\n\r\n", body[:10], time.Minute)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := p.Dial(ctx, url, nil)
		check(t, err, 503, body[:10])
	})
	t.Run("no-body", func(t *testing.T) {
		// Content-Length 0 and a 304: reported at once, nothing waited for.
		for _, head := range []string{
			"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 3\r\nX-Venue: test\r\nContent-Length: 0\r\n\r\n",
			"HTTP/1.1 304 Not Modified\r\n\r\n",
		} {
			url := raw(t, head, "", time.Minute)
			ctx, cancel := dialCtx(t)
			_, err := p.Dial(ctx, url, nil)
			cancel()
			var he *talaris.HandshakeError
			if !errors.As(err, &he) || len(he.Body) != 0 {
				t.Errorf("%q: %v", head, err)
			}
		}
	})
}

// TestDialWhilePumping: Dials made from other goroutines while one
// goroutine pumps a busy stream lose none of that stream's events, and the
// dialed connections' own events (EventOpen first) reach the pumper.
func TestDialWhilePumping(t *testing.T) {
	forEachServer(t, func(t *testing.T, srv *wstest.Server) {
		const dialers, perDialer = 4, 8
		// The stream's close: the server reads the client's close only
		// after the pongs to every one of its pings (30,000 under -short).
		// Under the race detector at load 10 that took coder's server
		// longer than the default 5 s CloseTimeout, which then ended the
		// stream with ErrCloseTimeout. When the close ends is not what
		// this test checks; that it ends clean is, so the bound is the
		// hang guard's.
		p := newTestPool(t, talaris.Config{CloseTimeout: hangGuard}, 2*hangGuard)
		spec := streamSpec{n: scaled(300000), size: 32, frag: 2, ping: true}
		main, err := p.DialAsync(srv.URL+spec.path(), nil)
		if err != nil {
			t.Fatal(err)
		}
		// The pumper owns everything below until it returns.
		st := newStreamState(spec)
		events := map[talaris.Conn][]finalEvent{}
		finals := 0
		pumped := make(chan struct{})
		go func() {
			defer close(pumped)
			for finals < 1+dialers*perDialer {
				_, err := p.Pump(func(c talaris.Conn, ev talaris.Event) {
					if c == main {
						st.on(ev)
					} else {
						events[c] = append(events[c], copyFinal(ev))
					}
					if ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError {
						finals++
					}
				})
				if !t.Failed() && poolEmptied(err) {
					// every connection so far ended; a dialer is between Dials
					continue
				}
				if err != nil {
					t.Errorf("Pump: %v", err)
					return
				}
			}
		}()
		dialed := make(chan talaris.Conn, dialers*perDialer)
		var wg sync.WaitGroup
		for d := range dialers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perDialer {
					code := 4000 + d*perDialer + i
					ctx, cancel := dialCtx(t)
					c, err := p.Dial(ctx, fmt.Sprintf("%s/close?code=%d&reason=r%d", srv.URL, code, code), nil)
					cancel()
					if err != nil {
						t.Errorf("Dial: %v", err)
						return
					}
					dialed <- c
				}
			}()
		}
		wg.Wait()
		close(dialed)
		<-pumped
		st.verify(t, "stream during dials")
		n := 0
		for c := range dialed {
			n++
			evs := events[c]
			if len(evs) != 2 || evs[0].Kind != talaris.EventOpen || evs[1].Kind != talaris.EventClose {
				t.Errorf("dialed conn %#x: events %+v, want open then close", c.ID(), evs)
				continue
			}
			if evs[1].Code < 4000 || evs[1].Reason != fmt.Sprintf("r%d", evs[1].Code) {
				t.Errorf("dialed conn %#x: close %+v", c.ID(), evs[1])
			}
		}
		if n != dialers*perDialer || len(events) != n {
			t.Errorf("%d dials, events for %d connections, want %d", n, len(events), dialers*perDialer)
		}
	})
}

// TestDialsDuringFlood: 48 connections dialed at once, each flooding as soon
// as it opens, so later handshakes race earlier floods for receive buffers
// (handshakes have their own buffer group). Every one must open and deliver
// its whole stream.
func TestDialsDuringFlood(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	p, err := talaris.NewPool(talaris.Config{BufCount: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// The handshakes race the first floods' first messages; under -short
	// (the race run: 33 s of it at load 10) 2,000 messages a stream.
	const conns = 48
	n := scaled(20000)
	chk := map[talaris.Conn]*wstest.Checker{}
	for range conns {
		c, err := p.DialAsync(fmt.Sprintf("%s/stream?n=%d&size=64", srv.URL, n), nil)
		if err != nil {
			t.Fatal(err)
		}
		chk[c] = wstest.NewChecker(64)
	}
	done, opened := 0, 0
	deadline := time.Now().Add(60 * time.Second)
	for done < conns {
		if time.Now().After(deadline) {
			t.Fatalf("%d opened, %d done after 60s (stats %+v)", opened, done, testhook.Stats(p))
		}
		if _, err := p.Pump(func(c talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventOpen:
				opened++
			case talaris.EventBinary:
				if err := chk[c].Check(ev.Payload); err != nil {
					t.Fatal(err)
				}
			case talaris.EventClose, talaris.EventError:
				if ev.Kind != talaris.EventClose || chk[c].Count() != n {
					t.Errorf("conn %d: %v %v after %d messages", c.Slot(), ev.Kind, ev.Err, chk[c].Count())
				}
				done++
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	if opened != conns {
		t.Fatalf("opened %d of %d", opened, conns)
	}
}
