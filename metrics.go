package talaris

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/talaris-go/talaris/internal/testhook"
)

// Stage is one leg of a sampled message's way from the kernel to the
// callback. Stamps are CLOCK_MONOTONIC nanoseconds.
type Stage uint8

// The stages of Metrics.Stages.
const (
	// StageCQEToPlaintext: the loop saw the receive completion -> the
	// message's bytes reached the parser as plaintext (after TLS; on plain
	// connections 0 unless the bytes waited behind a stall).
	StageCQEToPlaintext Stage = iota
	// StagePlaintextToPublish: plaintext ready -> the event was published
	// to the ring (frame parsing, reassembly, the batch's tail store).
	StagePlaintextToPublish
	// StagePublishToCallback: published -> the pump called the callback
	// (ring hand-off, pump wake-up, earlier callbacks of the batch).
	StagePublishToCallback
	// StageCQEToCallback: completion seen -> callback, the whole in-process path.
	StageCQEToCallback
	// StageWireToCallback: the kernel's software receive timestamp of the
	// data -> callback. Recorded only for messages that carry a wire stamp.
	StageWireToCallback

	// NumStages is the number of stages.
	NumStages = 5
)

var stageNames = [NumStages]string{
	"cqe_to_plaintext", "plaintext_to_publish", "publish_to_callback", "cqe_to_callback", "wire_to_callback",
}

// String returns the stage's name as used in the Prometheus stage label,
// for example "cqe_to_callback".
func (s Stage) String() string {
	if int(s) < len(stageNames) {
		return stageNames[s]
	}
	return "stage(" + strconv.Itoa(int(s)) + ")"
}

// NumLatencyBuckets is the number of finite upper bounds of
// StageHistogram.Buckets.
const NumLatencyBuckets = 25

// latencyBounds: 1-2-5 steps from 100 ns to 10 s.
var latencyBounds = [NumLatencyBuckets]time.Duration{
	100 * time.Nanosecond, 200 * time.Nanosecond, 500 * time.Nanosecond,
	1 * time.Microsecond, 2 * time.Microsecond, 5 * time.Microsecond,
	10 * time.Microsecond, 20 * time.Microsecond, 50 * time.Microsecond,
	100 * time.Microsecond, 200 * time.Microsecond, 500 * time.Microsecond,
	1 * time.Millisecond, 2 * time.Millisecond, 5 * time.Millisecond,
	10 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	1 * time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second,
}

var latencyBoundsNs = func() (b [NumLatencyBuckets]int64) {
	for i, d := range latencyBounds {
		b[i] = int64(d)
	}
	return b
}()

// LatencyBucketBounds returns the upper bounds of StageHistogram.Buckets:
// 100ns, 200ns, 500ns, 1µs, 2µs, 5µs ... 1s, 2s, 5s, 10s (1-2-5 steps). The
// Prometheus exposition uses them, in seconds, as the le labels of
// talaris_stage_latency_seconds; +Inf is Count.
func LatencyBucketBounds() [NumLatencyBuckets]time.Duration { return latencyBounds }

// StageHistogram is a snapshot of one stage's latency histogram.
//
// The histogram behind it keeps three significant digits (values under
// 2048 ns exactly, larger ones to within 1/1024 of the value) up to about
// 68.7 s; Min, Max and Sum are exact (the mean is Sum / Count), the
// quantiles are within that precision.
type StageHistogram struct {
	Count uint64        // sampled messages recorded for this stage
	Sum   time.Duration // exact sum of the recorded latencies
	Min   time.Duration // 0 when Count is 0
	Max   time.Duration

	// Quantiles by nearest rank: the 50th, 90th, 99th, 99.9th and 99.99th
	// percentiles.
	P50, P90, P99, P999, P9999 time.Duration

	// Rejected counts samples whose stamps for this stage went backwards
	// (a later stamp before an earlier one): they are not recorded.
	Rejected uint64

	// Buckets[i] is the number of recorded latencies at or below
	// LatencyBucketBounds()[i] (cumulative, as Prometheus buckets are; the
	// +Inf bucket is Count). A bound above 2 µs is placed to within 0.1%.
	Buckets [NumLatencyBuckets]uint64
}

