package conformance

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/talaris-go/talaris"
)

// Result is what a client adapter reports about one case.
type Result struct {
	Opened      bool   // the opening handshake succeeded
	DialErr     error  // why it did not
	Final       string // the client's last word, e.g. "EventClose 1000" or "read: ... 1002"
	Code        int    // close code of the final event (talaris) or close error (others); 0 if none
	Err         error  // final error (talaris: EventError.Err)
	Subprotocol string
	Echoed      int // messages echoed
	Notes       []string
}

// Client runs one case against a server URL and reports the outcome. Run
// must return (hang guards included) even against a silent server.
type Client interface {
	Name() string
	Run(url string, o Opts) *Result
}

var sentinels = []error{
	talaris.ErrBadStatus, talaris.ErrBadAccept, talaris.ErrBadSubprotocol, talaris.ErrBadExtension,
	talaris.ErrHeaderTooLarge, talaris.ErrHandshake, talaris.ErrProtocol, talaris.ErrInvalidUTF8,
	talaris.ErrMessageTooBig, talaris.ErrConnectionLost, talaris.ErrCloseTimeout, talaris.ErrTimeout,
	talaris.ErrDial, talaris.ErrClosed, talaris.ErrPoolClosed,
}

// errName names a talaris sentinel the error matches, or shortens it.
func errName(err error) string {
	if err == nil {
		return ""
	}
	for _, s := range sentinels {
		if errors.Is(err, s) {
			name := strings.TrimPrefix(s.Error(), "talaris: ")
			return sentinelNames[s] + " (" + name + ")"
		}
	}
	msg := err.Error()
	if len(msg) > 70 {
		msg = msg[:70] + "..."
	}
	return msg
}

var sentinelNames = map[error]string{
	talaris.ErrBadStatus: "ErrBadStatus", talaris.ErrBadAccept: "ErrBadAccept", talaris.ErrBadSubprotocol: "ErrBadSubprotocol",
	talaris.ErrBadExtension: "ErrBadExtension", talaris.ErrHeaderTooLarge: "ErrHeaderTooLarge", talaris.ErrHandshake: "ErrHandshake",
	talaris.ErrProtocol: "ErrProtocol", talaris.ErrInvalidUTF8: "ErrInvalidUTF8", talaris.ErrMessageTooBig: "ErrMessageTooBig",
	talaris.ErrConnectionLost: "ErrConnectionLost", talaris.ErrCloseTimeout: "ErrCloseTimeout", talaris.ErrTimeout: "ErrTimeout",
	talaris.ErrDial: "ErrDial", talaris.ErrClosed: "ErrClosed", talaris.ErrPoolClosed: "ErrPoolClosed",
}

// Expected describes the case's expected behaviour in words.
func (c *Case) Expected() string {
	w := &c.Want
	var b strings.Builder
	switch w.Kind {
	case Echo:
		var parts []string
		if len(w.Msgs) > 0 {
			q := ""
			if w.Prefix {
				q = "up to "
			}
			parts = append(parts, fmt.Sprintf("echo %s%d msg", q, len(w.Msgs)))
		}
		if len(w.Pongs) > 0 {
			parts = append(parts, fmt.Sprintf("%d pong", len(w.Pongs)))
		}
		code := w.Code
		if code == 0 {
			code = 1000
		}
		parts = append(parts, fmt.Sprintf("close %d", code))
		b.WriteString(strings.Join(parts, ", "))
		if w.Err != nil {
			fmt.Fprintf(&b, "; talaris: %s", sentinelNames[w.Err])
		}
	case Fail:
		fmt.Fprintf(&b, "fail: close %d", w.Code)
		if len(w.Msgs) > 0 {
			fmt.Fprintf(&b, " (after echoing up to %d msg)", len(w.Msgs))
		}
		fmt.Fprintf(&b, "; talaris: %s", sentinelNames[w.Err])
	case NoOpen:
		fmt.Fprintf(&b, "handshake refused; talaris: %s", sentinelNames[w.Err])
	case Lost:
		fmt.Fprintf(&b, "connection lost, %d", w.Code)
		if len(w.Msgs) > 0 {
			fmt.Fprintf(&b, " (after echoing %d msg)", len(w.Msgs))
		}
		fmt.Fprintf(&b, "; talaris: %s", sentinelNames[w.Err])
	}
	return b.String()
}

