package talaris

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// Connection lifecycle logging (Config.Logger). Records are written only
// off the per-message path: by the dialing goroutine (dialing, TLS done)
// and by the pumping goroutine when it passes a non-data event (open,
// closed, failed). Every record carries pool (Config.Name), conn
// (Conn.ID) and slot.

// errClasses names the sentinels for the class attribute of failure
// records: a stable, grep-able word per cause. Most specific first: an
// error that wraps several sentinels gets the first that matches.
var errClasses = []struct {
	err  error
	name string
}{
	{ErrTLSUnknownCA, "tls_unknown_ca"}, {ErrTLSHostname, "tls_hostname"}, {ErrTLSExpired, "tls_expired"},
	{ErrTLSALPN, "tls_alpn"}, {ErrTLSNotTLS, "tls_not_tls"}, {ErrTLS, "tls"},
	{ErrBadStatus, "bad_status"}, {ErrBadAccept, "bad_accept"}, {ErrBadSubprotocol, "bad_subprotocol"},
	{ErrBadExtension, "bad_extension"}, {ErrHeaderTooLarge, "header_too_large"}, {ErrHandshake, "handshake"},
	{ErrProtocol, "protocol"}, {ErrInvalidUTF8, "invalid_utf8"}, {ErrMessageTooBig, "message_too_big"},
	{ErrConnectionLost, "connection_lost"}, {ErrCloseTimeout, "close_timeout"}, {ErrTimeout, "timeout"},
	{ErrResolve, "resolve"}, {ErrDial, "dial"}, {ErrBadURL, "bad_url"}, {ErrTooManyConns, "too_many_conns"},
	{ErrPoolClosed, "pool_closed"}, {ErrClosed, "closed"}, {ErrInvalidConfig, "invalid_config"},
	{ErrUnsupported, "unsupported"}, {errInternal, "internal"},
}

// className returns the class name of sentinel s, or "".
func className(s error) string {
	for _, c := range errClasses {
		if c.err == s {
			return c.name
		}
	}
	return ""
}

// errClass returns the class of err (the name of its most specific
// sentinel) and its category (the parent sentinel's name: "tls",
// "handshake", or "" when there is none).
func errClass(err error) (class, category string) {
	var ce *ConnError
	if errors.As(err, &ce) {
		class, category = className(ce.Cause), ""
		if p := causeCategory(ce.Cause); p != nil {
			category = className(p)
		}
		if class == "" {
			class = "other"
		}
		return class, category
	}
	for _, c := range errClasses {
		if errors.Is(err, c.err) {
			return c.name, ""
		}
	}
	return "other", ""
}

// logConnAttrs names the connection a record is about: its slot and the
// generation of that slot (the two halves of Conn.ID, readable apart: a
// reconnect keeps both, a new dial on a reused slot has a new gen).
func logConnAttrs(pool string, c Conn) []slog.Attr {
	return []slog.Attr{slog.String("pool", pool), slog.Int("slot", c.Slot()), slog.Uint64("gen", uint64(c.gen))}
}

// errAttrs are the class of err and, when it has one, its category: a
// record for a failure that is neither TLS nor handshake carries no empty
// category.
func errAttrs(err error) []slog.Attr {
	class, cat := errClass(err)
	if cat == "" {
		return []slog.Attr{slog.String("class", class)}
	}
	return []slog.Attr{slog.String("class", class), slog.String("category", cat)}
}

// logDialing records the start of a dial.
func logDialing(l *slog.Logger, pool string, c Conn, url string) {
	if l == nil {
		return
	}
	l.LogAttrs(context.Background(), slog.LevelInfo, "talaris: dialing", append(logConnAttrs(pool, c), slog.String("url", url))...)
}

// logTLSDone records a completed TLS handshake (seen by a synchronous Dial).
func logTLSDone(l *slog.Logger, pool string, c Conn) {
	if l == nil {
		return
	}
	l.LogAttrs(context.Background(), slog.LevelInfo, "talaris: tls handshake done", logConnAttrs(pool, c)...)
}

// logDialFailed records a dial that failed before the loop had an event
// for it (bad URL, resolve failure, full pool, cancelled context).
func logDialFailed(l *slog.Logger, pool string, url string, err error) {
	if l == nil {
		return
	}
	attrs := append([]slog.Attr{slog.String("pool", pool), slog.String("url", url)}, errAttrs(err)...)
	l.LogAttrs(context.Background(), slog.LevelWarn, "talaris: dial failed", append(attrs, slog.Any("err", err))...)
}

// logLifecycle records a non-data event: open (Info), close (Info), error
// (Warn, with the error's class). Pings and pongs are not logged: they are
// per-message traffic.
func logLifecycle(l *slog.Logger, pool string, c Conn, ev *Event) {
	switch ev.Kind {
	case EventOpen:
		l.LogAttrs(context.Background(), slog.LevelInfo, "talaris: open",
			append(logConnAttrs(pool, c), slog.String("subprotocol", string(ev.Payload)))...)
	case EventClose:
		l.LogAttrs(context.Background(), slog.LevelInfo, "talaris: closed",
			append(logConnAttrs(pool, c), slog.Int("code", ev.Code), slog.String("reason", string(ev.Reason)))...)
	case EventError:
		attrs := append(append(logConnAttrs(pool, c), slog.Int("code", ev.Code)), errAttrs(ev.Err)...)
		l.LogAttrs(context.Background(), slog.LevelWarn, "talaris: connection failed", append(attrs, slog.Any("err", ev.Err))...)
	}
}

// logReconnecting records a reconnect about to be attempted after delay
// because of reason (EventReconnecting, written by the pumping goroutine
// like the other lifecycle records); attempt counts the attempts since
// the last open, this one included.
func logReconnecting(l *slog.Logger, pool string, c Conn, reason error, delay time.Duration, attempt int) {
	if l == nil {
		return
	}
	attrs := append(append(logConnAttrs(pool, c), slog.Duration("delay", delay), slog.Int("attempt", attempt)), errAttrs(reason)...)
	l.LogAttrs(context.Background(), slog.LevelWarn, "talaris: reconnecting", append(attrs, slog.Any("reason", reason))...)
}