// Metrics is a snapshot of a Pool's latency histograms, counters and
// gauges.
//
// The stage histograms cover the sampled messages (Config.SampleEvery).
// The counters are the pool-wide ones the loop and the pump keep;
// per-connection counters stay in ConnStats. The gauges (ConnsOpen,
// SendQueuedBytes, SendQueuedMessages, Conns) are the connections' state
// at the snapshot, listed by EachGauge. The fields are what a
// service reads in code; the snapshot also holds the loop's internal
// counters (events, io_uring completions, re-arms, ENOBUFS, stalls,
// batches, pump sleeps, loop wake-ups), which EachCounter and
// Pool.WritePrometheus report with the others.
type Metrics struct {
	// Stages holds one histogram per Stage, indexed by it.
	Stages [NumStages]StageHistogram

	// Sampled is the number of messages whose stamps were folded into Stages.
	Sampled uint64

	// Elapsed is the time the histograms cover: since the pool started,
	// or since the previous interval snapshot for an interval snapshot.
	Elapsed time.Duration

	Messages      uint64 // data messages delivered to the ring
	Bytes         uint64 // their payload bytes
	WireBytes     uint64 // bytes read from the sockets (TLS records and frame headers included)
	SendQueueFull uint64 // times a connection's send queue was full: a send refused or made to wait (ConnStats.SendQueueFull, summed), or the loop's own replies passed MaxSendQueue and it stopped reading
	Reconnects    uint64 // successful re-opens by reconnect policies (DialOptions.Reconnect)
	// SendDropped counts the messages accepted for sending that never
	// reached a socket (ConnStats.SendDropped, summed over every
	// connection ever): a close that timed out with messages queued, a
	// server's close frame, an Abort or a drop. An order desk alerts on it.
	SendDropped uint64
	// RecvRevived counts receives the loop found silent on a ready
	// socket (data waiting, or the peer gone) and armed again: a kernel
	// completion that never came, seen about once in 2000 streams ended by
	// a TCP reset under load. Non-zero is worth a look, not an alarm: the
	// connection went on.
	RecvRevived uint64
	// TLSRecords counts the TLS application-data records opened by
	// talaris' own record layer rather than the library's SSL_read
	// (Config.Tuning.NoTLSRecordLayer turns it off), TLSRecordsOwnGCM
	// those of them decrypted with talaris' own AES-GCM (on CPUs with
	// VAES and VPCLMULQDQ, unless Config.Tuning.NoOwnGCM).
	TLSRecords, TLSRecordsOwnGCM uint64
	// GCMSelfTestFailures is 1 when talaris' own AES-GCM failed its
	// power-on self-test in this process (a miscompile, a CPU erratum, a
	// hypervisor that reports VAES and mis-executes it): the own GCM is
	// then off and the library's opens every record. 0 otherwise,
	// including where the CPU does not run the own GCM at all.
	GCMSelfTestFailures uint64

	// The gauges: read from the pool's connections that have not ended
	// (dialing to closing) when the snapshot is taken, by a scan of the
	// connection slots (nothing is kept per message); zero once Close
	// started.
	//
	// ConnsOpen is the number of connections in StateOpen.
	// SendQueuedBytes and SendQueuedMessages are what Send*, Ping and
	// Pong accepted and the loop has neither written to a socket nor
	// dropped: ConnStats.SendQueued summed (a ping or pong counts 14
	// bytes more than its payload; bytes a memory connection's Inject
	// holds count too), and the messages they are.
	ConnsOpen, SendQueuedBytes, SendQueuedMessages uint64
	// Conns holds the same gauges per DialOptions.Label, one entry per
	// label among the pool's connections (connections sharing a label
	// are summed), sorted by Label; nil when no connection has a label.
	Conns []ConnGauge

	// loop holds the loop's internal counters (see EachCounter).
	loop testhook.LoopCounters
}

