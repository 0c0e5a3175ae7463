package talaris

// Decoder runs the C frame parser synchronously on bytes the caller
// supplies: no loop thread, socket or io_uring. Each Decode call is one cgo
// call for the whole buffer; messages reach fn through the same event ring
// a Pool uses, a whole frame's payload pointing into the buffer itself (no
// copy) and a frame split across calls reassembled. Use it to replay
// captured server byte streams or to measure the parser. A Decoder is not
// safe for concurrent use.
type Decoder struct {
	decoder // the platform's half: decoder_linux.go or talaris_stub.go
}

// NewDecoder makes a Decoder that accepts messages up to maxMessage bytes
// (0: Config's MaxMessageSize default, 16 MiB).
func NewDecoder(maxMessage int) (*Decoder, error) {
	if maxMessage <= 0 {
		maxMessage = int(defaults.MaxMessageSize)
	}
	return newDecoder(uint64(maxMessage), decoderEventRing, arenaFor(decoderMinArenaSize, uint64(maxMessage)))
}

// Decode parses b as the next bytes of a server's frame stream (frames may
// be split anywhere across calls) and calls fn for every complete data
// message; payload is valid only until fn returns, and may alias b, which
// must not be modified until Decode returns. fn may call Close (Decode
// then returns ErrClosed after the messages already parsed from b; the
// memory goes as it returns) but not Decode. Control frames are
// validated and consumed. It returns the number of messages delivered.
// Once the stream violates RFC 6455 (or a close frame arrives) every call
// returns the same error: a *ConnError matching ErrProtocol,
// ErrInvalidUTF8, ErrMessageTooBig, or ErrClosed after a close frame.
func (d *Decoder) Decode(b []byte, fn DataFunc) (int, error) { return d.decode(b, fn) }

// Close releases the Decoder's C memory (called from Decode's callback:
// when Decode returns). Later calls to Decode return ErrClosed.
func (d *Decoder) Close() { d.close() }
