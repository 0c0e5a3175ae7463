package conformance

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/ws"
)

// Kind is the kind of outcome a case expects.
type Kind int

const (
	// Echo: the client stays up, echoes every data message (and answers
	// every ping) and completes the close handshake.
	Echo Kind = iota
	// Fail: the client fails the connection with a close frame carrying
	// Want.Code.
	Fail
	// NoOpen: the client refuses the opening handshake and never sends a
	// frame.
	NoOpen
	// Lost: the server drops TCP; the client reports the connection lost
	// (it cannot send a close frame any more).
	Lost
)

// Want is a case's expected client behaviour.
type Want struct {
	Kind Kind
	// Msgs are the data messages the client must echo, in order. For Fail
	// and Lost (and Echo with Prefix) the echoes must be a prefix of Msgs:
	// messages sent in the same write as the violation may be dropped.
	Msgs   []Frame
	Prefix bool
	// Pongs are the pong payloads the client must send, in order (Fail
	// and Lost: a prefix).
	Pongs [][]byte
	// AnyPongs skips the pong comparison (Check counts them instead).
	AnyPongs bool
	// Code is the close code the server must see in the client's close
	// frame (Echo: 0 means 1000). Alt lists codes also accepted from the
	// comparison clients; talaris must send Code.
	Code int
	Alt  []int
	// Err is the talaris sentinel the final EventError (or Dial error for
	// NoOpen) must match; nil for Echo means a clean EventClose.
	Err error
	// Check, if set, adds a case-specific verdict: it returns "" when
	// the observations are right, else what is wrong.
	Check func(o *Obs, r *Result) string
}

// Opts adjusts the client for one case.
type Opts struct {
	HandshakeTimeout time.Duration // 0: the adapter's default
	CloseAfter       int           // >0: the client starts the close after echoing this many messages
	CloseDelay       time.Duration // ... this long after that echo (from another goroutine for talaris)
	Slow             bool          // the consumer sleeps while handling events
	Subprotocols     []string
	Talaris          func(*talaris.Config) // extra talaris pool settings
}

// Case is one conformance case: what the server does and what the client
// must do about it.
type Case struct {
	ID     string
	Sends  string // what the server sends
	Policy string // a documented, deliberate choice this case checks
	// Response replaces the standard 101 head ("{accept}" is substituted).
	Response string
	// First is written in the same write as the response head.
	First []byte
	// Handshake, if set, replaces the whole server side (the response
	// and everything after).
	Handshake func(s *Sess)
	// Script runs after the response; then the server finishes per Want.
	Script func(s *Sess)
	Want   Want
	Opts   Opts
	Heavy  bool // big payloads: skipped under -race and -short
	// NoTLS, if set, says why the case is not run over wss://.
	NoTLS string
}

// ---- frame builders ----

func frame(fin bool, op ws.Opcode, p []byte) []byte { return ws.AppendFrame(nil, fin, op, p) }
func text(s string) []byte                          { return frame(true, ws.OpText, []byte(s)) }
func binMsg(p []byte) []byte                        { return frame(true, ws.OpBinary, p) }
func ping(p string) []byte                          { return frame(true, ws.OpPing, []byte(p)) }

func rsv(r uint8, op ws.Opcode, p []byte) []byte {
	b := ws.AppendHeader(nil, ws.Header{Fin: true, Rsv: r, Op: op, Length: uint64(len(p))})
	return append(b, p...)
}

func withLen(op ws.Opcode, lenBytes int, length uint64, p []byte) []byte {
	return append(ws.AppendHeaderLen(nil, ws.Header{Fin: true, Op: op, Length: length}, lenBytes), p...)
}

func closeFrame(p []byte) []byte { return frame(true, ws.OpClose, p) }

func cat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

func tm(s string) Frame { return Frame{ws.OpText, []byte(s)} }
func bm(p []byte) Frame { return Frame{ws.OpBinary, p} }
func tb(p []byte) Frame { return Frame{ws.OpText, p} }
func pl(ps ...string) [][]byte {
	out := make([][]byte, len(ps))
	for i, p := range ps {
		out[i] = []byte(p)
	}
	return out
}

// Shared big payloads, sliced by the cases (read-only).
var (
	bigText = bytes.Repeat([]byte("*"), 16<<20)
	bigBin  = func() []byte {
		b := make([]byte, 16<<20)
		for i := range b {
			b[i] = byte(i*7 + i>>8)
		}
		return b
	}()
)

