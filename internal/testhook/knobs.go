package testhook

import "time"

// Knobs are the loop's settings that no service needs: io_uring sizes and
// setup flags, ring sizes, a connection's share of the event ring, and the
// switches of experiments that measured no better than the default. The
// benchmark CLI and the tests set them with SetKnobs; a zero field keeps
// the default (config.go's knobDefaults table).
type Knobs struct {
	SQEntries  uint32        // io_uring submission queue entries (256)
	CQEntries  uint32        // completion queue entries (4 x SQEntries)
	RingFlags  uint32        // Ring* setup flags (RingSingleIssuer|RingDeferTaskrun); RingFlagsNone: none
	SQPollIdle time.Duration // SQPOLL kernel thread idle time before it sleeps (1ms)
	SQPollCPU  int           // CPU for the SQPOLL thread when RingSQAff is set (-1: unpinned)

	// LoopWait and ConsumerWait set the loop's and the pump's wait apart:
	// 0 follows Config.Wait, otherwise the value is 1 + the
	// talaris.WaitStrategy.
	LoopWait, ConsumerWait int

	MinWaitCompletions int // completions a minimum-wait batch waits for at most (8; at least 2)

	EventRingSize        uint32 // events in the C->Go ring, a power of two (65536)
	CmdRingSize          uint32 // bytes of the Go->C command ring, a power of two (4 MiB)
	MaxConnPendingEvents uint32 // events one connection may have pending in the ring (256)
	MaxConnPendingBytes  uint64 // payload bytes one connection may have pending in the ring (4 MiB)

	NoRecvBundle  bool // one receive buffer per completion instead of recv bundles
	ReplyDoorbell bool // the pump's reply doorbell (epoll on the sockets it sent on)
	NoRecvProbe   bool // the loop never probes silent recvs (a lost recv completion stays lost)

	// NoDirectSend makes every send go through the loop thread. By
	// default a text or binary message of at most 64 KiB sent on an open
	// ws:// connection whose send queue is empty, and whose socket the
	// loop is not writing, is framed and written by the calling goroutine
	// itself (one send(2) on the non-blocking socket; what the socket
	// does not take is handed to the loop, in order): the loop is neither
	// woken nor needed for it. wss:// connections always send through the
	// loop (it alone uses the TLS session).
	NoDirectSend bool
}

// Setup flags for the io_uring instance (Knobs.RingFlags): the kernel's
// IORING_SETUP_* flags of the same names.
const (
	RingSQPoll       uint32 = 1 << 1
	RingSQAff        uint32 = 1 << 2
	RingCoopTaskrun  uint32 = 1 << 8
	RingTaskrunFlag  uint32 = 1 << 9
	RingSingleIssuer uint32 = 1 << 12
	RingDeferTaskrun uint32 = 1 << 13
	// RingFlagsNone asks for no setup flag at all (a zero RingFlags means
	// the default).
	RingFlagsNone uint32 = 1 << 31
)

// SetKnobs stores a copy of k in the *talaris.Config cfg (nil clears it).
// Package talaris sets it.
var SetKnobs func(cfg any, k *Knobs)

// WithKnobs returns cfg, a talaris.Config, with k stored in it (SetKnobs),
// for use inside an expression.
func WithKnobs[C any](cfg C, k Knobs) C {
	SetKnobs(&cfg, &k)
	return cfg
}
