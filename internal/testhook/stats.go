package testhook

import "io"

// PoolStats are a Pool's loop counters, the operational ones (also in
// talaris.Metrics) and those of the experiments the tests and the bench
// watch.
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
	FairHolds  uint64 // times a connection was held at its share of the ring (Knobs.MaxConnPendingEvents/Bytes; also counted in Stalls)
	TLSRecords uint64 // TLS application-data records opened by the own record layer
	// TLSRecordsOwnGCM counts those of TLSRecords decrypted with the own
	// AES-GCM, not the TLS library's.
	TLSRecordsOwnGCM uint64
	// BellSleeps counts the pump's sleeps on its reply doorbell (also
	// counted in PumpSleeps); BellRings the wake-ups from them that a
	// socket's data gave before the loop's publish (Knobs.ReplyDoorbell).
	BellSleeps, BellRings uint64
	// ReplySpins counts the pump's spins for the answer to a send
	// (Tuning.ReplySpin); ReplyLate those that ended without one (each
	// turns the reply spin off until an answer again comes in time).
	ReplySpins, ReplyLate uint64
	// MinWaits counts the loop's waits that were batched (Tuning.MinWait).
	MinWaits uint64
	// RecvRevived counts receives the loop's probe found silent on a
	// ready socket and armed again (talaris.Metrics.RecvRevived).
	RecvRevived uint64
}

// Stats returns the counters of *talaris.Pool pool. Package talaris sets
// it (linux and cgo only; nil elsewhere).
var Stats func(pool any) PoolStats

// WritePrometheus writes m, a talaris.Metrics, in the Prometheus text
// format with the label pool="<pool>": what Pool.WritePrometheus writes
// for a pool's own snapshot, here for one a test made up. Package talaris
// sets it.
var WritePrometheus func(w io.Writer, pool string, m any) error

// LoopCounters are the loop's internal counters in a talaris.Metrics
// snapshot: no exported fields there, but reported by
// Metrics.EachCounter and the Prometheus output under their names
// (talaris_events_total ...). A test reads them live from Stats.
type LoopCounters struct {
	Events      uint64 // events published to the ring (messages, control frames, lifecycle)
	Completions uint64 // io_uring completions handled by the loop
	Rearms      uint64 // multishot recvs re-armed after ending without IORING_CQE_F_MORE
	NoBufs      uint64 // recvs ended by -ENOBUFS (the provided-buffer ring ran dry)
	Stalls      uint64 // times the loop held input back because the event ring or arena was full
	Batches     uint64 // tail publishes of the event ring
	PumpSleeps  uint64 // times the pump slept waiting for events
	LoopWakes   uint64 // times Go woke the sleeping loop
}

// SetLoopCounters stores c in *talaris.Metrics m, for a test that makes
// up a snapshot. Package talaris sets it.
var SetLoopCounters func(m any, c LoopCounters)
