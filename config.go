package talaris

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"
	"unicode/utf8"

	"github.com/talaris-go/talaris/internal/testhook"
)

// WaitStrategy says how the loop thread and the pump wait when they have
// nothing to do (Config.Wait).
type WaitStrategy uint8

const (
	// WaitAdaptive, the zero value and the default, spins only while
	// traffic is recent, then sleeps. The pump spins up to SpinTime for
	// events when its previous wait for events ended within SpinTime, and
	// sleeps at once otherwise. The loop spins up to SpinTime after
	// publishing events to a pump that is awake, for the command a
	// callback may send in answer (an order acknowledged, the next order),
	// while the previous answer came within SpinTime; so such a send finds
	// the loop awake and needs no eventfd write. After a send, both sides
	// spin up to Tuning.ReplySpin for its answer while answers come that
	// fast. Both spins yield the CPU (sched_yield) as they go, so on a busy
	// machine they do not hold off the thread they wait for. An idle Pool,
	// or one that only reads a feed slower than one message per SpinTime,
	// does not spin at all.
	//
	// It is the default because WaitBlock wakes a sleeping thread three
	// times per order round trip, while WaitSpin and WaitSpinThenBlock
	// keep threads spinning on CPUs the peer or the feed may need
	// (docs/notes/2026-12-wait-strategies.md, "Wait strategies", has the
	// measurements).
	WaitAdaptive WaitStrategy = iota
	// WaitBlock sleeps in the kernel at once.
	WaitBlock
	// WaitSpin never sleeps: lowest latency, one core burned per side.
	WaitSpin
	// WaitSpinThenBlock spins for SpinTime, then sleeps.
	WaitSpinThenBlock
)

// Config configures a Pool and its C loop. The zero value is usable; every
// zero field takes the default written beside it. NewPool maps the arena
// and the receive slots without touching them: their pages fault in as
// data first passes them (Tuning.Prefault populates them up front
// instead). docs/notes/2026-12-redesign-and-record-layer-bench.md has the
// RSS and time NewPool measured either way.
//
// MaxSendQueue bounds the bytes one connection may have accepted but not
// yet written to its socket (ConnStats.SendQueued: payload bytes; a ping
// or pong counts 14 more). A Send*, Ping or Pong that would pass it
// returns ErrWouldBlock at once, without a round trip to the loop (a
// message larger than MaxSendQueue is accepted when nothing is queued);
// SendContext waits for room instead. Each connection has its own queue
// in the loop, so one connection whose peer stops reading never delays
// another connection's sends, dials or closes, and the command ring is
// emptied by the loop as fast as Go fills it.
type Config struct {
	MaxConns         uint32        // connections a Pool can hold at once (1024)
	MaxMessageSize   uint64        // largest message accepted, else close 1009 (16 MiB)
	MaxSendQueue     uint64        // unsent bytes one connection may hold before Send* returns ErrWouldBlock (64 MiB); see above
	HandshakeTimeout time.Duration // TCP+TLS+upgrade limit for a dial (10s)
	CloseTimeout     time.Duration // a close's bound: the queued sends' drain and the peer's close frame, also in Pool.Close (5s)

	BufSize   uint32 // bytes per provided receive buffer (16 KiB); a power of two
	BufCount  uint32 // provided receive buffers, a power of two <= 32768 (1024)
	ArenaSize uint64 // bytes of payload arena shared by all connections (64 MiB, or more for 2 x MaxMessageSize); a power of two

	// Loops is the number of loop threads (1), each with its own
	// io_uring, event ring, command ring, arena and receive buffers of the
	// sizes above (memory grows Loops times): connections are spread over
	// them, each living on one loop for its whole life (so its order is
	// kept), a new one on the loop with the fewest; one pump goroutine
	// drains them all, taking at most a connection's share of the event
	// ring (256 events) from each loop per pass. MaxConns is split between
	// them; at most 64. More loops split the loop work (the busiest thread,
	// which bounds throughput given a core each), at some more CPU per
	// message: worth it only with cores to spare for them
	// (docs/notes/2026-12-loop-threads.md, "Loop threads per Pool", has
	// the measurements).
	Loops int
	// LoopCPUs pins loop i's thread to LoopCPUs[i] (-1: not pinned);
	// loops past its end are not pinned (empty, the default: none is).
	// With Tuning.InlineLoop, LoopCPUs[0] pins the goroutine that runs the
	// loop, until the Pool's Close restores its thread's previous mask.
	LoopCPUs []int
	// Wait is how the loop thread and the pump wait for work (WaitAdaptive).
	Wait     WaitStrategy
	SpinTime time.Duration // spin period for WaitSpinThenBlock, most WaitAdaptive spins (20us)

	// SampleEvery turns on the stage stamps of Pool.Metrics and
	// Pool.PumpStamped: the loop stamps one receive completion in
	// SampleEvery (1: every completion; 0: off, the default), and the
	// first data message that completion's bytes yield carries the stamps.
	// Off costs one predictable branch per completion and per message.
	SampleEvery uint32
	// Name labels the pool in Pool.WritePrometheus (pool="<Name>") and in
	// its log records. Default "".
	Name string
	// Logger receives connection lifecycle records (dialing, TLS done,
	// open, closed, failed with the error's class) at Info and Warn; never
	// a record per message. nil (the default) logs nothing. Records are
	// written by the dialing goroutine and by the pumping goroutine when
	// it passes a non-data event.
	Logger *slog.Logger
	// OnEvent, if set, receives every event that is not a data message
	// (open, ping, pong, close, error) from the pumps that take a DataFunc
	// (PumpData, PumpDataNowait): on the pumping goroutine, in order with the
	// data. Pump delivers every event to its own EventFunc and does not
	// call it. Nil: those events are consumed without a callback.
	OnEvent EventFunc

	// Tuning holds the switches measured to be best at their zero value.
	Tuning Tuning

	// knobs are the test and benchmark settings of internal/testhook
	// (testhook.SetKnobs); nil: every one at its default.
	knobs *testhook.Knobs
}

