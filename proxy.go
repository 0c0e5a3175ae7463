package talaris

// Dialing through a proxy (DialOptions.Proxy): the proxy URL's checks and
// the requests the loop sends (csrc/transport/proxy.c writes them and
// reads the replies), and ProxyError.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
)

// ErrProxy is the category of every failure of a proxy given by
// DialOptions.Proxy: its func's error, a scheme that is not supported, no
// connection to it, a refusal (HTTP status, SOCKS reply), a malformed or
// oversized reply, its connection closed before the reply ended, and the
// handshake timeout while the proxy's handshake ran (that one matches
// ErrTimeout too). The error is a *ProxyError.
var ErrProxy = errors.New("talaris: proxy failure")

// ProxyError is the error of a dial whose proxy failed: errors.Is(err,
// ErrProxy) holds, and Unwrap gives the cause underneath when there is one
// (ErrTimeout; a *ConnError with ErrDial or ErrConnectionLost and its
// errno; the Proxy func's error).
type ProxyError struct {
	Proxy  string // the proxy's URL, password removed
	Status int    // HTTP CONNECT: the reply's status when not 2xx (407: authentication required), else 0
	// Reply is SOCKS5's refusal: the CONNECT reply code (RFC 1928 6: 5
	// connection refused, 4 host unreachable ...), or for a refused
	// authentication the RFC 1929 status (or 255: no acceptable method);
	// 0 when none.
	Reply  int
	Detail string // what went wrong
	Err    error  // the cause underneath, or nil
}

