//go:build !linux || !cgo

package talaris

import "context"

// The platform half without linux and cgo: every operation that needs the
// C core returns ErrUnsupported (the exported API and its docs are in
// talaris.go and the other untagged files).

type pool struct{}

func newPool(Config) (*Pool, error)                          { return nil, ErrUnsupported }
func (p *Pool) close() error                                 { return nil }
func (p *Pool) connCount() int                               { return 0 }
func (p *Pool) dialMemory() (Conn, error)                    { return Conn{}, ErrUnsupported }
func (p *Pool) dialAsync(string, *DialOptions) (Conn, error) { return Conn{}, ErrUnsupported }
func (p *Pool) pumpBlocking(EventFunc, DataFunc, StampedFunc) (int, error) {
	return 0, ErrUnsupported
}
func (p *Pool) pumpStamped(StampedFunc) (int, error)      { return 0, ErrUnsupported }
func (p *Pool) metrics(bool) Metrics                      { return Metrics{} }
func (p *Pool) name() string                              { return "" }
func (p *Pool) pumpOnce(DataFunc, EventFunc) (int, error) { return 0, ErrUnsupported }
func (p *Pool) dial(context.Context, string, *DialOptions) (Conn, error) {
	return Conn{}, ErrUnsupported
}
func (p *Pool) run(context.Context, EventFunc, DataFunc) error {
	return ErrUnsupported
}

func (c Conn) send(Opcode, []byte) error                         { return ErrUnsupported }
func (c Conn) sendContext(context.Context, Opcode, []byte) error { return ErrUnsupported }
func (c Conn) control(uint8, []byte) error                       { return ErrUnsupported }
func (c Conn) sendBatch(Opcode, [][]byte) error                  { return ErrUnsupported }
func (c Conn) flush(context.Context) error                       { return ErrUnsupported }
func (c Conn) closeConn(int, string) error                       { return ErrUnsupported }
func (c Conn) abort() error                                      { return ErrUnsupported }
func (c Conn) inject([]byte) error                               { return ErrUnsupported }
func (c Conn) state() State                                      { return StateIdle }
func (c Conn) stats() ConnStats                                  { return ConnStats{} }
func (c Conn) subprotocol() string                               { return "" }
func tlsBackend() string                                         { return "" }
func pinCurrentThreadTo(int) error                               { return ErrUnsupported }

type decoder struct{}

func newDecoder(maxMessage, ringSize, arenaSize uint64) (*decoder, error) { return nil, ErrUnsupported }
func (d *decoder) decode([]byte, DataFunc) (int, error)                   { return 0, ErrUnsupported }
func (d *decoder) close()                                                 {}
