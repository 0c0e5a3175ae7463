package talaris

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// maxAddrs bounds the addresses of one name a dial tries (the C core
// refuses more).
const maxAddrs = 16

// target is a validated ws:// or wss:// URL, resolved to its addresses.
type target struct {
	proxy      *proxyPlan // DialOptions.Proxy's, nil when direct: addrs are then the proxy's
	tls        bool
	addrs      []netip.AddrPort // in the order tried; IPv4 addresses are unmapped (Is4)
	local      netip.AddrPort   // DialOptions.LocalAddr (port 0: any); invalid when unset
	host, path string           // Host header and request-target of the upgrade
	serverName string           // SNI and certificate name
}

// parseLocalAddr parses DialOptions.LocalAddr: an IP address, or an
// IP and port ("127.0.0.2", "127.0.0.2:9000", "::1", "[::1]:9000").
func parseLocalAddr(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if a, err1 := netip.ParseAddr(s); err1 == nil {
		ap, err = netip.AddrPortFrom(a, 0), nil
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w: LocalAddr %q is not an IP address or IP:port", ErrBadURL, s)
	}
	if ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("%w: LocalAddr %q: zones are not supported", ErrBadURL, s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// parseTarget validates rawURL and resolves its host to every address it
// has (IPv4 first, then IPv6, each in the resolver's order): the loop
// tries them in turn until one connects. With a LocalAddr only the
// addresses of its family are kept.
func parseTarget(ctx context.Context, rawURL string, opts *DialOptions) (*target, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadURL, err)
	}
	t := &target{}
	port := u.Port()
	switch strings.ToLower(u.Scheme) {
	case "ws":
		if port == "" {
			port = "80"
		}
	case "wss":
		t.tls = true
		if port == "" {
			port = "443"
		}
	default:
		return nil, fmt.Errorf("%w: scheme %q is not ws or wss", ErrBadURL, u.Scheme)
	}
	hostname := u.Hostname()
	if hostname == "" {
		return nil, fmt.Errorf("%w: no host in %q", ErrBadURL, rawURL)
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("%w: fragment not allowed in a websocket URL", ErrBadURL)
	}
	pn, err := strconv.Atoi(port)
	if err != nil || pn <= 0 || pn > 65535 {
		return nil, fmt.Errorf("%w: bad port %q", ErrBadURL, port)
	}
	t.host = u.Host
	if (t.tls && port == "443") || (!t.tls && port == "80") {
		t.host = hostname
		if strings.Contains(hostname, ":") {
			t.host = "[" + hostname + "]"
		}
	}
	t.path = u.RequestURI()
	if t.path == "" {
		t.path = "/"
	}
	t.serverName = hostname
	if opts != nil && opts.TLS.ServerName != "" {
		t.serverName = opts.TLS.ServerName
	}
	// An absolute name's root dot is no part of SNI (RFC 6066 3: "The
	// hostname is represented ... without a trailing dot") nor of the
	// certificate's names; crypto/tls strips it too.
	if len(t.serverName) > 1 {
		t.serverName = strings.TrimSuffix(t.serverName, ".")
	}
	if opts != nil && opts.LocalAddr != "" {
		if t.local, err = parseLocalAddr(opts.LocalAddr); err != nil {
			return nil, err
		}
	}
	resolve := func(ctx context.Context, host string, port int, local bool) ([]netip.AddrPort, error) {
		return resolveAddrs(ctx, opts, host, port, local, t.local)
	}
	if t.proxy, err = planProxy(ctx, opts, t.tls, u.Host, hostname, pn, resolve); err != nil {
		return nil, err
	}
	if t.proxy != nil {
		t.addrs = t.proxy.addrs
		return t, nil
	}
	if t.addrs, err = resolve(ctx, hostname, pn, true); err != nil {
		return nil, err
	}
	return t, nil
}

