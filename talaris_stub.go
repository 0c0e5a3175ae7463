//go:build !linux || !cgo

package talaris

import "context"

// Pool is unavailable without linux and cgo: every operation returns
// ErrUnsupported.
type Pool struct{}

// NewPool returns ErrUnsupported on this platform.
func NewPool(cfg Config) (*Pool, error) { return nil, ErrUnsupported }

// Close does nothing on this platform.
func (p *Pool) Close() error { return nil }

// ConnCount returns 0 on this platform.
func (p *Pool) ConnCount() int { return 0 }

// Stats returns zero counters on this platform.
func (p *Pool) Stats() PoolStats { return PoolStats{} }

// Dial returns ErrUnsupported on this platform.
func (p *Pool) Dial(ctx context.Context, rawURL string, opts *DialOptions) (Conn, error) {
	return Conn{}, ErrUnsupported
}

// DialAsync returns ErrUnsupported on this platform.
func (p *Pool) DialAsync(rawURL string, opts *DialOptions) (Conn, error) {
	return Conn{}, ErrUnsupported
}

// DialMemory returns ErrUnsupported on this platform.
func (p *Pool) DialMemory() (Conn, error) { return Conn{}, ErrUnsupported }

func (p *Pool) pumpBlocking(fe EventFunc, fd DataFunc) (int, error)        { return 0, ErrUnsupported }
func (p *Pool) pumpOnce(fd DataFunc, fe EventFunc, iters int) (int, error) { return 0, ErrUnsupported }

const (
	cmdPing = 3
	cmdPong = 4
)

func (c Conn) send(op Opcode, b []byte) error     { return ErrUnsupported }
func (c Conn) control(op uint8, b []byte) error   { return ErrUnsupported }
func (c Conn) closeConn(code int, r string) error { return ErrUnsupported }
func (c Conn) inject(b []byte) error              { return ErrUnsupported }
func (c Conn) state() State                       { return StateIdle }
func (c Conn) stats() ConnStats                   { return ConnStats{} }
func (c Conn) subprotocol() string                { return "" }
func tlsBackend() string                          { return "" }

// PinCurrentThreadTo returns ErrUnsupported on this platform.
func PinCurrentThreadTo(cpu int) error { return ErrUnsupported }

// Decoder is unavailable without linux and cgo.
type Decoder struct{}

// NewDecoder returns ErrUnsupported on this platform.
func NewDecoder(maxMessage int) (*Decoder, error) { return nil, ErrUnsupported }

// Decode returns ErrUnsupported on this platform.
func (d *Decoder) Decode(b []byte, fn DataFunc) (int, error) { return 0, ErrUnsupported }

// Close does nothing on this platform.
func (d *Decoder) Close() {}