// fragments splits p into frames of size n (the first with op).
func fragments(op ws.Opcode, p []byte, n int) []byte {
	var out []byte
	first := true
	for first || len(p) > 0 {
		k := min(n, len(p))
		o := ws.OpContinuation
		if first {
			o = op
		}
		out = ws.AppendFrame(out, k == len(p), o, p[:k])
		p = p[k:]
		first = false
	}
	return out
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// resp builds a response head from lines ("{accept}" substituted later).
func resp(lines ...string) string { return strings.Join(lines, "\r\n") + "\r\n\r\n" }

const (
	st101  = "HTTP/1.1 101 Switching Protocols"
	upWS   = "Upgrade: websocket"
	connUp = "Connection: Upgrade"
	accH   = "Sec-WebSocket-Accept: {accept}"
)

// Cases returns every case, in report order.
func Cases() []*Case {
	var cs []*Case
	add := func(c *Case) { cs = append(cs, c) }

	// ---- 1: framing ----
	for i, n := range []int{0, 125, 126, 127, 128, 65535, 65536} {
		p := bigText[:n]
		add(&Case{ID: fmt.Sprintf("1.1.%d", i+1), Sends: fmt.Sprintf("text message of %d bytes", n),
			Script: func(s *Sess) { s.Send(frame(true, ws.OpText, p)) }, Want: Want{Msgs: []Frame{tb(p)}}})
	}
	add(&Case{ID: "1.1.8", Sends: "text message of 65536 bytes written in 997-byte TCP chops",
		Script: func(s *Sess) { s.SendChopped(frame(true, ws.OpText, bigText[:65536]), 997, 0) },
		Want:   Want{Msgs: []Frame{tb(bigText[:65536])}}})
	for i, n := range []int{0, 125, 126, 127, 128, 65535, 65536} {
		p := bigBin[:n]
		add(&Case{ID: fmt.Sprintf("1.2.%d", i+1), Sends: fmt.Sprintf("binary message of %d bytes", n),
			Script: func(s *Sess) { s.Send(binMsg(p)) }, Want: Want{Msgs: []Frame{bm(p)}}})
	}
	add(&Case{ID: "1.2.8", Sends: "binary message of 65536 bytes written in 997-byte TCP chops",
		Script: func(s *Sess) { s.SendChopped(binMsg(bigBin[:65536]), 997, 0) },
		Want:   Want{Msgs: []Frame{bm(bigBin[:65536])}}})
	add(&Case{ID: "1.3.1", Sends: "text message of 20 bytes written 1 byte per TCP write",
		Script: func(s *Sess) { s.SendChopped(text("chopped-into-bytes!!"), 1, time.Millisecond) },
		Want:   Want{Msgs: []Frame{tm("chopped-into-bytes!!")}}})
	add(&Case{ID: "1.3.2", Sends: "binary message of 300 bytes (16-bit length) written 1 byte per TCP write",
		Script: func(s *Sess) { s.SendChopped(binMsg(bigBin[:300]), 1, 0) },
		Want:   Want{Msgs: []Frame{bm(bigBin[:300])}}})

	// ---- 2: ping/pong ----
	p125 := strings.Repeat("\xfe", 125)
	add(&Case{ID: "2.1", Sends: "ping without payload", Script: func(s *Sess) { s.Send(ping("")) },
		Want: Want{Pongs: pl("")}})
	add(&Case{ID: "2.2", Sends: "ping with a short text payload", Script: func(s *Sess) { s.Send(ping("Hello, world!")) },
		Want: Want{Pongs: pl("Hello, world!")}})
	add(&Case{ID: "2.3", Sends: "ping with a short binary payload",
		Script: func(s *Sess) { s.Send(ping("\x00\xff\xfe\xfd\xfc\xfb\x00\xff")) },
		Want:   Want{Pongs: pl("\x00\xff\xfe\xfd\xfc\xfb\x00\xff")}})
	add(&Case{ID: "2.4", Sends: "ping with a 125-byte payload", Script: func(s *Sess) { s.Send(ping(p125)) },
		Want: Want{Pongs: pl(p125)}})
	add(&Case{ID: "2.5", Sends: "ping with a 126-byte payload (16-bit length)",
		Script: func(s *Sess) { s.Send(frame(true, ws.OpPing, []byte(p125+"x"))) },
		Want:   Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	add(&Case{ID: "2.6", Sends: "ping with a 125-byte payload written 1 byte per TCP write",
		Script: func(s *Sess) { s.SendChopped(ping(p125), 1, 0) }, Want: Want{Pongs: pl(p125)}})
	add(&Case{ID: "2.7", Sends: "unsolicited pong without payload", Script: func(s *Sess) { s.Send(frame(true, ws.OpPong, nil)) },
		Want: Want{}})
	add(&Case{ID: "2.8", Sends: "unsolicited pong with payload",
		Script: func(s *Sess) { s.Send(frame(true, ws.OpPong, []byte("unsolicited pong payload"))) }, Want: Want{}})
	add(&Case{ID: "2.9", Sends: "unsolicited pong, then ping \"ping payload\"",
		Script: func(s *Sess) { s.Send(frame(true, ws.OpPong, []byte("unsolicited")), ping("ping payload")) },
		Want:   Want{Pongs: pl("ping payload")}})
	tenPings := func() ([][]byte, [][]byte) {
		var fs, ps [][]byte
		for i := range 10 {
			p := fmt.Sprintf("payload-%d", i)
			fs = append(fs, ping(p))
			ps = append(ps, []byte(p))
		}
		return fs, ps
	}
	pf, pp := tenPings()
	add(&Case{ID: "2.10", Sends: "10 pings in one write", Policy: "every ping is answered (RFC allows answering only the last)",
		Script: func(s *Sess) { s.Send(pf...) }, Want: Want{Pongs: pp}})
	add(&Case{ID: "2.11", Sends: "10 pings, one TCP write each", Policy: "every ping is answered",
		Script: func(s *Sess) { s.SendFrames(pf...) }, Want: Want{Pongs: pp}})

	// ---- 3: reserved bits ----
	add(&Case{ID: "3.1", Sends: "text with RSV1 set", Script: func(s *Sess) { s.Send(rsv(4, ws.OpText, []byte("Hello"))) },
		Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	add(&Case{ID: "3.2", Sends: "text \"Hello\"; after its echo, text with RSV2 and a ping",
		Script: func(s *Sess) {
			s.Send(text("Hello"))
			s.WaitMsgs(1, guardShort)
			s.Send(rsv(2, ws.OpText, []byte("Hello")), ping(""))
		},
		Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol, Msgs: []Frame{tm("Hello")}}})
	add(&Case{ID: "3.3", Sends: "text \"Hello\", text with RSV3, ping: one write",
		Script: func(s *Sess) { s.Send(text("Hello"), rsv(1, ws.OpText, []byte("Hello")), ping("")) },
		Want:   Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol, Msgs: []Frame{tm("Hello")}}})
	add(&Case{ID: "3.4", Sends: "text \"Hello\", text with RSV1+RSV3, ping: 1 byte per TCP write",
		Script: func(s *Sess) {
			s.SendChopped(cat(text("Hello"), rsv(5, ws.OpText, []byte("Hello")), ping("")), 1, 0)
		},
		Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol, Msgs: []Frame{tm("Hello")}}})
	add(&Case{ID: "3.5", Sends: "binary with RSV1+RSV2", Script: func(s *Sess) { s.Send(rsv(6, ws.OpBinary, bigBin[:8])) },
		Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	add(&Case{ID: "3.6", Sends: "ping with RSV2+RSV3", Script: func(s *Sess) { s.Send(rsv(3, ws.OpPing, []byte("p"))) },
		Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	add(&Case{ID: "3.7", Sends: "close 1000 with all RSV bits set",
		Script: func(s *Sess) { s.Send(rsv(7, ws.OpClose, ws.ClosePayload(1000, ""))) },
		Want:   Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})

	// ---- 4: opcodes ----
	for i, op := range []ws.Opcode{3, 4, 5, 6, 7} {
		add(opcodeCase(fmt.Sprintf("4.1.%d", i+1), op, i))
	}
	for i, op := range []ws.Opcode{0xB, 0xC, 0xD, 0xE, 0xF} {
		add(opcodeCase(fmt.Sprintf("4.2.%d", i+1), op, i))
	}

	// ---- 5: fragmentation ----
	f1 := frame(false, ws.OpText, []byte("fragment1"))
	f2 := frame(true, ws.OpContinuation, []byte("fragment2"))
	add(&Case{ID: "5.1", Sends: "ping in 2 fragments",
		Script: func(s *Sess) {
			s.Send(frame(false, ws.OpPing, []byte("fragment1")), frame(true, ws.OpContinuation, []byte("fragment2")))
		},
		Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	add(&Case{ID: "5.2", Sends: "pong in 2 fragments",
		Script: func(s *Sess) {
			s.Send(frame(false, ws.OpPong, []byte("fragment1")), frame(true, ws.OpContinuation, []byte("fragment2")))
		},
		Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	ff := []Frame{tm("fragment1fragment2")}
	add(&Case{ID: "5.3", Sends: "text in 2 fragments, one write", Script: func(s *Sess) { s.Send(f1, f2) }, Want: Want{Msgs: ff}})
	add(&Case{ID: "5.4", Sends: "text in 2 fragments, one TCP write each", Script: func(s *Sess) { s.SendFrames(f1, f2) }, Want: Want{Msgs: ff}})
	add(&Case{ID: "5.5", Sends: "text in 2 fragments, 1 byte per TCP write", Script: func(s *Sess) { s.SendChopped(cat(f1, f2), 1, 0) }, Want: Want{Msgs: ff}})
	pg := ping("ping payload")
	add(&Case{ID: "5.6", Sends: "text fragment, ping, final fragment: one write", Script: func(s *Sess) { s.Send(f1, pg, f2) },
		Want: Want{Msgs: ff, Pongs: pl("ping payload")}})
	add(&Case{ID: "5.7", Sends: "text fragment, ping, final fragment: one TCP write each", Script: func(s *Sess) { s.SendFrames(f1, pg, f2) },
		Want: Want{Msgs: ff, Pongs: pl("ping payload")}})
	add(&Case{ID: "5.8", Sends: "text fragment, ping, final fragment: 1 byte per TCP write",
		Script: func(s *Sess) { s.SendChopped(cat(f1, pg, f2), 1, 0) }, Want: Want{Msgs: ff, Pongs: pl("ping payload")}})
	strayFin := frame(true, ws.OpContinuation, []byte("non-continuation payload"))
	strayNF := frame(false, ws.OpContinuation, []byte("non-continuation payload"))
	hello := text("Hello, world!")
	for i, v := range []struct {
		stray []byte
		how   string
	}{{strayFin, "FIN"}, {strayNF, "no FIN"}} {
		base := 9 + 3*i
		add(&Case{ID: fmt.Sprintf("5.%d", base), Sends: "continuation (" + v.how + ") without a message, then text: one write",
			Script: func(s *Sess) { s.Send(v.stray, hello) }, Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
		add(&Case{ID: fmt.Sprintf("5.%d", base+1), Sends: "continuation (" + v.how + ") without a message, then text: one TCP write each",
			Script: func(s *Sess) { s.SendFrames(v.stray, hello) }, Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
		add(&Case{ID: fmt.Sprintf("5.%d", base+2), Sends: "continuation (" + v.how + ") without a message, then text: 1 byte per TCP write",
			Script: func(s *Sess) { s.SendChopped(cat(v.stray, hello), 1, 0) }, Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	}
	add(&Case{ID: "5.15", Sends: "text(fragment1, fragment2 FIN), continuation fragment3, text fragment4 FIN",
		Script: func(s *Sess) {
			s.Send(f1, f2, frame(false, ws.OpContinuation, []byte("fragment3")), frame(true, ws.OpText, []byte("fragment4")))
		},
		Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol, Msgs: ff}})
	add(&Case{ID: "5.16", Sends: "stray continuation pair, then a valid 2-fragment text, twice",
		Script: func(s *Sess) {
			seq := cat(frame(false, ws.OpContinuation, []byte("fragment1")), frame(true, ws.OpContinuation, []byte("fragment2")), f1, f2)
			s.Send(seq, seq)
		},
		Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	add(&Case{ID: "5.17", Sends: "two stray FIN continuations, then a valid 2-fragment text",
		Script: func(s *Sess) {
			s.Send(frame(true, ws.OpContinuation, []byte("fragment1")), frame(true, ws.OpContinuation, []byte("fragment2")), f1, f2)
		},
		Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	add(&Case{ID: "5.18", Sends: "text fragment (no FIN), then a new text frame instead of a continuation",
		Script: func(s *Sess) { s.Send(f1, frame(true, ws.OpText, []byte("fragment2"))) },
		Want:   Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	five := func(s *Sess, waitPong bool) {
		frs := [][]byte{
			frame(false, ws.OpText, []byte("fragment1")), frame(false, ws.OpContinuation, []byte("fragment2")),
			ping("pongme 1!"),
			frame(false, ws.OpContinuation, []byte("fragment3")), frame(false, ws.OpContinuation, []byte("fragment4")),
			ping("pongme 2!"),
			frame(true, ws.OpContinuation, []byte("fragment5")),
		}
		pongs := 0
		for _, f := range frs {
			s.Send(f)
			if f[0]&0xF == byte(ws.OpPing) {
				pongs++
				if waitPong {
					s.WaitPongs(pongs, guardShort)
				}
			} else {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	ff5 := []Frame{tm("fragment1fragment2fragment3fragment4fragment5")}
	add(&Case{ID: "5.19", Sends: "text in 5 fragments with pings after the 2nd and 4th, written over time",
		Script: func(s *Sess) { five(s, false) }, Want: Want{Msgs: ff5, Pongs: pl("pongme 1!", "pongme 2!")}})
	add(&Case{ID: "5.20", Sends: "as 5.19, each ping's pong awaited before the next fragment (pong mid-message)",
		Script: func(s *Sess) { five(s, true) }, Want: Want{Msgs: ff5, Pongs: pl("pongme 1!", "pongme 2!")}})

	// ---- 6: UTF-8 ----
	add(&Case{ID: "6.1.1", Sends: "empty text message", Script: func(s *Sess) { s.Send(text("")) }, Want: Want{Msgs: []Frame{tm("")}}})
	add(&Case{ID: "6.1.2", Sends: "text in 3 empty fragments",
		Script: func(s *Sess) {
			s.Send(frame(false, ws.OpText, nil), frame(false, ws.OpContinuation, nil), frame(true, ws.OpContinuation, nil))
		},
		Want: Want{Msgs: []Frame{tm("")}}})
	add(&Case{ID: "6.1.3", Sends: "text: empty fragment, \"middle frame payload\", empty final fragment",
		Script: func(s *Sess) {
			s.Send(frame(false, ws.OpText, nil), frame(false, ws.OpContinuation, []byte("middle frame payload")), frame(true, ws.OpContinuation, nil))
		},
		Want: Want{Msgs: []Frame{tm("middle frame payload")}}})
	hu := "Hello-µ@ßöäüàá-UTF-8!!"
	add(&Case{ID: "6.2.1", Sends: "valid multi-byte UTF-8 text, one frame", Script: func(s *Sess) { s.Send(text(hu)) },
		Want: Want{Msgs: []Frame{tm(hu)}}})
	add(&Case{ID: "6.2.2", Sends: "the same text in 2 fragments split between code points",
		Script: func(s *Sess) {
			s.Send(frame(false, ws.OpText, []byte(hu[:8])), frame(true, ws.OpContinuation, []byte(hu[8:])))
		},
		Want: Want{Msgs: []Frame{tm(hu)}}})
	add(&Case{ID: "6.2.3", Sends: "the same text, 1 byte per TCP write", Script: func(s *Sess) { s.SendChopped(text(hu), 1, 0) },
		Want: Want{Msgs: []Frame{tm(hu)}}})
	kosme := "κόσμε"
	add(&Case{ID: "6.2.4", Sends: "\"κόσμε\" in 1-byte fragments (code points split across frames)",
		Script: func(s *Sess) { s.Send(fragments(ws.OpText, []byte(kosme), 1)) }, Want: Want{Msgs: []Frame{tm(kosme)}}})
	bad := kosme + "\xed\xa0\x80" + "edited"
	add(&Case{ID: "6.3.1", Sends: "text with a surrogate (ED A0 80) in one frame", Script: func(s *Sess) { s.Send(text(bad)) },
		Want: Want{Kind: Fail, Code: 1007, Err: talaris.ErrInvalidUTF8}})
	add(&Case{ID: "6.3.2", Sends: "the same text in 1-byte fragments",
		Script: func(s *Sess) { s.Send(fragments(ws.OpText, []byte(bad), 1)) },
		Want:   Want{Kind: Fail, Code: 1007, Err: talaris.ErrInvalidUTF8}})
	failFast := func(first, rest []byte) func(s *Sess) {
		return func(s *Sess) {
			s.Send(first)
			if s.WaitClose(guardShort) {
				s.Note("failed before the rest was sent")
			} else {
				s.Send(rest)
			}
		}
	}
	ffCheck := func(o *Obs, r *Result) string {
		for _, n := range o.Notes {
			if n == "failed before the rest was sent" {
				return ""
			}
		}
		return "did not fail fast"
	}
	add(&Case{ID: "6.4.1", Sends: "text fragment ending in F4 90 80 80 (above U+10FFFF); rest sent only if the client has not failed",
		Policy: "fail fast at the bad fragment",
		Script: failFast(frame(false, ws.OpText, []byte(kosme+"\xf4\x90\x80\x80")), frame(true, ws.OpContinuation, []byte("edited"))),
		Want:   Want{Kind: Fail, Code: 1007, Err: talaris.ErrInvalidUTF8, Check: ffCheck}})
	add(&Case{ID: "6.4.2", Sends: "fragment \"κόσμε\"+F4, fragment 90 80 80 (the bad byte starts it), then the rest only if still up",
		Policy: "fail fast inside a code point",
		Script: func(s *Sess) {
			s.Send(frame(false, ws.OpText, []byte(kosme+"\xf4")))
			failFast(frame(false, ws.OpContinuation, []byte("\x90\x80\x80")), frame(true, ws.OpContinuation, []byte("edited")))(s)
		},
		Want: Want{Kind: Fail, Code: 1007, Err: talaris.ErrInvalidUTF8, Check: ffCheck}})
	{
		p := []byte(kosme + "\xf4\x90\x80\x80" + "edited")
		h := ws.AppendHeader(nil, ws.Header{Fin: true, Op: ws.OpText, Length: uint64(len(p))})
		add(&Case{ID: "6.4.3", Sends: "one text frame whose first part holds F4 90; the rest of its payload only if still up",
			Policy: "fail fast inside a single frame",
			Script: failFast(cat(h, p[:len(kosme)+2]), p[len(kosme)+2:]),
			Want:   Want{Kind: Fail, Code: 1007, Err: talaris.ErrInvalidUTF8, Check: ffCheck}})
	}
	points := []string{"\u007f", "\u0080", "\u07ff", "\u0800", "\ud7ff", "\ue000", "\ufeff", "\ufffd", "\ufffe", "\uffff", "\U00010000", "\U0010ffff"}
	{
		var frs [][]byte
		var frs1 []byte
		var want []Frame
		for _, p := range points {
			frs = append(frs, text(p))
			frs1 = append(frs1, fragments(ws.OpText, []byte(p), 1)...)
			want = append(want, tm(p))
		}
		add(&Case{ID: "6.5.1", Sends: "12 messages, each one boundary code point (U+007F .. U+10FFFF, U+FFFE, U+FEFF)",
			Script: func(s *Sess) { s.Send(frs...) }, Want: Want{Msgs: want}})
		add(&Case{ID: "6.5.2", Sends: "the same 12 messages, each in 1-byte fragments",
			Script: func(s *Sess) { s.Send(frs1) }, Want: Want{Msgs: want}})
	}
	invalid := []struct{ what, b string }{
		{"lone continuation byte 80", "\x80"},
		{"continuation run 80 BF 80", "\x80\xbf\x80"},
		{"overlong 2-byte C0 AF", "\xc0\xaf"},
		{"overlong 2-byte C1 BF", "\xc1\xbf"},
		{"overlong 3-byte E0 80 AF", "\xe0\x80\xaf"},
		{"overlong 4-byte F0 80 80 AF", "\xf0\x80\x80\xaf"},
		{"high surrogate ED A0 80", "\xed\xa0\x80"},
		{"low surrogate ED BF BF", "\xed\xbf\xbf"},
		{"surrogate pair (CESU-8) ED A0 BD ED B2 A9", "\xed\xa0\xbd\xed\xb2\xa9"},
		{"above U+10FFFF: F4 90 80 80", "\xf4\x90\x80\x80"},
		{"lead byte F5", "\xf5\x80\x80\x80"},
		{"5-byte form F8 88 80 80 80", "\xf8\x88\x80\x80\x80"},
		{"6-byte form FC 84 80 80 80 80", "\xfc\x84\x80\x80\x80\x80"},
		{"byte FE", "\xfe"},
		{"byte FF", "\xff"},
		{"lead byte followed by ASCII C3 41", "\xc3\x41"},
		{"truncated 2-byte sequence at the end: C3", "\xc3"},
		{"truncated 3-byte sequence at the end: E2 82", "\xe2\x82"},
		{"truncated 4-byte sequence at the end: F0 9F 98", "\xf0\x9f\x98"},
	}
	for i, v := range invalid {
		p := []byte("ok " + v.b)
		if !strings.HasPrefix(v.what, "truncated") {
			p = append(p, " tail"...)
		}
		add(&Case{ID: fmt.Sprintf("6.6.%d", i+1), Sends: "text with " + v.what,
			Script: func(s *Sess) { s.Send(frame(true, ws.OpText, p)) },
			Want:   Want{Kind: Fail, Code: 1007, Err: talaris.ErrInvalidUTF8}})
	}
	add(&Case{ID: "6.6.20", Sends: "text in 2 fragments whose final fragment ends inside a code point (E2 82)",
		Script: func(s *Sess) {
			s.Send(frame(false, ws.OpText, []byte("abc")), frame(true, ws.OpContinuation, []byte("def\xe2\x82")))
		},
		Want: Want{Kind: Fail, Code: 1007, Err: talaris.ErrInvalidUTF8}})
	add(&Case{ID: "6.6.21", Sends: "valid text, then a fragmented text with a ping between fragments and C0 80 in the 2nd",
		Script: func(s *Sess) {
			s.Send(text("fine"), frame(false, ws.OpText, []byte("abc")), ping("p"), frame(true, ws.OpContinuation, []byte("\xc0\x80")))
		},
		Want: Want{Kind: Fail, Code: 1007, Err: talaris.ErrInvalidUTF8, Msgs: []Frame{tm("fine")}, Pongs: pl("p")}})

	// ---- 7: close ----
	add(&Case{ID: "7.1.1", Sends: "text \"Hello World\", then close 1000 after the echo",
		Script: func(s *Sess) { s.Send(text("Hello World")) }, Want: Want{Msgs: []Frame{tm("Hello World")}}})
	add(&Case{ID: "7.1.2", Sends: "close 1000 twice", Script: func(s *Sess) { s.SendClose(1000, ""); s.SendClose(1000, "") },
		Want: Want{Check: func(o *Obs, r *Result) string {
			if o.Closes != 1 {
				return fmt.Sprintf("%d close frames", o.Closes)
			}
			return ""
		}}})
	add(&Case{ID: "7.1.3", Sends: "close 1000, then ping", Script: func(s *Sess) { s.SendClose(1000, ""); s.Send(ping("after close")) },
		Want: Want{}})
	add(&Case{ID: "7.1.4", Sends: "close 1000, then text", Script: func(s *Sess) { s.SendClose(1000, ""); s.Send(text("after close")) },
		Want: Want{}})
	add(&Case{ID: "7.1.5", Sends: "text fragment, close 1000, final fragment",
		Script: func(s *Sess) { s.Send(f1); s.SendClose(1000, ""); s.Send(f2) }, Want: Want{}})
	add(&Case{ID: "7.1.6", Sends: "256 KiB text, close 1000, ping: one write", Policy: "echo of the text may race the close",
		Script: func(s *Sess) {
			s.Send(frame(true, ws.OpText, bigText[:256<<10]), closeFrame(ws.ClosePayload(1000, "")), ping("after close"))
			s.MarkClosed()
		},
		Want: Want{Msgs: []Frame{tb(bigText[:256<<10])}, Prefix: true}})
	add(&Case{ID: "7.3.1", Sends: "close with an empty body", Script: func(s *Sess) { s.Send(closeFrame(nil)); s.MarkClosed() },
		Want: Want{Code: 1005, Alt: []int{1000}}})
	add(&Case{ID: "7.3.2", Sends: "close with a 1-byte body", Script: func(s *Sess) { s.Send(closeFrame([]byte{0x03})) },
		Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	add(&Case{ID: "7.3.3", Sends: "close 1000 without reason", Script: func(s *Sess) { s.SendClose(1000, "") }, Want: Want{}})
	add(&Case{ID: "7.3.4", Sends: "close 1000 \"Hello World!\"", Script: func(s *Sess) { s.SendClose(1000, "Hello World!") }, Want: Want{}})
	r123 := strings.Repeat("*", 123)
	add(&Case{ID: "7.3.5", Sends: "close 1000 with a 123-byte reason (125-byte body)", Script: func(s *Sess) { s.SendClose(1000, r123) },
		Want: Want{}})
	add(&Case{ID: "7.3.6", Sends: "close 1000 with a 124-byte reason (126-byte body)",
		Script: func(s *Sess) { s.Send(closeFrame(ws.ClosePayload(1000, r123+"*"))) },
		Want:   Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	add(&Case{ID: "7.5.1", Sends: "close 1000 whose reason is invalid UTF-8",
		Script: func(s *Sess) { s.Send(closeFrame(ws.ClosePayload(1000, bad))) },
		Want:   Want{Kind: Fail, Code: 1007, Alt: []int{1002}, Err: talaris.ErrInvalidUTF8}})
	for i, code := range []int{1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999, 4000, 4999} {
		add(&Case{ID: fmt.Sprintf("7.7.%d", i+1), Sends: fmt.Sprintf("close %d (valid)", code),
			Policy: "the received code is echoed",
			Script: func(s *Sess) { s.SendClose(code, "") }, Want: Want{Code: code, Alt: []int{1000}}})
	}
	for i, code := range []int{0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535} {
		body := binary.BigEndian.AppendUint16(nil, uint16(code))
		add(&Case{ID: fmt.Sprintf("7.9.%d", i+1), Sends: fmt.Sprintf("close %d (invalid on the wire)", code),
			Script: func(s *Sess) { s.Send(closeFrame(body)) }, Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	}

	// ---- 9: big messages ----
	sizes := []int{64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20}
	for ti, op := range []ws.Opcode{ws.OpText, ws.OpBinary} {
		src := bigText
		if op == ws.OpBinary {
			src = bigBin
		}
		for i, n := range sizes {
			p := src[:n]
			add(&Case{ID: fmt.Sprintf("9.%d.%d", 1+ti, i+1), Sends: fmt.Sprintf("%s message of %s in one frame", op, sizeName(n)),
				Script: func(s *Sess) { s.Send(frame(true, op, p)) }, Want: Want{Msgs: []Frame{{op, p}}}, Heavy: true})
		}
		for i, fs := range []int{64, 4 << 10, 64 << 10, 1 << 20} {
			p := src[:4<<20]
			add(&Case{ID: fmt.Sprintf("9.%d.%d", 3+ti, i+1), Sends: fmt.Sprintf("%s message of 4 MiB in %s fragments", op, sizeName(fs)),
				Script: func(s *Sess) { s.Send(fragments(op, p, fs)) }, Want: Want{Msgs: []Frame{{op, p}}}, Heavy: true})
		}
		for i, ch := range []int{64, 1 << 10, 16 << 10} {
			p := src[:1<<20]
			add(&Case{ID: fmt.Sprintf("9.%d.%d", 5+ti, i+1), Sends: fmt.Sprintf("%s message of 1 MiB written in %s TCP chops", op, sizeName(ch)),
				Script: func(s *Sess) { s.SendChopped(frame(true, op, p), ch, 0) }, Want: Want{Msgs: []Frame{{op, p}}}, Heavy: true})
		}
	}

	// ---- 10: automatic fragmentation ----
	add(&Case{ID: "10.1.1", Sends: "text message of 65536 bytes in 1300-byte fragments",
		Script: func(s *Sess) { s.Send(fragments(ws.OpText, bigText[:65536], 1300)) },
		Want:   Want{Msgs: []Frame{tb(bigText[:65536])}}})

	cs = append(cs, handshakeCases()...)
	cs = append(cs, beyondCases()...)
	return cs
}

func opcodeCase(id string, op ws.Opcode, variant int) *Case {
	switch variant {
	case 0:
		return &Case{ID: id, Sends: fmt.Sprintf("frame with reserved opcode %#x, no payload", uint8(op)),
			Script: func(s *Sess) { s.Send(frame(true, op, nil)) }, Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}}
	case 1:
		return &Case{ID: id, Sends: fmt.Sprintf("frame with reserved opcode %#x and a payload", uint8(op)),
			Script: func(s *Sess) { s.Send(frame(true, op, []byte("reserved opcode payload"))) },
			Want:   Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}}
	}
	seq := [][]byte{text("Hello"), frame(true, op, []byte("reserved")), ping("")}
	how, send := "one write", func(s *Sess) { s.Send(seq...) }
	if variant == 4 {
		how, send = "one TCP write each", func(s *Sess) { s.SendFrames(seq...) }
	}
	return &Case{ID: id, Sends: fmt.Sprintf("text \"Hello\", reserved opcode %#x, ping: %s", uint8(op), how),
		Script: send, Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol, Msgs: []Frame{tm("Hello")}}}
}

func subprotoCheck(want string) func(o *Obs, r *Result) string {
	return func(o *Obs, r *Result) string {
		if r.Subprotocol != want {
			return fmt.Sprintf("subprotocol %q, want %q", r.Subprotocol, want)
		}
		return ""
	}
}

func handshakeCases() []*Case {
	var cs []*Case
	add := func(c *Case) { cs = append(cs, c) }
	hello := func(s *Sess) { s.Send(text("hello")) }
	helloW := []Frame{tm("hello")}

	add(&Case{ID: "H.1", Sends: "101 and a text frame in the same TCP write", First: text("first"),
		Want: Want{Msgs: []Frame{tm("first")}}})
	add(&Case{ID: "H.2", Sends: "101, text, ping, text, half a frame in one write; the rest later",
		First: cat(text("first"), ping("p"), text("second"), text("third")[:4]),
		Script: func(s *Sess) {
			time.Sleep(10 * time.Millisecond)
			s.Send(text("third")[4:])
		},
		Want: Want{Msgs: []Frame{tm("first"), tm("second"), tm("third")}, Pongs: pl("p")}})
	for i, st := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 0",
		"HTTP/1.1 301 Moved Permanently\r\nLocation: /elsewhere\r\nContent-Length: 0",
		"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"x\"\r\nContent-Length: 0",
		"HTTP/1.1 426 Upgrade Required\r\nSec-WebSocket-Version: 13\r\nContent-Length: 0",
	} {
		add(&Case{ID: fmt.Sprintf("H.%d", 3+i), Sends: "status " + st[9:12] + " (redirects are not followed)", Response: st + "\r\n\r\n",
			Want: Want{Kind: NoOpen, Err: talaris.ErrBadStatus}})
	}
	add(&Case{ID: "H.7", Sends: "101 with a wrong Sec-WebSocket-Accept",
		Response: resp(st101, upWS, connUp, "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
		Want:     Want{Kind: NoOpen, Err: talaris.ErrBadAccept}})
	add(&Case{ID: "H.8", Sends: "101 without Sec-WebSocket-Accept", Response: resp(st101, upWS, connUp),
		Want: Want{Kind: NoOpen, Err: talaris.ErrBadAccept}})
	add(&Case{ID: "H.9", Sends: "101 with Sec-WebSocket-Accept twice (both correct)", Policy: "a duplicated Accept is refused",
		Response: resp(st101, upWS, connUp, accH, accH), Want: Want{Kind: NoOpen, Err: talaris.ErrBadAccept}})
	add(&Case{ID: "H.10", Sends: "legal variant: \"Upgrade: WebSocket\", \"Connection: upgrade\"",
		Response: resp(st101, "Upgrade: WebSocket", "Connection: upgrade", accH), Script: hello, Want: Want{Msgs: helloW}})
	add(&Case{ID: "H.11", Sends: "legal variant: lower-case names, \"connection: keep-alive, Upgrade\"",
		Response: resp(st101, "upgrade: websocket", "connection: keep-alive, Upgrade", "sec-websocket-accept: {accept}"),
		Script:   hello, Want: Want{Msgs: helloW}})
	add(&Case{ID: "H.12", Sends: "legal variant: \"UPGRADE:WEBSOCKET\" (no space), \"Connection: Upgrade,Keep-Alive\\t\"",
		Response: resp(st101, "UPGRADE:WEBSOCKET", "Connection: Upgrade,Keep-Alive\t", "Sec-WebSocket-Accept:   {accept}  "),
		Script:   hello, Want: Want{Msgs: helloW}})
	{
		lines := []string{"HTTP/1.1 101 Web Socket Protocol Handshake", "Server: conformance", "Date: Mon, 01 Jan 2024 00:00:00 GMT"}
		for i := range 40 {
			lines = append(lines, fmt.Sprintf("X-Extra-%d: value %d", i, i))
		}
		lines = append(lines, accH, "Set-Cookie: a=b; Path=/", connUp, upWS)
		add(&Case{ID: "H.13", Sends: "legal variant: other reason phrase, 43 extra headers, Accept before Upgrade",
			Response: resp(lines...), Script: hello, Want: Want{Msgs: helloW}})
	}
	add(&Case{ID: "H.14", Sends: "client offers chat.v1, chat.v2; server picks chat.v2",
		Response: resp(st101, upWS, connUp, accH, "Sec-WebSocket-Protocol: chat.v2"), Script: hello,
		Opts: Opts{Subprotocols: []string{"chat.v1", "chat.v2"}}, Want: Want{Msgs: helloW, Check: subprotoCheck("chat.v2")}})
	add(&Case{ID: "H.15", Sends: "101 without Upgrade", Response: resp(st101, connUp, accH),
		Want: Want{Kind: NoOpen, Err: talaris.ErrHandshake}})
	add(&Case{ID: "H.16", Sends: "101 with \"Upgrade: h2c\"", Response: resp(st101, "Upgrade: h2c", connUp, accH),
		Want: Want{Kind: NoOpen, Err: talaris.ErrHandshake}})
	add(&Case{ID: "H.17", Sends: "101 without Connection", Response: resp(st101, upWS, accH),
		Want: Want{Kind: NoOpen, Err: talaris.ErrHandshake}})
	add(&Case{ID: "H.18", Sends: "101 choosing subprotocol \"chat\" though none was offered",
		Response: resp(st101, upWS, connUp, accH, "Sec-WebSocket-Protocol: chat"),
		Want:     Want{Kind: NoOpen, Err: talaris.ErrBadSubprotocol}})
	add(&Case{ID: "H.19", Sends: "client offers chat.v1; server picks chat.v9",
		Response: resp(st101, upWS, connUp, accH, "Sec-WebSocket-Protocol: chat.v9"), Opts: Opts{Subprotocols: []string{"chat.v1"}},
		Want: Want{Kind: NoOpen, Err: talaris.ErrBadSubprotocol}})
	add(&Case{ID: "H.20", Sends: "101 enabling permessage-deflate, which was not offered",
		Response: resp(st101, upWS, connUp, accH, "Sec-WebSocket-Extensions: permessage-deflate"),
		Want:     Want{Kind: NoOpen, Err: talaris.ErrBadExtension}})
	add(&Case{ID: "H.21", Sends: "header bomb: 101 then endless short header lines (up to 8 MiB)",
		Handshake: func(s *Sess) {
			s.Send([]byte(st101 + "\r\n"))
			var chunk []byte
			for i := 0; len(chunk) < 4096; i++ {
				chunk = fmt.Appendf(chunk, "X-Bomb-%d: aaaaaaaaaaaaaaaa\r\n", i)
			}
			bomb(s, chunk)
		},
		Want: Want{Kind: NoOpen, Err: talaris.ErrHeaderTooLarge}})
	add(&Case{ID: "H.22", Sends: "header bomb: 101 then one endless header line (up to 8 MiB)",
		Handshake: func(s *Sess) {
			s.Send([]byte(st101 + "\r\nX-Long: "))
			bomb(s, bytes.Repeat([]byte("a"), 4096))
		},
		Want: Want{Kind: NoOpen, Err: talaris.ErrHeaderTooLarge}})
	add(&Case{ID: "H.23", Sends: "valid 101 dripped 1 byte per 300 ms; client handshake timeout 1.5 s",
		Handshake: func(s *Sess) {
			r := []byte(strings.ReplaceAll(StdResponse, "{accept}", s.accept))
			deadline := time.Now().Add(guardLong)
			for _, b := range r {
				if s.isEOF() || time.Now().After(deadline) {
					break
				}
				s.Send([]byte{b})
				time.Sleep(300 * time.Millisecond)
			}
			if s.isEOF() {
				s.Note("client gave up while the response was dripping")
			}
		},
		Opts: Opts{HandshakeTimeout: 1500 * time.Millisecond},
		Want: Want{Kind: NoOpen, Err: talaris.ErrTimeout}})
	add(&Case{ID: "H.24", Sends: "half a response head, then FIN",
		Handshake: func(s *Sess) {
			s.Send([]byte(st101 + "\r\nUpgrade: webs"))
			s.CloseWrite()
		},
		Want: Want{Kind: NoOpen, Err: talaris.ErrConnectionLost}})
	add(&Case{ID: "H.25", Sends: "half a response head, then RST",
		Handshake: func(s *Sess) {
			s.Send([]byte(st101 + "\r\nUpgrade: webs"))
			time.Sleep(20 * time.Millisecond)
			s.Reset()
		},
		Want: Want{Kind: NoOpen, Err: talaris.ErrConnectionLost}})
	add(&Case{ID: "H.26", Sends: "not HTTP at all (an SSH banner)",
		Response: "SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n",
		Want:     Want{Kind: NoOpen, Err: talaris.ErrHandshake}})
	add(&Case{ID: "H.27", Sends: "101 with Transfer-Encoding: chunked",
		Response: resp(st101, upWS, connUp, accH, "Transfer-Encoding: chunked"),
		Want:     Want{Kind: NoOpen, Err: talaris.ErrHandshake}})
	return cs
}

// bomb writes chunk until the client stops reading or 8 MiB went out.
func bomb(s *Sess, chunk []byte) {
	total := 0
	for total < 8<<20 && !s.isEOF() {
		s.nc.SetWriteDeadline(time.Now().Add(guardShort))
		n, err := s.nc.Write(chunk)
		total += n
		if err != nil {
			break
		}
	}
	s.Note("bomb: %d KiB written", total>>10)
}

func beyondCases() []*Case {
	var cs []*Case
	add := func(c *Case) { cs = append(cs, c) }

	add(&Case{ID: "X.1", Sends: "binary frame whose 64-bit length has the top bit set (2^63+5)",
		Script: func(s *Sess) { s.Send(withLen(ws.OpBinary, 8, 1<<63|5, []byte("abcde"))) },
		Want:   Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	add(&Case{ID: "X.2", Sends: "binary frame header with length 2^62 and no payload",
		Policy: "1009 from the header alone: nothing is allocated or awaited",
		Script: func(s *Sess) { s.Send(withLen(ws.OpBinary, 8, 1<<62, nil)) },
		Want:   Want{Kind: Fail, Code: 1009, Err: talaris.ErrMessageTooBig}})
	nm := "non-minimal length accepted (RFC 6455 5.2 gives no instruction to fail)"
	add(&Case{ID: "X.3.1", Sends: "text \"Hello\" with a 16-bit length", Policy: nm,
		Script: func(s *Sess) { s.Send(withLen(ws.OpText, 2, 5, []byte("Hello"))) }, Want: Want{Msgs: []Frame{tm("Hello")}}})
	add(&Case{ID: "X.3.2", Sends: "text \"Hello\" with a 64-bit length", Policy: nm,
		Script: func(s *Sess) { s.Send(withLen(ws.OpText, 8, 5, []byte("Hello"))) }, Want: Want{Msgs: []Frame{tm("Hello")}}})
	add(&Case{ID: "X.3.3", Sends: "binary of 300 bytes with a 64-bit length, empty binary with a 64-bit length", Policy: nm,
		Script: func(s *Sess) {
			s.Send(withLen(ws.OpBinary, 8, 300, bigBin[:300]), withLen(ws.OpBinary, 8, 0, nil))
		},
		Want: Want{Msgs: []Frame{bm(bigBin[:300]), bm([]byte{})}}})
	add(&Case{ID: "X.3.4", Sends: "ping \"abc\" with a 16-bit length",
		Policy: "a control frame's 7-bit length must be <= 125: extended lengths on control frames are refused",
		Script: func(s *Sess) { s.Send(withLen(ws.OpPing, 2, 3, []byte("abc"))) },
		Want:   Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	add(&Case{ID: "X.4", Sends: "ping flood (125-byte pings) while the server reads nothing and the consumer is slow; then text \"end\"",
		Policy: "back-pressure: the client stops reading once its pong queue is full (talaris: MaxSendQueue 256 KiB, 256-event ring)",
		Script: pingFlood,
		NoTLS: "the flood detects back-pressure with a write deadline, and crypto/tls cannot write again after one fires " +
			"(TLS back-pressure is covered by TestTLSIntegrity and the fault tests)",
		Opts: Opts{Slow: true, Talaris: func(c *talaris.Config) {
			c.MaxSendQueue = 256 << 10
			testhook.SetKnobs(c, &testhook.Knobs{EventRingSize: 256})
		}},
		Want: Want{Msgs: []Frame{tm("end")}, AnyPongs: true, Check: func(o *Obs, r *Result) string {
			var pings, blocked, kib int
			for _, n := range o.Notes {
				fmt.Sscanf(n, "flood: %d pings, blocked=%d after %d KiB", &pings, &blocked, &kib)
			}
			switch {
			case blocked == 0:
				return fmt.Sprintf("never pushed back (%d KiB of pings absorbed)", kib)
			case len(o.Pongs) != pings:
				return fmt.Sprintf("%d pongs for %d pings", len(o.Pongs), pings)
			}
			return ""
		}}})
	add(&Case{ID: "X.5", Sends: "text, then close 1000 after the echo; the server never closes TCP",
		Policy: "the client closes TCP itself after its close timeout (talaris: Config.CloseTimeout 1 s)",
		Script: func(s *Sess) {
			s.Send(text("x"))
			s.WaitMsgs(1, guardShort)
			s.SendClose(1000, "bye")
			s.WaitClose(guardShort)
			s.WaitEOF(guardLong)
			s.Finish()
		},
		Want: Want{Msgs: []Frame{tm("x")}, Check: clientClosedTCP}})
	add(&Case{ID: "X.6", Sends: "half-open peer: text; the client then closes, and the server never answers or closes TCP",
		Policy: "the client gives up after its close timeout (talaris: ErrCloseTimeout, code 1006)",
		Opts:   Opts{CloseAfter: 1},
		Script: func(s *Sess) {
			s.Send(text("x"))
			s.WaitClose(guardShort)
			s.WaitEOF(guardLong)
			s.Finish()
		},
		Want: Want{Msgs: []Frame{tm("x")}, Err: talaris.ErrCloseTimeout, Check: clientClosedTCP}})
	add(&Case{ID: "X.7", Sends: "masked text frame from the server",
		Script: func(s *Sess) {
			s.Send(ws.AppendMaskedFrame(nil, true, ws.OpText, [4]byte{1, 2, 3, 4}, []byte("Hello")))
		},
		Want: Want{Kind: Fail, Code: 1002, Err: talaris.ErrProtocol}})
	add(&Case{ID: "X.8", Sends: "binary frame header announcing 16 MiB + 1 (over the 16 MiB limit), no payload",
		Script: func(s *Sess) { s.Send(withLen(ws.OpBinary, 8, 16<<20+1, nil)) },
		Want:   Want{Kind: Fail, Code: 1009, Err: talaris.ErrMessageTooBig}})
	add(&Case{ID: "X.9", Sends: "fragment of 8 MiB, then a continuation header announcing 8 MiB + 1 (message over 16 MiB)",
		Script: func(s *Sess) {
			s.Send(frame(false, ws.OpBinary, bigBin[:8<<20]), ws.AppendHeader(nil, ws.Header{Op: ws.OpContinuation, Fin: true, Length: 8<<20 + 1}))
		},
		Want: Want{Kind: Fail, Code: 1009, Err: talaris.ErrMessageTooBig}, Heavy: true})
	add(&Case{ID: "X.10", Sends: "text, then half of a second frame, then RST",
		Script: func(s *Sess) {
			s.Send(text("whole"))
			s.WaitMsgs(1, guardShort)
			s.Send(text(strings.Repeat("y", 100))[:50])
			time.Sleep(20 * time.Millisecond)
			s.Reset()
		},
		Want: Want{Kind: Lost, Msgs: []Frame{tm("whole")}, Code: 1006, Err: talaris.ErrConnectionLost}})
	add(&Case{ID: "X.11", Sends: "text, then half of a second frame, then FIN",
		Script: func(s *Sess) {
			s.Send(text("whole"))
			s.WaitMsgs(1, guardShort)
			s.Send(text(strings.Repeat("y", 100))[:50])
			s.CloseWrite()
			s.WaitEOF(guardShort)
			s.Finish()
		},
		Want: Want{Kind: Lost, Msgs: []Frame{tm("whole")}, Code: 1006, Err: talaris.ErrConnectionLost}})
	add(&Case{ID: "X.12", Sends: "text, then FIN without a close frame",
		Script: func(s *Sess) {
			s.Send(text("whole"))
			s.WaitMsgs(1, guardShort)
			s.CloseWrite()
			s.WaitEOF(guardShort)
			s.Finish()
		},
		Want: Want{Kind: Lost, Msgs: []Frame{tm("whole")}, Code: 1006, Err: talaris.ErrConnectionLost}})
	add(&Case{ID: "X.13", Sends: "text; the client closes 100 ms after its echo (idle connection); the server answers the close",
		Opts: Opts{CloseAfter: 1, CloseDelay: 100 * time.Millisecond},
		Script: func(s *Sess) {
			s.Send(text("x"))
			s.WaitClose(guardShort)
		},
		Want: Want{Msgs: []Frame{tm("x")}}})
	return cs
}

func clientClosedTCP(o *Obs, r *Result) string {
	if o.End != "eof" && o.End != "reset" {
		return "client did not close TCP (" + o.End + ")"
	}
	return ""
}

// pingFlood writes 125-byte pings while the reader is paused, until a write
// stays blocked for a second (the client pushed back) or 64 MiB went out.
// Then it resumes reading, finishes the blocked write and sends "end".
func pingFlood(s *Sess) {
	var chunk []byte
	for i := 0; i < 256; i++ {
		p := fmt.Appendf(nil, "%08d", i)
		p = append(p, bytes.Repeat([]byte{'p'}, 125-len(p))...)
		chunk = ws.AppendFrame(chunk, true, ws.OpPing, p)
	}
	frameLen := len(chunk) / 256
	s.Pause()
	paused := true
	written, blocked := 0, 0
	for written < 64<<20 {
		s.nc.SetWriteDeadline(time.Now().Add(time.Second))
		n, err := s.nc.Write(chunk)
		written += n
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				break
			}
			blocked = 1
			s.Resume()
			paused = false
			s.write(chunk[n:])
			written += len(chunk) - n
			break
		}
	}
	if paused {
		s.Resume()
	}
	s.Note("flood: %d pings, blocked=%d after %d KiB", written/frameLen, blocked, written>>10)
	s.Send(text("end"))
}