// Tuning holds switches whose zero value is the measured best; these are
// for benchmarks and unusual hosts. The measurements behind each default
// are in docs/notes/, named at each field.
type Tuning struct {
	// ReplySpin is how long after a send the pump and the loop spin for
	// its answer before they sleep, under WaitAdaptive (300us; negative:
	// never). Taken only while the latest send is unanswered, and only
	// while answers have been coming within ReplySpin (a spin that ends
	// empty turns it off until one does again), so an idle Pool, a feed
	// reader and a Pool that sends into silence do not spin. It saves the
	// wake-ups of a sleeping loop and pump per answer, which cost most
	// where idle CPUs halt (docs/notes/2026-12-wait-strategies.md, "The
	// reply spin", has the measurements).
	ReplySpin time.Duration
	// MinWait turns on minimum-wait batching of the loop's waits while a
	// flood streams in (kernel 6.12+, IORING_FEAT_MIN_TIMEOUT; older
	// kernels wait as without it). After several waits in a row that
	// each followed at least BufSize received bytes, and no send since,
	// the loop asks the kernel to wait up to MinWait for 8 completions
	// before it takes what came, so the socket fills meanwhile and each
	// wake-up (and publish to the pump) carries more. Data that comes
	// while it waits is delayed by at most MinWait; a lone message, a
	// ping-pong or a feed slower than BufSize per wait never turns it on.
	// 0 (the default) or negative: off. For consumers bound by throughput
	// per CPU, not for trading ones: fewer wake-ups mean less CPU per
	// frame, at the price of up to MinWait of added latency inside a flood
	// (docs/notes/2026-12-wait-strategies.md, "Minimum-wait batching", has
	// the measurements).
	MinWait time.Duration
	// Prefault populates the payload arena (ArenaSize) and the receive
	// slots (BufSize x BufCount) when the Pool is made, so no receive or
	// pump ever takes a first-touch page fault on them. Off (the
	// default), their pages fault in the first time data passes them, and
	// NewPool does not populate their 80 MiB (at the default sizes) up
	// front. The faults are one per 4 KiB page, once: the arena is a ring,
	// so after the first ArenaSize bytes of payload there are none. A
	// trading service that warms up before it trades can leave it off;
	// one whose first messages must not fault sets it.
	Prefault bool
	// NoTLSRecordLayer turns off talaris' own TLS record layer. By
	// default, on a TLS 1.3 connection with an AES-128-GCM or AES-256-GCM
	// suite, once the library has read the first application data (and
	// the session tickets before it), the loop opens the server's records
	// itself with the library's AES-GCM, straight from the receive
	// buffers into the plaintext buffers the parser reads: no copy into
	// and out of the library's record buffer. KeyUpdate, session tickets
	// and alerts are handled as the library would. TLS 1.2 and other
	// suites always use the library's SSL_read. Metrics.TLSRecords counts
	// the records it opened (docs/notes/2026-12-tls-receive-path.md, "Our
	// own record layer", has the measurements).
	NoTLSRecordLayer bool
	// NoOwnGCM makes the record layer decrypt with the TLS library's
	// AES-GCM. By default, on a CPU with VAES and VPCLMULQDQ (AMD Zen 3
	// and later, Intel Ice Lake and later; checked with CPUID), it uses
	// talaris' own AES-GCM decryption on 256-bit vectors (csrc/crypto/gcm.c,
	// tested against the library's on every build) when its power-on
	// self-test passed and, in a race run once per process at NewPool, it
	// opened records faster than the library's; elsewhere the library's
	// (docs/notes/2026-12-tls-receive-path.md, "Our own AES-GCM", has the
	// measurements). Encryption (the write side) is always the
	// library's. Metrics.TLSRecordsOwnGCM counts the records it opened.
	NoOwnGCM bool
	// InlineLoop runs the loop without a thread of its own (opt-in; off):
	// the goroutine that calls NewPool is locked to its OS thread
	// (runtime.LockOSThread, until it calls Pool.Close), the io_uring is
	// created on that thread, and that goroutine's Pump calls run the loop
	// themselves - one cgo call per batch of events, which waits in the
	// kernel when there is nothing to do - so a message wakes one thread,
	// not the loop thread and then the pump. Connections make progress
	// only while that goroutine pumps, dials, sends or closes. From
	// another goroutine: Pump returns ErrNotLoopThread (once it would
	// have to run the loop: events already published are delivered), Dial
	// waits for that goroutine's pump (when its context ends first it
	// returns ErrTimeout and the connection never opens), Send* return
	// ErrWouldBlock while the command ring is full, and Close closes the
	// sockets without their close handshakes. Loops must be 1.
	// Config.LoopCPUs[0] pins that goroutine's thread, which is the
	// loop's. Measurements: docs/notes/2026-12-inline-loop.md, "Inline
	// loop".
	InlineLoop bool
}