// resolveAddrs looks hostname up (an IP address is itself) and returns its
// addresses with port, IPv4 first, then IPv6, each in the resolver's
// order, at most maxAddrs; with local (the socket's bound address) valid
// and filter set only those of its family.
func resolveAddrs(ctx context.Context, opts *DialOptions, hostname string, pn int, filter bool, local netip.AddrPort) ([]netip.AddrPort, error) {
	var ips []netip.Addr
	var out []netip.AddrPort
	if a, err := netip.ParseAddr(hostname); err == nil {
		if a.Zone() != "" {
			return nil, fmt.Errorf("%w: zoned address %q not supported", ErrBadURL, hostname)
		}
		ips = []netip.Addr{a.Unmap()}
	} else {
		r := net.DefaultResolver
		if opts != nil && opts.Resolver != nil {
			r = opts.Resolver
		}
		found, err := r.LookupNetIP(ctx, "ip", hostname)
		if err != nil || len(found) == 0 {
			return nil, fmt.Errorf("%w: %s: %w", ErrResolve, hostname, err)
		}
		// IPv4 first: loopback feeds usually listen there, and a refused
		// IPv4 connect costs one round trip before IPv6 is tried.
		for _, v6 := range []bool{false, true} {
			for _, a := range found {
				if a = a.Unmap(); a.Is6() == v6 && a.Zone() == "" {
					ips = append(ips, a)
				}
			}
		}
	}
	for _, a := range ips {
		if filter && local.IsValid() && a.Is4() != local.Addr().Is4() {
			continue // a socket bound to one family cannot reach the other
		}
		if len(out) < maxAddrs {
			out = append(out, netip.AddrPortFrom(a, uint16(pn)))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s has no address of LocalAddr %s's family", ErrResolve, hostname, local.Addr())
	}
	return out, nil
}

// validToken reports whether s is an RFC 7230 token (a header name or a
// subprotocol).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("()<>@,;:\\\"/[]?={}", c) >= 0 {
			return false
		}
	}
	return true
}

// headerBlock renders the caller's extra request headers as CRLF-terminated
// lines and returns a Host override separately. Headers the client sets
// itself, bad names and values with CR, LF or NUL are ErrBadURL.
func headerBlock(h http.Header) (string, string, error) {
	var b strings.Builder
	hostOverride := ""
	for name, vals := range h {
		if !validToken(name) {
			return "", "", fmt.Errorf("%w: bad header name %q", ErrBadURL, name)
		}
		switch strings.ToLower(name) {
		case "upgrade", "connection", "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
			"sec-websocket-protocol", "content-length", "transfer-encoding":
			return "", "", fmt.Errorf("%w: header %q is set by the client itself", ErrBadURL, name)
		case "host":
			if len(vals) > 0 {
				hostOverride = vals[0]
			}
			continue
		}
		for _, v := range vals {
			if strings.ContainsAny(v, "\r\n\x00") {
				return "", "", fmt.Errorf("%w: header %q value has CR, LF or NUL", ErrBadURL, name)
			}
			b.WriteString(name)
			b.WriteString(": ")
			b.WriteString(v)
			b.WriteString("\r\n")
		}
	}
	if strings.ContainsAny(hostOverride, "\r\n\x00") {
		return "", "", fmt.Errorf("%w: Host has CR, LF or NUL", ErrBadURL)
	}
	return b.String(), hostOverride, nil
}

// dialRequest is everything a dial sends to the C core, validated: the
// target plus the rendered headers and subprotocol offer.
type dialRequest struct {
	*target
	headers   string
	protocols string
	pol       *tlsPolicy // TLSOptions, checked and translated
}

// newDialRequest validates a Dial's URL and options (nil opts: defaults).
func newDialRequest(ctx context.Context, rawURL string, opts *DialOptions) (*dialRequest, error) {
	t, err := parseTarget(ctx, rawURL, opts)
	if err != nil {
		return nil, err
	}
	var h http.Header
	var sps []string
	if opts != nil {
		h, sps = opts.Header, opts.Subprotocols
	}
	headers, hostOverride, err := headerBlock(h)
	if err != nil {
		return nil, err
	}
	if hostOverride != "" {
		t.host = hostOverride
	}
	for _, sp := range sps {
		if !validToken(sp) {
			return nil, fmt.Errorf("%w: bad subprotocol %q", ErrBadURL, sp)
		}
	}
	return &dialRequest{target: t, headers: headers, protocols: strings.Join(sps, ", ")}, nil
}
