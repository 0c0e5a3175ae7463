package talaris

import (
	"context"
	"errors"
	"io"
)

var errNilWriter = errors.New("talaris: WritePrometheus: nil io.Writer")

// Pool owns one C loop thread (Config.Loops: or several, each with its own
// connections), its io_uring, its rings and a set of connections. Create
// it with NewPool; one goroutine pumps it. PoolStats and Metrics count
// every loop's. Without linux and cgo every operation returns
// ErrUnsupported.
type Pool struct {
	pool // the platform's half: pool_linux.go or talaris_stub.go
}

// PoolStats are a Pool's counters.
type PoolStats struct {
	Events     uint64 // events published to the ring
	Batches    uint64 // tail publishes (events per batch = Events/Batches)
	CQEs       uint64 // completions handled by the loop
	Rearms     uint64 // multishot recvs re-armed after ending without F_MORE
	NoBufs     uint64 // recvs ended by -ENOBUFS (buffer ring exhausted)
	Stalls     uint64 // times the loop held input back because the ring or arena was full, or a connection had its share of it pending
	LoopWakes  uint64 // times Go woke a sleeping loop
	PumpSleeps uint64 // times Pump slept waiting for events
	Reconnects uint64 // successful re-opens by reconnect policies, all connections
	FairHolds  uint64 // times a connection was held at its share of the ring (Config.MaxConnPendingEvents/Bytes; also counted in Stalls)
	TLSRecords uint64 // TLS application-data records opened by talaris' own record layer, not the library's SSL_read (Config.NoTLSRecordLayer)
	// TLSRecordsOwnGCM counts those of TLSRecords decrypted with talaris'
	// own AES-GCM (on CPUs with VAES and VPCLMULQDQ, unless
	// Config.TLSLibraryGCM), not the TLS library's.
	TLSRecordsOwnGCM uint64
	// BellSleeps counts the pump's sleeps on its reply doorbell (also
	// counted in PumpSleeps); BellRings the wake-ups from them that a
	// socket's data gave before the loop's publish (Config.ReplyDoorbell).
	BellSleeps, BellRings uint64
	// ReplySpins counts the pump's spins for the answer to a send
	// (Config.ReplySpin); ReplyLate those that ended without one (each
	// turns the reply spin off until an answer again comes in time).
	ReplySpins, ReplyLate uint64
	// MinWaits counts the loop's waits that were batched (Config.MinWait:
	// the kernel waited up to MinWait for more completions).
	MinWaits uint64
	// RecvRevived counts receives the kernel left silent on a socket
	// that had data or had ended: the loop found the socket ready at two
	// looks 250 ms apart with no completion between them, cancelled the
	// receive and armed it again (nothing is lost; see Metrics.RecvRevived).
	RecvRevived uint64
}

// NewPool starts a C loop thread configured by cfg.
func NewPool(cfg Config) (*Pool, error) { return newPool(cfg) }

// Close shuts the loop down: open connections get a 1001 (going away)
// close frame and Close waits for each close handshake to complete (the
// server's echo and TCP end), at most Config.CloseTimeout, before the
// sockets are closed and the loop is freed; connections still dialing are
// dropped. Pending events are dropped (events that no longer fit in the
// ring are discarded so a connection nobody pumps still reads its echo). A
// Pump in progress returns ErrPoolClosed (after the callback that called
// Close, when one did: Close may be called from a pump callback and
// returns promptly). Close is idempotent and safe against every concurrent
// call: a method racing it, or called after it, returns ErrPoolClosed
// (Conn.State: StateClosed, Conn.Stats: zero); it never reads freed
// memory. After Close ConnCount is 0 and every handle reports StateClosed;
// Pool.Stats and Pool.Metrics keep reporting the counters as they were
// when the loop stopped.
func (p *Pool) Close() error { return p.close() }

// ConnCount returns the number of connections of the pool that have not
// yet delivered their final event.
func (p *Pool) ConnCount() int { return p.connCount() }

// Stats returns the pool's counters.
func (p *Pool) Stats() PoolStats { return p.poolStats() }

// Dial connects, upgrades and returns an open connection, or the reason it
// could not. The connection's events (EventOpen first) also reach Pump; a
// dial that fails delivers no event at all (the caller never had the
// Conn). ctx bounds the whole dial, name resolution included; cancelling
// it aborts the connection (unless it opened first: then Dial returns it).
//
// A host name is resolved to all its addresses, tried in turn (IPv4
// first) until one connects. Errors: ErrDial wrapping the errno of the
// last connect (errors.Is(err, syscall.ECONNREFUSED)), ErrResolve,
// ErrTimeout, the TLS causes, and for a refused upgrade a *HandshakeError
// (errors.As) that also matches ErrHandshake and its cause (ErrBadStatus
// ...).
//
// Without DialOptions.Reconnect Dial makes exactly one attempt; with it,
// Dial returns once an attempt opens or the policy gives up (the last
// error), and ctx bounds all the attempts and waits together. A Dial that
// gives up delivers no event; the EventReconnecting of attempts that
// failed before the open reach the pump only if it passes them after
// Dial returned the Conn (never before).
func (p *Pool) Dial(ctx context.Context, rawURL string, opts *DialOptions) (Conn, error) {
	return p.dial(ctx, rawURL, opts)
}