// EachCounter calls fn for every counter of m in a fixed order with its
// Prometheus name (talaris_ prefix and _total suffix included), its help
// text and its value: the fields of m and the loop's internal counters
// that are no fields. Pool.WritePrometheus and the prom module's
// Collector both list the counters through it, so the two expositions
// cannot drift apart.
func (m *Metrics) EachCounter(fn func(name, help string, value uint64)) {
	fn("talaris_messages_total", "Data messages delivered to the event ring.", m.Messages)
	fn("talaris_bytes_total", "Payload bytes of the data messages delivered to the event ring.", m.Bytes)
	fn("talaris_wire_bytes_total", "Bytes read from the sockets, TLS records and frame headers included.", m.WireBytes)
	fn("talaris_events_total", "Events published to the event ring.", m.loop.Events)
	fn("talaris_completions_total", "io_uring completions handled by the loop.", m.loop.Completions)
	fn("talaris_rearms_total", "Multishot recvs re-armed after they ended.", m.loop.Rearms)
	fn("talaris_enobufs_total", "Recvs ended by ENOBUFS (provided-buffer ring exhausted).", m.loop.NoBufs)
	fn("talaris_stalls_total", "Times the loop held input back because the event ring or arena was full.", m.loop.Stalls)
	fn("talaris_batches_total", "Event ring tail publishes.", m.loop.Batches)
	fn("talaris_pump_sleeps_total", "Times the pump slept waiting for events.", m.loop.PumpSleeps)
	fn("talaris_loop_wakeups_total", "Times Go woke the sleeping loop.", m.loop.LoopWakes)
	fn("talaris_send_queue_full_total", "Times a connection's send queue was full (a send refused or waiting, or replies past MaxSendQueue stopped its reads).", m.SendQueueFull)
	fn("talaris_reconnects_total", "Successful re-opens by reconnect policies.", m.Reconnects)
	fn("talaris_send_dropped_total", "Messages accepted for sending that never reached a socket (close timeout, server close, abort, drop).", m.SendDropped)
	fn("talaris_recv_revived_total", "Receives found silent on a ready socket and armed again (a lost kernel completion).", m.RecvRevived)
	fn("talaris_tls_records_total", "TLS application-data records opened by talaris' own record layer.", m.TLSRecords)
	fn("talaris_tls_records_own_gcm_total", "Of those, records decrypted with talaris' own AES-GCM.", m.TLSRecordsOwnGCM)
	fn("talaris_gcm_selftest_failures_total", "1 when talaris' own AES-GCM failed its power-on self-test and is off for the process.", m.GCMSelfTestFailures)
	fn("talaris_sampled_messages_total", "Messages whose stage stamps were recorded in the latency histograms.", m.Sampled)
}

// ConnGauge is Metrics' gauges for the connections dialed with one
// DialOptions.Label: Label is that label, the other fields are Metrics'
// fields of the same names over those connections only.
type ConnGauge struct {
	Label                                          string
	ConnsOpen, SendQueuedBytes, SendQueuedMessages uint64
}

// EachGauge calls fn for every gauge sample of m in a fixed order with its
// Prometheus name, its help text, its conn label and its value: for each
// of talaris_conns_open, talaris_send_queued_bytes and
// talaris_send_queued_messages, first the pool's value (ConnsOpen,
// SendQueuedBytes, SendQueuedMessages) with conn "", then one value per
// entry of m.Conns with conn its Label. Pool.WritePrometheus and the prom
// module's Collector both list the gauges through it, as gauge families
// labelled pool and, for the per-label samples, conn (the pool's sample
// has no conn label, or an empty one, which Prometheus treats alike).
// The pool's sample includes the labelled connections: sum one or the
// other, not both.
func (m *Metrics) EachGauge(fn func(name, help, conn string, value uint64)) {
	gauges := [...]struct {
		name, help string
		pool       uint64
		conn       func(*ConnGauge) uint64
	}{
		{"talaris_conns_open", "Connections in the open state.", m.ConnsOpen,
			func(g *ConnGauge) uint64 { return g.ConnsOpen }},
		{"talaris_send_queued_bytes", "Bytes accepted by Send*, Ping and Pong not yet written to a socket (ConnStats.SendQueued, summed).", m.SendQueuedBytes,
			func(g *ConnGauge) uint64 { return g.SendQueuedBytes }},
		{"talaris_send_queued_messages", "Messages accepted by Send*, Ping and Pong not yet written to a socket.", m.SendQueuedMessages,
			func(g *ConnGauge) uint64 { return g.SendQueuedMessages }},
	}
	for _, g := range gauges {
		fn(g.name, g.help, "", g.pool)
		for i := range m.Conns {
			fn(g.name, g.help, m.Conns[i].Label, g.conn(&m.Conns[i]))
		}
	}
}