// settings is a Config with every default applied and the testhook
// knobs resolved: what a Pool runs with.
type settings struct {
	Config
	testhook.Knobs
	loopWait, consumerWait WaitStrategy // Knobs.LoopWait/ConsumerWait, else Config.Wait
}

// defaults is the one table of Config defaults: withDefaults fills every
// zero field from it, the decoder (testhook.NewDecoder) takes
// MaxMessageSize from it, and the C loop always receives the resulting
// explicit values. Keep the values written beside the Config fields in
// step.
var defaults = Config{
	BufSize:  16 << 10,
	BufCount: 1024,
	SpinTime: 20 * time.Microsecond,
	Tuning: Tuning{
		ReplySpin: 300 * time.Microsecond,
		// Minimum-wait batching: off (negative) until measured to win;
		// docs/notes/2026-12-wait-strategies.md, "Minimum-wait batching".
		MinWait: -1,
	},
	ArenaSize:        64 << 20,
	MaxConns:         1024,
	MaxMessageSize:   16 << 20,
	HandshakeTimeout: 10 * time.Second,
	CloseTimeout:     5 * time.Second,
	MaxSendQueue:     64 << 20,
	SampleEvery:      0, // off: stamping is opt-in
	// One loop thread: more were measured no faster where the feed shares
	// the machine, at more CPU per message;
	// docs/notes/2026-12-loop-threads.md, "Loop threads per Pool".
	Loops: 1,
}

