package wstest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"

	"github.com/talaris-go/talaris/ws"
)

const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

// Payload returns binary message i of a stream of size-byte messages. When
// size >= 8 the first 8 bytes are i in little-endian order; every other byte
// j is a cheap function of i and j.
func Payload(i, size int) []byte { return AppendPayload(nil, ws.OpBinary, i, size) }

// TextPayload returns text message i of a stream of size-byte messages. It
// contains only ASCII letters and digits: when size >= 8 the first 8 bytes
// are the low 32 bits of i as lower-case hexadecimal digits; every other
// byte j is a letter or digit chosen by i and j.
func TextPayload(i, size int) []byte { return AppendPayload(nil, ws.OpText, i, size) }

// PayloadOp returns TextPayload(i, size) for ws.OpText and Payload(i, size)
// otherwise.
func PayloadOp(op ws.Opcode, i, size int) []byte { return AppendPayload(nil, op, i, size) }

// AppendPayload appends PayloadOp(op, i, size) to dst and returns the
// extended slice.
func AppendPayload(dst []byte, op ws.Opcode, i, size int) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, size)...)
	p := dst[start:]
	j := 0
	if size >= 8 {
		if op == ws.OpText {
			const hex = "0123456789abcdef"
			for k := range 8 {
				p[k] = hex[(uint32(i)>>(28-4*k))&0xF]
			}
		} else {
			binary.LittleEndian.PutUint64(p, uint64(i))
		}
		j = 8
	}
	for ; j < size; j++ {
		v := uint(i)*31 + uint(j)*7 + uint(j)>>8
		if op == ws.OpText {
			p[j] = alnum[v%uint(len(alnum))]
		} else {
			p[j] = byte(v)
		}
	}
	return dst
}

// AppendStreamMessage appends the server frames of message i of a /stream
// to dst: PayloadOp(op, i, size) split into frag fragments (one unfragmented
// frame when frag <= 1) with, when ping is set, a ping with payload "p<i>"
// between consecutive fragments (before the message when frag <= 1).
// Fragments are as even as possible; some are empty when size < frag.
func AppendStreamMessage(dst []byte, op ws.Opcode, i, size, frag int, ping bool) []byte {
	p := PayloadOp(op, i, size)
	pingPayload := []byte("p" + strconv.Itoa(i))
	if frag <= 1 {
		if ping {
			dst = ws.AppendFrame(dst, true, ws.OpPing, pingPayload)
		}
		return ws.AppendFrame(dst, true, op, p)
	}
	for k := range frag {
		o := ws.OpContinuation
		if k == 0 {
			o = op
		}
		if k > 0 && ping {
			dst = ws.AppendFrame(dst, true, ws.OpPing, pingPayload)
		}
		dst = ws.AppendFrame(dst, k == frag-1, o, p[k*size/frag:(k+1)*size/frag])
	}
	return dst
}

// Checker verifies that the messages of a /stream arrive complete and in
// order. It is safe for concurrent use.
type Checker struct {
	mu   sync.Mutex
	size int
	op   ws.Opcode
	n    int
	sum  uint64
	want []byte
}

// NewChecker returns a Checker for binary messages of size bytes
// (Payload(0, size), Payload(1, size), ...).
func NewChecker(size int) *Checker { return &Checker{size: size, op: ws.OpBinary, sum: fnvOffset} }

// NewTextChecker returns a Checker for text messages of size bytes
// (TextPayload(0, size), ...).
func NewTextChecker(size int) *Checker { return &Checker{size: size, op: ws.OpText, sum: fnvOffset} }

const fnvOffset = 14695981039346656037

// Check verifies that payload is the next expected message. The expected
// sequence number is an internal counter; for binary messages of at least 8
// bytes the error also reports the sequence number found in the payload. A
// failed check does not advance the counter.
func (c *Checker) Check(payload []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(payload) != c.size {
		return fmt.Errorf("wstest: message %d: length %d, want %d", c.n, len(payload), c.size)
	}
	c.want = AppendPayload(c.want[:0], c.op, c.n, c.size)
	if !bytes.Equal(payload, c.want) {
		if c.op == ws.OpBinary && c.size >= 8 {
			return fmt.Errorf("wstest: message %d: content differs (payload seq %d)", c.n, binary.LittleEndian.Uint64(payload))
		}
		if c.size >= 8 {
			return fmt.Errorf("wstest: message %d: content differs (payload starts %q)", c.n, payload[:8])
		}
		return fmt.Errorf("wstest: message %d: content differs", c.n)
	}
	// Continue FNV-1a over the concatenation of all checked payloads.
	h := c.sum
	for _, b := range payload {
		h ^= uint64(b)
		h *= 1099511628211
	}
	c.sum = h
	c.n++
	return nil
}

// Count returns the number of messages checked successfully.
func (c *Checker) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// Sum returns the 64-bit FNV-1a hash of the concatenation of all payloads
// checked successfully; StreamSum computes the expected value.
func (c *Checker) Sum() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sum
}

// StreamSum returns the Sum a Checker reaches after n messages of size bytes
// of opcode op.
func StreamSum(op ws.Opcode, n, size int) uint64 {
	h := fnv.New64a()
	var buf []byte
	for i := range n {
		buf = AppendPayload(buf[:0], op, i, size)
		h.Write(buf)
	}
	return h.Sum64()
}