// mergeConnGauges sorts gs by label and sums the entries of one label.
func mergeConnGauges(gs []ConnGauge) []ConnGauge {
	slices.SortFunc(gs, func(a, b ConnGauge) int { return strings.Compare(a.Label, b.Label) })
	out := gs[:0]
	for _, g := range gs {
		if n := len(out); n > 0 && out[n-1].Label == g.Label {
			out[n-1].ConnsOpen += g.ConnsOpen
			out[n-1].SendQueuedBytes += g.SendQueuedBytes
			out[n-1].SendQueuedMessages += g.SendQueuedMessages
			continue
		}
		out = append(out, g)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// maxConnLabel is the longest DialOptions.Label, in bytes.
const maxConnLabel = 64

// checkConnLabel validates a DialOptions.Label: printable UTF-8 (no
// control characters; spaces are fine) of at most maxConnLabel bytes.
func checkConnLabel(l string) error {
	if len(l) > maxConnLabel {
		return fmt.Errorf("%w: DialOptions.Label is %d bytes, at most %d", ErrInvalidConfig, len(l), maxConnLabel)
	}
	for _, r := range l {
		if r == utf8.RuneError || !strconv.IsPrint(r) {
			return fmt.Errorf("%w: DialOptions.Label %q is not printable UTF-8", ErrInvalidConfig, l)
		}
	}
	return nil
}

// Names and help texts of the labelled families, shared with the prom module.
const (
	// StageLatencyName is the histogram family of the stage latencies,
	// labelled with stage (a Stage's String) and pool.
	StageLatencyName = "talaris_stage_latency_seconds"
	// StageLatencyHelp is its help text.
	StageLatencyHelp = "Latency of each stage of a sampled message, from the receive completion to the callback."
	// StageRejectedName is the counter family of Rejected samples, labelled
	// with stage and pool.
	StageRejectedName = "talaris_stage_rejected_total"
	// StageRejectedHelp is its help text.
	StageRejectedHelp = "Sampled messages whose stamps for the stage went backwards; not recorded."
)

// stageSet is one histogram per stage with the matching rejection counts.
type stageSet struct {
	h        [NumStages]histogram
	rejected [NumStages]uint64
	sampled  uint64
}

func (s *stageSet) merge(o *stageSet) {
	for i := range s.h {
		s.h[i].Merge(&o.h[i])
		s.rejected[i] += o.rejected[i]
	}
	s.sampled += o.sampled
}

func (s *stageSet) reset() {
	for i := range s.h {
		s.h[i].Reset()
	}
	s.rejected = [NumStages]uint64{}
	s.sampled = 0
}

// fold records one sample's stage differences. A stamp of 0 is absent: the
// stages that need it are skipped. A negative difference is counted in
// rejected, not recorded.
func (s *stageSet) fold(st *sampleStamps) {
	s.sampled++
	s.stage(StageCQEToPlaintext, st.cqe, st.plaintext)
	s.stage(StagePlaintextToPublish, st.plaintext, st.publish)
	s.stage(StagePublishToCallback, st.publish, st.callback)
	s.stage(StageCQEToCallback, st.cqe, st.callback)
	s.stage(StageWireToCallback, st.wire, st.callback)
}

func (s *stageSet) stage(g Stage, from, to int64) {
	if from == 0 || to == 0 {
		return
	}
	if d := to - from; d >= 0 {
		s.h[g].Record(d)
	} else {
		s.rejected[g]++
	}
}

// sampleStamps are the raw stamps of one sampled message, CLOCK_MONOTONIC
// ns, 0 = absent.
type sampleStamps struct {
	cqe, plaintext, publish, callback, wire int64
}

// metricsBatch is how many samples the recorder buffers before it publishes.
const metricsBatch = 256

// metricsRecorder turns the stamps of sampled messages into the stage
// histograms of Metrics.
//
// Concurrency model. Exactly one goroutine records (the pump): record,
// poll and flush are called only by it. Any number of goroutines read with
// snapshot. Nothing on the recording side locks per value:
//
//   - record copies the five stamps into a private buffer (buf, owned by
//     the recorder, no synchronisation). When the buffer is full, or when a
//     reader has asked (the atomic flag want), the recorder publishes: it
//     takes mu once and folds the whole buffer into live, the published
//     delta histograms. So mu is taken once per metricsBatch samples in the
//     steady state. record plus its share of the fold costs about 20 ns a
//     sample (BenchmarkMetricsRecord; histogram.Record alone about 2 ns).
//   - a reader takes rmu (readers among themselves), sets want, and under mu
//     only swaps the live pointer with an empty spare set: O(1), so a
//     reader never holds the recorder up for more than a pointer swap.
//     Outside mu it merges the delta into its cumulative total and interval
//     sets and empties it to be the next spare.
//
// Staleness: a snapshot sees everything published. Samples still in the
// recorder's buffer appear once the recorder publishes: when the buffer
// fills, on the next record or poll after a reader set want, or on flush.
// The pump calls poll at the end of each batch (an atomic load when nobody
// asked) and flush before it sleeps, so an idle pump leaves nothing behind
// and a busy one is at most one pump batch behind a reader's request.
//
// Memory: four stage sets (live, spare, total, interval) of five 216 KiB
// histograms, about 4.3 MiB, allocated once by newMetricsRecorder.
type metricsRecorder struct {
	// Recorder goroutine only.
	buf [metricsBatch]sampleStamps
	n   int

	want atomic.Bool // a reader asks for the buffer to be published

	mu   sync.Mutex // guards the live pointer and *live
	live *stageSet

	rmu           sync.Mutex // readers: guards the fields below
	spare         *stageSet
	total         *stageSet
	interval      *stageSet
	start         time.Time
	intervalStart time.Time
}

func newMetricsRecorder() *metricsRecorder {
	now := time.Now()
	return &metricsRecorder{
		live:          new(stageSet),
		spare:         new(stageSet),
		total:         new(stageSet),
		interval:      new(stageSet),
		start:         now,
		intervalStart: now,
	}
}

// record takes the stamps of one sampled message (CLOCK_MONOTONIC ns, 0 =
// absent): completion seen by the loop, plaintext ready, event published,
// callback called, and the kernel's receive timestamp. Recorder goroutine
// only; no allocation, no lock except once per metricsBatch samples.
func (r *metricsRecorder) record(cqe, plaintext, publish, callback, wire int64) {
	r.buf[r.n] = sampleStamps{cqe, plaintext, publish, callback, wire}
	r.n++
	if r.n == len(r.buf) || r.want.Load() {
		r.publish()
	}
}

// poll publishes the buffered samples if a reader asked for them.
// Recorder goroutine only; an atomic load when nobody asked.
func (r *metricsRecorder) poll() {
	if r.want.Load() {
		r.publish()
	}
}

// flush publishes the buffered samples, if any. Recorder goroutine only.
func (r *metricsRecorder) flush() {
	if r.n > 0 {
		r.publish()
	}
}

func (r *metricsRecorder) publish() {
	r.want.Store(false) // a request after this point is served by the next publish
	r.mu.Lock()
	live := r.live
	for i := range r.buf[:r.n] {
		live.fold(&r.buf[i])
	}
	r.mu.Unlock()
	r.n = 0
}

// snapshot returns the stage histograms. With reset false: everything
// recorded since the recorder was created (what Prometheus wants:
// cumulative). With reset true: what was recorded since the previous
// snapshot(true) (or creation), and a new interval starts; the cumulative
// view is not affected. Only Stages, Sampled and Elapsed are filled; the
// caller adds the loop's counters. Safe from any goroutine.
func (r *metricsRecorder) snapshot(reset bool) Metrics {
	r.rmu.Lock()
	defer r.rmu.Unlock()
	r.want.Store(true)
	r.mu.Lock()
	delta := r.live
	r.live = r.spare
	r.mu.Unlock()
	r.total.merge(delta)
	r.interval.merge(delta)
	delta.reset()
	r.spare = delta

	now := time.Now()
	var m Metrics
	src, since := r.total, r.start
	if reset {
		src, since = r.interval, r.intervalStart
	}
	src.export(&m)
	m.Elapsed = now.Sub(since)
	if reset {
		r.interval.reset()
		r.intervalStart = now
	}
	return m
}

var exportQuantiles = [...]float64{0.5, 0.9, 0.99, 0.999, 0.9999}

// export fills m.Stages and m.Sampled from s.
func (s *stageSet) export(m *Metrics) {
	m.Sampled = s.sampled
	for i := range s.h {
		h := &s.h[i]
		out := &m.Stages[i]
		var q [len(exportQuantiles)]int64
		h.quantiles(exportQuantiles[:], q[:])
		*out = StageHistogram{
			Count:    h.Count(),
			Sum:      time.Duration(h.Sum()),
			Min:      time.Duration(h.Min()),
			Max:      time.Duration(h.Max()),
			P50:      time.Duration(q[0]),
			P90:      time.Duration(q[1]),
			P99:      time.Duration(q[2]),
			P999:     time.Duration(q[3]),
			P9999:    time.Duration(q[4]),
			Rejected: s.rejected[i],
		}
		h.cumulativeBuckets(latencyBoundsNs[:], out.Buckets[:])
	}
}