// knobDefaults is the table of testhook.Knobs defaults, as defaults is
// for Config. CQEntries is derived (cqPerSQ x SQEntries); SQPollCPU has
// none (it is read only with RingSQAff).
var knobDefaults = testhook.Knobs{
	SQEntries:          256,
	RingFlags:          testhook.RingSingleIssuer | testhook.RingDeferTaskrun,
	SQPollIdle:         time.Millisecond,
	MinWaitCompletions: 8,
	EventRingSize:      1 << 16,
	CmdRingSize:        4 << 20,
	// A flood's share of the ring: 256 events is some microseconds of
	// pumping ahead of another connection's message. The orders round
	// trip beside a flood grows with the share, while floods ran no
	// faster with larger ones; docs/notes/2026-12-receive-fairness.md,
	// "Receive fairness", has the shares measured (64..4096).
	MaxConnPendingEvents: 256,
	MaxConnPendingBytes:  4 << 20,
}

// The ReconnectPolicy defaults (MinDelay 100ms, MaxDelay 30s or MinDelay
// if larger, MaxAttempts 0: forever) are in defaultReconnect in
// reconnect.go, beside the type.

// Derived defaults and the decoder's sizes.
const (
	cqPerSQ             = 4                     // CQEntries = cqPerSQ x SQEntries
	decoderEventRing    = 1 << 12               // events in a decoder's ring
	decoderMinArenaSize = 1 << 20               // a decoder's arena: at least this, and 2 x its largest message
	directMax           = 64 << 10              // the largest message a direct send writes (testhook.Knobs.NoDirectSend)
	reapWait            = 10 * time.Millisecond // a failed Dial waits this long at most for its final event, to pass it itself (reapFailed)
	bellWindow          = 2 * time.Millisecond  // a pump sleeps on its doorbell this long after a direct send (Knobs.ReplyDoorbell)
	bellSpinTimes       = 5                     // after a doorbell wake-up the pump spins up to this many SpinTimes for the loop's publish
	maxLoops            = 64                    // Config.Loops at most (the pump's futex_waitv takes 128 words)
)

// arenaFor returns the smallest power of two >= min that holds two
// messages of maxMessage bytes.
func arenaFor(min, maxMessage uint64) uint64 {
	a := min
	for a < 2*maxMessage {
		a *= 2
	}
	return a
}