// DialAsync starts a dial and returns at once with a handle in
// StateConnecting. EventOpen or EventError for the returned Conn follows
// through the pumps (an EventError's Err is what Dial would have
// returned). A host name is resolved before it returns; use an IP address
// to avoid that wait.
func (p *Pool) DialAsync(rawURL string, opts *DialOptions) (Conn, error) {
	return p.dialAsync(rawURL, opts)
}

// DialMemory opens a socketless connection whose server bytes come from
// Conn.Inject instead of a socket: it runs the same C frame parser, ring
// and pump path as a network connection. Use it to benchmark the decode
// path or to replay a captured feed.
func (p *Pool) DialMemory() (Conn, error) { return p.dialMemory() }

// Pump delivers every pending event of every connection to fn, in order,
// and releases their payload memory when fn has returned for the whole
// batch. It blocks until at least one event was delivered and returns how
// many were. Only one goroutine may pump a Pool at a time; a second gets
// ErrConcurrentPump. After Close it returns ErrPoolClosed.
func (p *Pool) Pump(fn EventFunc) (int, error) { return p.pumpBlocking(fn, nil, nil) }

// PumpData is Pump for data messages: open, ping, pong, close and error
// events go to Config.OnEvent, in order with the data, or are consumed
// without a callback when it is nil (pings were answered by the loop
// already). It blocks until at least one callback ran and returns how
// many did.
//
// It returns ErrNoConns instead of blocking when nothing is pending and
// the pool has no connection left (ConnCount is 0): none was dialed, or
// the last one's final event was just consumed (that event wakes a
// sleeping PumpData). A Dial or DialAsync counts from the moment it is
// called. Pump, by contrast, blocks until Close.
func (p *Pool) PumpData(fn DataFunc) (int, error) { return p.pumpBlocking(nil, fn, nil) }

// PumpSpin busy-polls the ring up to iters times and delivers the first
// batch it finds (non-data events to Config.OnEvent, as PumpData); it
// never sleeps. n == 0 means nothing arrived yet.
func (p *Pool) PumpSpin(iters int, fn DataFunc) (int, error) { return p.pumpOnce(fn, nil, iters) }

// PumpNowait makes one non-blocking pass: it delivers what is pending
// (non-data events to Config.OnEvent, as PumpData) and returns at once.
func (p *Pool) PumpNowait(fn DataFunc) (int, error) { return p.pumpOnce(fn, nil, 1) }

// PumpEventsNowait is PumpNowait for every event kind.
func (p *Pool) PumpEventsNowait(fn EventFunc) (int, error) { return p.pumpOnce(nil, fn, 1) }

// PumpStamped is PumpData whose callback also gets the message's stage
// stamps: zero unless the message was sampled (Config.SampleEvery), so a
// caller can relate its own clock (an exchange timestamp, say) to the
// moment the kernel handed over the bytes. It blocks until at least one
// message was delivered, allocates nothing per message, and records the
// sampled messages in Metrics like the other pumps.
func (p *Pool) PumpStamped(fn StampedFunc) (int, error) { return p.pumpStamped(fn) }

// Metrics returns the pool's stage latency histograms, cumulative since
// NewPool, and its counters. The histograms hold the sampled messages
// (Config.SampleEvery; empty when sampling is off) that a pump has passed;
// samples a pump call is still working on appear when it returns. Safe
// from any goroutine, also during and after Close (the counters then keep
// their final values).
func (p *Pool) Metrics() Metrics { return p.metrics(false) }

// MetricsInterval is Metrics with the histograms of the interval since the
// previous MetricsInterval call (or NewPool), for dashboards that want
// per-interval latency; it starts a new interval. The counters stay
// cumulative, and Metrics (and WritePrometheus) are not affected.
func (p *Pool) MetricsInterval() Metrics { return p.metrics(true) }

// WritePrometheus writes Metrics in the Prometheus text format with the
// label pool="<Config.Name>": see WriteMetricsPrometheus for the families.
func (p *Pool) WritePrometheus(w io.Writer) error {
	if w == nil {
		return errNilWriter
	}
	m := p.Metrics()
	return writePrometheus(w, p.name(), &m)
}
