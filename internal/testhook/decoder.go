package testhook

// Decoder is talaris' C frame parser run synchronously on bytes the
// caller supplies: no loop thread, socket or io_uring. Each Decode call is
// one cgo call for the whole buffer; messages reach the callback through
// the same event ring a Pool uses, a whole frame's payload pointing into
// the buffer itself (no copy) and a frame split across calls reassembled.
// The benchmark measures the parser with it and the tests drive it with
// arbitrary splits. A Decoder is not safe for concurrent use.
type Decoder interface {
	// Decode parses b as the next bytes of a server's frame stream
	// (frames may be split anywhere across calls) and calls fn, a
	// talaris.DataFunc (or a function literal of its type), for every
	// complete data message; the payload is valid only until fn
	// returns, and may alias b, which must not be modified until Decode
	// returns. fn may call Close (Decode then returns talaris.ErrClosed
	// after the messages already parsed from b; the memory goes as it
	// returns) but not Decode. Control frames are validated and
	// consumed. It returns the number of messages delivered. Once the
	// stream violates RFC 6455 (or a close frame arrives) every call
	// returns the same error: a *talaris.ConnError matching ErrProtocol,
	// ErrInvalidUTF8, ErrMessageTooBig, or ErrClosed after a close frame.
	Decode(b []byte, fn any) (int, error)
	// Close releases the C memory (called from Decode's callback: when
	// Decode returns). Later calls to Decode return talaris.ErrClosed.
	Close()
}

// NewDecoder makes a Decoder that accepts messages up to maxMessage bytes
// (0: talaris.Config's MaxMessageSize default, 16 MiB). Package talaris
// sets it (without linux and cgo it returns talaris.ErrUnsupported).
var NewDecoder func(maxMessage int) (Decoder, error)