// withDefaults returns c with every zero field set from defaults and the
// knobs resolved, or ErrInvalidConfig when the result cannot work.
func (c *Config) withDefaults() (settings, error) {
	d := settings{Config: *c}
	d.knobs = nil
	if c.knobs != nil {
		d.Knobs = *c.knobs
	}
	def, kdef := &defaults, &knobDefaults
	setU32 := func(v *uint32, dv uint32) {
		if *v == 0 {
			*v = dv
		}
	}
	setU64 := func(v *uint64, dv uint64) {
		if *v == 0 {
			*v = dv
		}
	}
	setDur := func(v *time.Duration, dv time.Duration) {
		if *v == 0 {
			*v = dv
		}
	}
	setU32(&d.SQEntries, kdef.SQEntries)
	setU32(&d.CQEntries, cqPerSQ*d.SQEntries)
	setU32(&d.RingFlags, kdef.RingFlags)
	if d.RingFlags&testhook.RingFlagsNone != 0 {
		d.RingFlags = 0
	}
	setDur(&d.SQPollIdle, kdef.SQPollIdle)
	setU32(&d.BufSize, def.BufSize)
	setU32(&d.BufCount, def.BufCount)
	d.loopWait, d.consumerWait = d.Wait, d.Wait
	waitKnob := func(k int, w *WaitStrategy) bool {
		if k != 0 {
			*w = WaitStrategy(k - 1)
		}
		return k >= 0 && k <= int(WaitSpinThenBlock)+1
	}
	okWaits := waitKnob(d.Knobs.LoopWait, &d.loopWait) && waitKnob(d.Knobs.ConsumerWait, &d.consumerWait)
	setDur(&d.SpinTime, def.SpinTime)
	setDur(&d.Tuning.ReplySpin, def.Tuning.ReplySpin)
	setDur(&d.Tuning.MinWait, def.Tuning.MinWait)
	if d.MinWaitCompletions == 0 {
		d.MinWaitCompletions = kdef.MinWaitCompletions
	}
	setU32(&d.EventRingSize, kdef.EventRingSize)
	setU64(&d.MaxMessageSize, def.MaxMessageSize)
	setU64(&d.ArenaSize, arenaFor(def.ArenaSize, d.MaxMessageSize))
	setU32(&d.CmdRingSize, kdef.CmdRingSize)
	setU32(&d.MaxConns, def.MaxConns)
	setDur(&d.HandshakeTimeout, def.HandshakeTimeout)
	setDur(&d.CloseTimeout, def.CloseTimeout)
	setU64(&d.MaxSendQueue, def.MaxSendQueue)
	setU32(&d.MaxConnPendingEvents, kdef.MaxConnPendingEvents)
	setU64(&d.MaxConnPendingBytes, kdef.MaxConnPendingBytes)
	if d.Loops == 0 {
		d.Loops = def.Loops
	}
	// A copy: the Pool must not see a caller's later writes.
	d.LoopCPUs = append([]int(nil), d.LoopCPUs...)
	pow2 := func(v uint64) bool { return v != 0 && v&(v-1) == 0 }
	switch {
	case d.Wait > WaitSpinThenBlock || !okWaits:
		return d, fmt.Errorf("%w: unknown Wait strategy", ErrInvalidConfig)
	case !pow2(uint64(d.BufSize)) || !pow2(uint64(d.BufCount)) || d.BufCount > 32768:
		return d, fmt.Errorf("%w: BufSize and BufCount must be powers of two, BufCount <= 32768", ErrInvalidConfig)
	case !pow2(uint64(d.EventRingSize)) || !pow2(d.ArenaSize) || !pow2(uint64(d.CmdRingSize)):
		return d, fmt.Errorf("%w: EventRingSize, ArenaSize and CmdRingSize must be powers of two", ErrInvalidConfig)
	case d.MaxMessageSize > d.ArenaSize/2:
		return d, fmt.Errorf("%w: MaxMessageSize must be at most ArenaSize/2", ErrInvalidConfig)
	case d.CmdRingSize < 4096:
		return d, fmt.Errorf("%w: CmdRingSize must be at least 4096", ErrInvalidConfig)
	case d.MaxConns > 1<<20:
		return d, fmt.Errorf("%w: MaxConns must be at most 1<<20", ErrInvalidConfig)
	case d.Loops < 0 || d.Loops > maxLoops:
		return d, fmt.Errorf("%w: Loops must be between 0 and %d", ErrInvalidConfig, maxLoops)
	case uint32(d.Loops) > d.MaxConns:
		return d, fmt.Errorf("%w: Loops must be at most MaxConns (each loop holds a share of them)", ErrInvalidConfig)
	case d.Tuning.InlineLoop && d.Loops != 1:
		return d, fmt.Errorf("%w: InlineLoop needs Loops 1", ErrInvalidConfig)
	case len(d.LoopCPUs) > d.Loops:
		return d, fmt.Errorf("%w: LoopCPUs has more entries than Loops", ErrInvalidConfig)
	case d.Tuning.MinWait > 0 && d.Tuning.MinWait < time.Microsecond, d.Tuning.MinWait > time.Second:
		return d, fmt.Errorf("%w: MinWait must be between 1us and 1s (or negative: off)", ErrInvalidConfig)
	case d.MinWaitCompletions < 2 || d.MinWaitCompletions > 1<<16:
		return d, fmt.Errorf("%w: MinWaitCompletions must be between 2 and 65536", ErrInvalidConfig)
	case !utf8.ValidString(d.Name):
		return d, fmt.Errorf("%w: Name must be valid UTF-8 (it is a Prometheus label value)", ErrInvalidConfig)
	}
	return d, nil
}

