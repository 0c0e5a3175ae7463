package ws

import "errors"

// Errors returned by [Parser] in addition to those of [ParseHeader] and
// [ParseClosePayload].
var (
	// ErrUnexpectedContinuation reports a continuation frame outside a
	// fragmented message (close code 1002).
	ErrUnexpectedContinuation = errors.New("ws: continuation frame without a message in progress")
	// ErrExpectedContinuation reports a new text or binary frame while a
	// fragmented message is in progress (close code 1002).
	ErrExpectedContinuation = errors.New("ws: new data frame within a fragmented message")
	// ErrMessageTooBig reports a message longer than Parser.MaxMessageSize
	// (close code 1009).
	ErrMessageTooBig = errors.New("ws: message too big")
)

// Parser is the reference streaming parser for frames a client receives from
// a server. It is written for clarity, not speed: the C parser is
// differentially fuzzed against it.
//
// Feed it bytes in pieces of any size. It calls onMessage for each complete
// text or binary message (fragments reassembled) and onControl for each
// ping, pong and close frame, including those interleaved between the
// fragments of a message. It fails the stream with the first protocol
// violation:
//
//   - any ParseHeader error for fromServer == true;
//   - a continuation frame with no message in progress
//     (ErrUnexpectedContinuation), or a text/binary frame while one is in
//     progress (ErrExpectedContinuation);
//   - a message whose total length would exceed MaxMessageSize
//     (ErrMessageTooBig), detected as soon as the frame header is read;
//   - text that is not valid UTF-8 (ErrInvalidUTF8), detected as soon as
//     the offending fragment is complete, and a text message ending inside
//     a code point, detected at its final fragment;
//   - a close frame whose payload ParseClosePayload rejects.
//
// After an error, Feed returns that same error forever (until Reset). After
// a valid close frame has been delivered the parser is closed: the rest of
// the input and all later input are discarded and Feed returns nil.
//
// Payload slices handed to the callbacks are valid only until the callback
// returns. Callbacks must not call Feed. Either callback may be nil.
type Parser struct {
	// MaxMessageSize limits the length of a reassembled data message in
	// bytes; 0 or less means no limit. Control frames are limited to 125
	// bytes by the protocol.
	MaxMessageSize int64

	buf    []byte        // buffered input: an incomplete frame
	msg    []byte        // payload of the fragments received so far
	op     Opcode        // opcode of the message in progress; 0 if none
	text   UTF8Validator // validates the text message in progress
	err    error         // sticky error
	closed bool          // a close frame has been delivered
}

// Feed consumes b. See [Parser] for the callbacks and errors. Feed does not
// retain b after it returns.
func (p *Parser) Feed(b []byte, onMessage, onControl func(op Opcode, payload []byte)) error {
	if p.err != nil || p.closed {
		return p.err
	}
	in := b
	if len(p.buf) > 0 {
		p.buf = append(p.buf, b...)
		in = p.buf
	}
	for !p.closed {
		h, n, err := ParseHeader(in, true)
		if err != nil {
			return p.fail(err)
		}
		if n == 0 {
			break // incomplete header
		}
		if h.Op.IsData() {
			if err := p.checkData(h); err != nil {
				return p.fail(err)
			}
		}
		if uint64(len(in)-n) < h.Length {
			break // incomplete payload
		}
		end := n + int(h.Length)
		if err := p.frame(h, in[n:end], onMessage, onControl); err != nil {
			return p.fail(err)
		}
		in = in[end:]
	}
	if p.closed {
		p.buf = nil
		return nil
	}
	if len(in) == len(p.buf) {
		return nil // nothing consumed: in is p.buf (or both are empty)
	}
	// Keep the unconsumed tail. copy handles in aliasing p.buf.
	p.buf = p.buf[:copy(p.buf[:cap(p.buf)], in)]
	if len(p.buf) < len(in) {
		p.buf = append(p.buf, in[len(p.buf):]...)
	}
	return nil
}

// checkData applies the checks a data frame header allows before its
// payload arrives.
func (p *Parser) checkData(h Header) error {
	if h.Op == OpContinuation && p.op == 0 {
		return ErrUnexpectedContinuation
	}
	if h.Op != OpContinuation && p.op != 0 {
		return ErrExpectedContinuation
	}
	if p.MaxMessageSize > 0 && h.Length > uint64(p.MaxMessageSize)-uint64(len(p.msg)) {
		return ErrMessageTooBig
	}
	return nil
}

// frame handles one complete frame whose header passed all checks.
func (p *Parser) frame(h Header, payload []byte, onMessage, onControl func(Opcode, []byte)) error {
	if h.Op.IsControl() {
		if h.Op == OpClose {
			if _, _, err := ParseClosePayload(payload); err != nil {
				return err
			}
			p.closed = true
		}
		if onControl != nil {
			onControl(h.Op, payload)
		}
		return nil
	}
	if h.Op != OpContinuation { // first frame of a message
		p.op = h.Op
		p.text.Reset()
	}
	if p.op == OpText && !p.text.Feed(payload) {
		return ErrInvalidUTF8
	}
	if !h.Fin {
		p.msg = append(p.msg, payload...)
		return nil
	}
	if p.op == OpText && !p.text.Complete() {
		return ErrInvalidUTF8
	}
	msg := payload
	if len(p.msg) > 0 {
		p.msg = append(p.msg, payload...)
		msg = p.msg
	}
	op := p.op
	p.op = 0
	p.msg = p.msg[:0]
	if onMessage != nil {
		onMessage(op, msg)
	}
	return nil
}

func (p *Parser) fail(err error) error {
	p.err = err
	p.buf = nil
	p.msg = nil
	return err
}

// Closed reports whether a close frame has been delivered.
func (p *Parser) Closed() bool { return p.closed }

// Err returns the error that failed the stream, or nil.
func (p *Parser) Err() error { return p.err }

// Reset clears all state except MaxMessageSize, keeping buffers for reuse.
func (p *Parser) Reset() {
	*p = Parser{MaxMessageSize: p.MaxMessageSize, buf: p.buf[:0], msg: p.msg[:0]}
}

// CloseCode returns the close code a client sends when failing the
// connection because of err: 1007 (CloseInvalidPayload) for ErrInvalidUTF8,
// 1009 (CloseMessageTooBig) for ErrMessageTooBig, 1002 (CloseProtocolError)
// for every other error of this package, 1000 (CloseNormal) for nil, and
// 1011 (CloseInternalError) for errors from elsewhere. Wrapped errors are
// recognised.
func CloseCode(err error) int {
	switch {
	case err == nil:
		return CloseNormal
	case errors.Is(err, ErrInvalidUTF8):
		return CloseInvalidPayload
	case errors.Is(err, ErrMessageTooBig):
		return CloseMessageTooBig
	}
	for _, e := range protocolErrors {
		if errors.Is(err, e) {
			return CloseProtocolError
		}
	}
	return CloseInternalError
}

var protocolErrors = []error{
	ErrReservedBits, ErrReservedOpcode, ErrMaskedServerFrame,
	ErrUnmaskedClientFrame, ErrFragmentedControl, ErrControlTooLong,
	ErrLength63, ErrUnexpectedContinuation, ErrExpectedContinuation,
	ErrInvalidClosePayload, ErrInvalidCloseCode,
}