func (e *ProxyError) Error() string {
	s := "talaris: proxy " + e.Proxy + ": " + e.Detail
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is reports whether target is ErrProxy.
func (e *ProxyError) Is(target error) bool { return target == ErrProxy }

// Unwrap returns the cause underneath (nil when the proxy refused).
func (e *ProxyError) Unwrap() error { return e.Err }

// Proxy kinds (TL_PROXY_KIND_* in csrc/talaris.h).
const (
	proxyHTTP   = 1
	proxySOCKS5 = 2
)

// proxyPlan is a dial's proxy: where to connect and what to send.
type proxyPlan struct {
	kind  int
	name  string           // the URL, password removed (ProxyError.Proxy)
	addrs []netip.AddrPort // the proxy's addresses
	req   string           // the CONNECT request, or SOCKS5's CONNECT request
	auth  string           // SOCKS5: the RFC 1929 request, or empty
}

// redactProxy returns u without its password.
func redactProxy(u *url.URL) string {
	c := *u
	if c.User != nil {
		c.User = url.User(c.User.Username())
	}
	return c.String()
}

// planProxy asks opts.Proxy for the proxy of the target (scheme tls,
// hostname, port) and prepares its requests; nil for a direct dial.
// resolve looks up a host's addresses for a port.
func planProxy(ctx context.Context, opts *DialOptions, tls bool, hostport, hostname string, port int,
	resolve func(ctx context.Context, host string, port int, local bool) ([]netip.AddrPort, error)) (*proxyPlan, error) {
	if opts == nil || opts.Proxy == nil {
		return nil, nil
	}
	scheme := "http"
	if tls {
		scheme = "https"
	}
	ru := &url.URL{Scheme: scheme, Host: hostport, Path: "/"}
	req := &http.Request{Method: http.MethodGet, URL: ru, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: make(http.Header), Host: hostport}
	req = req.WithContext(ctx)
	pu, err := opts.Proxy(req)
	if err != nil {
		return nil, &ProxyError{Proxy: "?", Detail: "DialOptions.Proxy failed", Err: err}
	}
	if pu == nil {
		return nil, nil
	}
	pl := &proxyPlan{name: redactProxy(pu)}
	fail := func(format string, a ...any) (*proxyPlan, error) {
		return nil, &ProxyError{Proxy: pl.name, Detail: fmt.Sprintf(format, a...)}
	}
	defPort := ""
	switch strings.ToLower(pu.Scheme) {
	case "http":
		pl.kind, defPort = proxyHTTP, "80"
	case "socks5", "socks5h":
		pl.kind, defPort = proxySOCKS5, "1080"
	case "https":
		return fail("https proxies are not supported: the loop runs one TLS session per connection")
	default:
		return fail("proxy scheme %q is not supported (http, socks5, socks5h)", pu.Scheme)
	}
	ph := pu.Hostname()
	if ph == "" {
		return fail("no host in the proxy URL")
	}
	pp := pu.Port()
	if pp == "" {
		pp = defPort
	}
	ppn, err := strconv.Atoi(pp)
	if err != nil || ppn <= 0 || ppn > 65535 {
		return fail("bad proxy port %q", pp)
	}
	user, pass, hasUser := "", "", pu.User != nil
	if hasUser {
		user = pu.User.Username()
		pass, _ = pu.User.Password()
	}
	target := net.JoinHostPort(hostname, strconv.Itoa(port))
	switch {
	case pl.kind == proxyHTTP:
		if strings.ContainsAny(target, "\r\n\x00 ") {
			return fail("bad target %q", target)
		}
		var b strings.Builder
		b.WriteString("CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n")
		if hasUser {
			b.WriteString("Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass)) + "\r\n")
		}
		b.WriteString("\r\n")
		pl.req = b.String()
	default:
		if hasUser {
			if len(user) == 0 || len(user) > 255 || len(pass) > 255 {
				return fail("SOCKS5 username must be 1 to 255 bytes and the password at most 255")
			}
			pl.auth = string([]byte{1, byte(len(user))}) + user + string([]byte{byte(len(pass))}) + pass
		}
		r := []byte{5, 1, 0}
		if _, ipErr := netip.ParseAddr(hostname); strings.EqualFold(pu.Scheme, "socks5h") && ipErr != nil {
			if len(hostname) > 255 {
				return fail("target name longer than 255 bytes")
			}
			r = append(r, 3, byte(len(hostname)))
			r = append(r, hostname...)
		} else {
			// socks5 (or an IP literal): the target's address, looked up here.
			addrs, err := resolve(ctx, hostname, port, false)
			if err != nil {
				return nil, err
			}
			a := addrs[0].Addr()
			if a.Is4() {
				r = append(r, 1)
			} else {
				r = append(r, 4)
			}
			r = append(r, a.AsSlice()...)
		}
		r = append(r, byte(port>>8), byte(port))
		pl.req = string(r)
	}
	addrs, err := resolve(ctx, ph, ppn, true)
	if err != nil {
		return nil, &ProxyError{Proxy: pl.name, Detail: "looking up the proxy", Err: err}
	}
	pl.addrs = addrs
	return pl, nil
}

// proxyErr turns err, the error of a connection dialed through the proxy
// named name, into its *ProxyError: a failed connect to the proxy (ErrDial)
// is wrapped; a TL_E_PROXY error (built by makeErr with an empty Proxy)
// gets the name. Other errors are the session's own.
func proxyErr(err error, name string) error {
	if name == "" || err == nil {
		return err
	}
	var pe *ProxyError
	if errors.As(err, &pe) {
		if pe.Proxy == "" {
			pe.Proxy = name
		}
		return err
	}
	var ce *ConnError
	if errors.As(err, &ce) && ce.Cause == ErrDial {
		return &ProxyError{Proxy: name, Detail: "cannot connect to the proxy", Err: err}
	}
	return err
}

// Proxy causes in aux's low byte for TL_E_PROXY (csrc/ring.h).
const (
	cProxyStatus    = 1 // TL_PROXY_STATUS
	cProxyReply     = 2 // TL_PROXY_REPLY
	cProxyAuth      = 3 // TL_PROXY_AUTH
	cProxyMalformed = 4 // TL_PROXY_MALFORMED
	cProxyTooLarge  = 5 // TL_PROXY_TOO_LARGE
	cProxyTimeout   = 6 // TL_PROXY_TIMEOUT
	cProxyLost      = 7 // TL_PROXY_LOST
)

// makeProxyErr builds the *ProxyError of a TL_E_PROXY failure (Proxy is
// filled in by proxyErr, which knows the connection).
func makeProxyErr(aux int32, code int, detail string) error {
	pe := &ProxyError{Detail: detail}
	switch aux & 0xff {
	case cProxyStatus:
		pe.Status = code
	case cProxyReply, cProxyAuth:
		pe.Reply = code
	case cProxyTimeout:
		pe.Err = ErrTimeout
	case cProxyLost:
		ce := &ConnError{Cause: ErrConnectionLost, Detail: detail}
		if e := aux >> 8; e > 0 {
			ce.errno = syscall.Errno(e)
		}
		pe.Err = ce
	}
	return pe
}