// TLSOptions configures certificate verification for wss:// URLs.
// Verification against the system CA store, with SNI and host name check, is
// the default. The host name is matched against the certificate's
// subjectAltName DNS and IP entries only, never its subject CN. Every
// certificate among the roots is a trust anchor, also a self-signed leaf
// that is not a CA (as in crypto/tls). docs/ARCHITECTURE.md ("TLS") has
// the table of verdicts. Bad values make Dial fail with ErrInvalidConfig
// (checked in tls_options.go).
type TLSOptions struct {
	RootCAFile         string // PEM file of trusted roots, replaces the system store
	RootCAPEM          []byte // PEM of trusted roots, replaces the system store
	ServerName         string // name sent in SNI and checked in the certificate (default: URL host)
	InsecureSkipVerify bool   // accept any certificate: for tests only (Pins are still checked)

	// Client certificate (mutual TLS): PEM certificate, optionally followed
	// by its chain, and its RSA or ECDSA private key (PKCS#1, SEC 1 or
	// PKCS#8), in memory or in files; one of each kind.
	ClientCertPEM, ClientKeyPEM   []byte
	ClientCertFile, ClientKeyFile string

	// MinVersion is tls.VersionTLS12 (also 0) or tls.VersionTLS13.
	MinVersion uint16

	// CipherSuites lists crypto/tls suite IDs, TLS 1.2 (ECDHE with AES-GCM,
	// ChaCha20-Poly1305 or AES-CBC-SHA) and TLS 1.3 ones, in preference
	// order. A version none of whose suites is listed is disabled. With
	// BoringSSL (the default backend) the TLS 1.3 entries only switch TLS
	// 1.3 on: BoringSSL always offers its three TLS 1.3 suites in its own
	// order (AES-GCM first where the CPU has AES instructions). nil means
	// the default: TLS 1.3 AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305, then
	// TLS 1.2 ECDHE AES-GCM, ChaCha20-Poly1305 and AES-CBC-SHA, with
	// ChaCha20-Poly1305 first in each version where the CPU has no AES
	// instructions (golang.org/x/sys/cpu).
	CipherSuites []uint16

	// Pins are SHA-256 digests of a SubjectPublicKeyInfo (base64 of one is
	// what `openssl x509 -pubkey | openssl pkey -pubin -outform DER |
	// openssl dgst -sha256 -binary` prints). When set, the server's leaf key
	// must match one of them, after and in addition to the chain check, on
	// resumed handshakes and with InsecureSkipVerify too; else ErrTLSPin.
	Pins [][]byte
}

