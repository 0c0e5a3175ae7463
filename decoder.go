package talaris

import (
	"errors"
)

// The decoder runs the C frame parser synchronously on bytes the caller
// supplies: no loop thread, socket or io_uring. It is not part of the
// public API (DialMemory and Conn.Inject replay a captured feed through
// the real pump path); the benchmark and the tests reach it through
// testhook.NewDecoder. Each Decode call is one cgo call for the whole
// buffer; messages reach fn through the same event ring a Pool uses, a
// whole frame's payload pointing into the buffer itself (no copy) and a
// frame split across calls reassembled. A decoder is not safe for
// concurrent use. The platform half is decoder_linux.go or
// talaris_stub.go.

// errDecodeFunc is Decode's answer to a callback that is no DataFunc.
var errDecodeFunc = errors.New("talaris: decoder: the callback is not a DataFunc")

// Decode parses b as the next bytes of a server's frame stream (see
// testhook.Decoder); fn is a DataFunc or a function literal of its type.
func (d *decoder) Decode(b []byte, fn any) (int, error) {
	switch f := fn.(type) {
	case DataFunc:
		return d.decode(b, f)
	case func(Conn, Opcode, []byte):
		return d.decode(b, f)
	}
	return 0, errDecodeFunc
}

// Close releases the decoder's C memory (see testhook.Decoder).
func (d *decoder) Close() { d.close() }