// Observed summarises what happened, from both ends.
func Observed(o *Obs, r *Result) string {
	if o == nil {
		o = &Obs{}
	}
	var parts []string
	if !r.Opened {
		parts = append(parts, "not opened: "+errName(r.DialErr))
	} else {
		parts = append(parts, fmt.Sprintf("echoed %d", len(o.Msgs)))
		if len(o.Pongs) > 0 {
			parts = append(parts, fmt.Sprintf("%d pong", len(o.Pongs)))
		}
		switch {
		case o.CloseCode == 0:
			parts = append(parts, "no close frame")
		case o.CloseCode < 0:
			parts = append(parts, "bad close frame")
		default:
			parts = append(parts, fmt.Sprintf("close %d", o.CloseCode))
		}
		if r.Final != "" {
			parts = append(parts, r.Final)
		}
	}
	if o.BadFrame != "" {
		parts = append(parts, "bad client frame: "+o.BadFrame)
	}
	return strings.Join(parts, "; ")
}

// Judge checks one run. strict applies the talaris-only expectations (Err
// sentinels, exact close code). It returns "" for a pass, else why not.
func Judge(c *Case, o *Obs, r *Result, strict bool) string {
	w := &c.Want
	if o == nil {
		return "the server saw no connection"
	}
	if o.BadFrame != "" && (w.Kind != NoOpen || r.Opened) {
		// (A client that refused the upgrade may reuse the TCP
		// connection for another HTTP request: those bytes are not frames.)
		return "client sent an invalid frame: " + o.BadFrame
	}
	if o.AfterClose > 0 {
		return "client sent frames after its close frame"
	}
	if w.Kind == NoOpen {
		switch {
		case r.Opened:
			return "the handshake was accepted"
		case len(o.Msgs) > 0 || o.CloseCode != 0:
			return "client sent frames"
		case strict && !errors.Is(r.DialErr, w.Err):
			return fmt.Sprintf("dial error %v, want %s", r.DialErr, sentinelNames[w.Err])
		}
		return check(c, o, r)
	}
	if !r.Opened {
		return "not opened: " + errName(r.DialErr)
	}
	exact := w.Kind == Echo && !w.Prefix
	if why := matchMsgs(w.Msgs, o.Msgs, exact); why != "" {
		return why
	}
	if !w.AnyPongs {
		if why := matchPongs(w.Pongs, o.Pongs, w.Kind == Echo); why != "" {
			return why
		}
	}
	codes := []int{w.Code}
	if w.Kind == Echo && w.Code == 0 {
		codes = []int{1000}
	}
	if !strict {
		codes = append(codes, w.Alt...)
	}
	switch w.Kind {
	case Echo, Fail:
		if !slices.Contains(codes, o.CloseCode) {
			if o.CloseCode == 0 {
				return fmt.Sprintf("no close frame (want %d)", codes[0])
			}
			return fmt.Sprintf("close %d, want %d", o.CloseCode, codes[0])
		}
	case Lost:
		if o.CloseCode != 0 && o.CloseCode != 1000 && o.CloseCode != 1006 {
			// A client may still try to send a close; the socket is gone.
			return fmt.Sprintf("close %d after the connection was lost", o.CloseCode)
		}
	}
	if strict {
		switch {
		case w.Kind == Echo && w.Err == nil && r.Err != nil:
			return "final event is an error: " + errName(r.Err)
		case w.Err != nil && !errors.Is(r.Err, w.Err):
			return fmt.Sprintf("final error %s, want %s", errName(r.Err), sentinelNames[w.Err])
		case w.Kind != Echo && r.Code != w.Code:
			return fmt.Sprintf("final event code %d, want %d", r.Code, w.Code)
		}
	}
	return check(c, o, r)
}

func check(c *Case, o *Obs, r *Result) string {
	if c.Want.Check != nil {
		return c.Want.Check(o, r)
	}
	return ""
}

func matchMsgs(want, got []Frame, exact bool) string {
	if len(got) > len(want) || exact && len(got) < len(want) {
		return fmt.Sprintf("echoed %d messages, want %d", len(got), len(want))
	}
	for i, g := range got {
		if g.Op != want[i].Op || !bytes.Equal(g.Payload, want[i].Payload) {
			return fmt.Sprintf("echo %d differs (%s, %d bytes; want %s, %d bytes)", i, g.Op, len(g.Payload), want[i].Op, len(want[i].Payload))
		}
	}
	return ""
}

func matchPongs(want, got [][]byte, exact bool) string {
	if len(got) > len(want) || exact && len(got) < len(want) {
		return fmt.Sprintf("%d pongs, want %d", len(got), len(want))
	}
	for i, g := range got {
		if !bytes.Equal(g, want[i]) {
			return fmt.Sprintf("pong %d payload %q, want %q", i, trunc(g), trunc(want[i]))
		}
	}
	return ""
}

func trunc(b []byte) string {
	if len(b) > 20 {
		return string(b[:20]) + "..."
	}
	return string(b)
}