// DialOptions configures one connection. A nil *DialOptions means defaults.
type DialOptions struct {
	Header       http.Header // extra request headers (not Upgrade, Connection, Sec-WebSocket-*)
	Subprotocols []string    // offered in Sec-WebSocket-Protocol
	TLS          TLSOptions
	// HandshakeTimeout overrides Config.HandshakeTimeout for this dial
	// (each attempt, under a reconnect policy).
	HandshakeTimeout time.Duration
	// CloseTimeout overrides Config.CloseTimeout for this connection: how
	// long Conn.Close (and Pool.Close) wait for the queued messages to
	// drain and the server's close frame to come. 0: Config.CloseTimeout.
	CloseTimeout time.Duration
	// LocalAddr is the source address the connection's socket is bound to
	// before it connects: an IP address ("127.0.0.2", "::1") or an IP and
	// port ("127.0.0.2:9000", "[::1]:9000"). Empty: the kernel chooses.
	// Only the server's addresses of LocalAddr's family are tried.
	LocalAddr string
	// Resolver looks up a host name (nil: net.DefaultResolver). Every
	// address found is tried in turn, IPv4 first, until one connects; the
	// handshake timeout and Dial's context bound them all.
	Resolver *net.Resolver
	// Proxy returns the proxy to dial through, in the shape of
	// http.Transport.Proxy and gorilla's Dialer.Proxy (http.ProxyFromEnvironment
	// and http.ProxyURL fit). It is called once per Dial with a GET
	// request whose URL is the target's, ws mapped to http and wss to
	// https; a nil func or a nil URL dials directly. Schemes:
	//   - http://host:port: HTTP CONNECT host:port (with a Host header and,
	//     from the URL's user info, Proxy-Authorization: Basic);
	//   - socks5://host:port: SOCKS5 (RFC 1928) to the target's resolved
	//     address (the first one; Resolver looks it up);
	//   - socks5h://host:port: SOCKS5 with the target's name, resolved by
	//     the proxy.
	// SOCKS5 offers no authentication, and username/password (RFC 1929)
	// when the URL has user info. https:// proxies are refused (ErrProxy):
	// the loop runs one TLS session per connection. The proxy's name is
	// looked up with Resolver, every address tried in turn; the loop runs
	// the proxy's handshake within the handshake timeout, then TLS (with
	// the target's name for SNI and verification) and the upgrade through
	// the tunnel. Each reconnect goes through the proxy again. Failures of
	// the proxy (unreachable, refused, malformed, timed out) are a
	// *ProxyError matching ErrProxy.
	Proxy func(*http.Request) (*url.URL, error)
	// PingInterval, when set, makes the loop send a ping whenever nothing
	// has arrived on the open connection for that long (and again every
	// interval while the silence lasts): a heartbeat that keeps idle
	// connections (and the NATs and proxies on the way) alive and, with
	// ReadTimeout, detects a dead peer. 0 (the default): no pings. At
	// least 1ms.
	PingInterval time.Duration
	// ReadTimeout, when set, fails the open connection when nothing at
	// all (data, ping, pong, anything) has been received for that long:
	// the final event is EventError wrapping ErrReadTimeout with Code
	// 1006, without waiting for a close handshake. Set PingInterval below
	// it so a healthy idle peer answers in time. Time during which the
	// loop itself holds the connection's input back (the pump lags) does
	// not count. 0 (the default): no timeout. At least 1ms.
	ReadTimeout time.Duration
	// Reconnect, when set, makes the loop re-dial after every drop, with
	// backoff; the Conn handle stays valid (see ReconnectPolicy). Zero
	// delays take the defaults written beside ReconnectPolicy's fields.
	Reconnect *ReconnectPolicy
	// Subscribe holds text messages (valid UTF-8, 1 MiB in all) the loop
	// sends after every open, the first included, before anything the
	// application sends: the subscription a feed needs again after each
	// reconnect. They count in ConnStats.MsgsOut.
	Subscribe [][]byte
	// Label names the connection in Metrics.Conns and, as the conn label,
	// in the talaris_conns_open, talaris_send_queued_bytes and
	// talaris_send_queued_messages series of Pool.WritePrometheus (see
	// Metrics.EachGauge): printable UTF-8 of at most 64 bytes. Connections
	// sharing a label are summed under it. Empty (the default): the
	// connection counts only in the pool's totals.
	Label string
}

// dialDefaults is the table of DialOptions defaults, as defaults is for
// Config: a zero PingInterval and ReadTimeout mean off, a zero
// HandshakeTimeout means Config.HandshakeTimeout.
var dialDefaults = DialOptions{PingInterval: 0, ReadTimeout: 0}

// minHeartbeat is the shortest PingInterval or ReadTimeout accepted: the
// loop checks heartbeats on a timer, and a shorter period would keep it
// busy with nothing but pings.
const minHeartbeat = time.Millisecond

// checkHeartbeat validates the heartbeat options of a dial.
func (o *DialOptions) checkHeartbeat() error {
	for _, v := range []struct {
		name string
		d    time.Duration
	}{{"PingInterval", o.PingInterval}, {"ReadTimeout", o.ReadTimeout}} {
		if v.d != 0 && v.d < minHeartbeat {
			return fmt.Errorf("%w: DialOptions.%s %v must be 0 (off) or at least %v", ErrInvalidConfig, v.name, v.d, minHeartbeat)
		}
	}
	if o.HandshakeTimeout < 0 {
		return fmt.Errorf("%w: DialOptions.HandshakeTimeout %v is negative", ErrInvalidConfig, o.HandshakeTimeout)
	}
	if o.CloseTimeout < 0 {
		return fmt.Errorf("%w: DialOptions.CloseTimeout %v is negative", ErrInvalidConfig, o.CloseTimeout)
	}
	if err := checkConnLabel(o.Label); err != nil {
		return err
	}
	return nil
}
