//go:build linux

package main

import "github.com/HdrHistogram/hdrhistogram-go"

// Result is one measured run.
type Result struct {
	Workload  string  `json:"workload"` // decode, ingress, latency, rtt, orders, idle, burst
	Client    string  `json:"client"`   // talaris/<wait>, gorilla, gobwas, gws, coder, rust-talaris[/spin], floor
	Transport string  `json:"transport,omitempty"`
	Size      int     `json:"size,omitempty"`
	Conns     int     `json:"conns,omitempty"`
	Frames    uint64  `json:"frames"`
	Bytes     uint64  `json:"bytes"`
	Secs      float64 `json:"secs"`
	CPUSecs   float64 `json:"cpu_s"`
	// ServerCPUSecs is the feed server process's CPU over the same
	// interval (ingress; 0: not measured): at about 1 s per s on one
	// connection, its goroutine is what bounds the rate.
	ServerCPUSecs float64      `json:"server_cpu_s,omitempty"`
	FramesPerSec  float64      `json:"frames_per_s,omitempty"`
	MBPerSec      float64      `json:"mb_per_s,omitempty"`
	CPUPerM       float64      `json:"cpu_s_per_mframes,omitempty"`
	NsPerMsg      float64      `json:"ns_per_msg,omitempty"`
	P50           float64      `json:"p50_us,omitempty"`
	P99           float64      `json:"p99_us,omitempty"`
	P999          float64      `json:"p999_us,omitempty"`
	Max           float64      `json:"max_us,omitempty"`
	Count         int64        `json:"count,omitempty"`
	CDF           [][2]float64 `json:"cdf,omitempty"` // [percentile, us]
	FloorPct      float64      `json:"floor_pct,omitempty"`
	Note          string       `json:"note,omitempty"`
	Err           string       `json:"error,omitempty"`
	// Per-thread CPU over the measured interval (ingress; talaris and the
	// Rust crate): the C loop threads (LoopCPUSecs their sum, LoopMaxCPUSecs
	// the busiest one of LoopThreads), the pumping thread and the rest of
	// the process. SameThread: one thread is both (the Rust crate's pool).
	LoopCPUSecs    float64   `json:"loop_cpu_s,omitempty"`
	LoopMaxCPUSecs float64   `json:"loop_max_cpu_s,omitempty"`
	LoopThreads    int       `json:"loop_threads,omitempty"`
	PumpCPUSecs    float64   `json:"pump_cpu_s,omitempty"`
	OtherCPUSecs   float64   `json:"other_cpu_s,omitempty"`
	SameThread     bool      `json:"same_thread,omitempty"`
	Threads        []taskCPU `json:"threads,omitempty"`
	LoopPerM       float64   `json:"loop_cpu_s_per_mframes,omitempty"`
	LoopMaxPerM    float64   `json:"loop_max_cpu_s_per_mframes,omitempty"`
	PumpPerM       float64   `json:"pump_cpu_s_per_mframes,omitempty"`
	// CeilingFPS is the projected dedicated-core ceiling: 1 / the busiest
	// thread's CPU per frame (what the client could receive if that thread
	// had a core to itself and the others kept up; with several loop
	// threads, the busiest of them or the pump).
	CeilingFPS float64 `json:"ceiling_frames_per_s,omitempty"`
	Crate      string  `json:"crate,omitempty"` // the Rust client: "talaris <version>"
	// The burst workload (bench_burst.go): the stream's send syscalls per
	// order (write-type ones of every thread, /proc/self/io syscw, plus
	// talaris' direct send(2) calls), and in microseconds from a burst's
	// start to the sink's arrival of its first and last order: over the
	// Count isolated bursts (First*, Last*) and the stream's (Loaded*).
	SyscallsPerFrame float64 `json:"syscalls_per_frame,omitempty"`
	FirstP50         float64 `json:"first_of_64_p50_us,omitempty"`
	FirstP99         float64 `json:"first_of_64_p99_us,omitempty"`
	LastP50          float64 `json:"last_of_64_p50_us,omitempty"`
	LastP99          float64 `json:"last_of_64_p99_us,omitempty"`
	LoadedFirstP50   float64 `json:"loaded_first_of_64_p50_us,omitempty"`
	LoadedLastP50    float64 `json:"loaded_last_of_64_p50_us,omitempty"`
	LoadedLastP99    float64 `json:"loaded_last_of_64_p99_us,omitempty"`
}

func (r *Result) finish() {
	if r.Secs > 0 && r.Workload == "ingress" {
		r.FramesPerSec = float64(r.Frames) / r.Secs
		r.MBPerSec = float64(r.Bytes) / r.Secs / 1e6
		if r.Frames > 0 {
			mf := float64(r.Frames) / 1e6
			r.CPUPerM = r.CPUSecs / mf
			r.LoopPerM, r.PumpPerM = r.LoopCPUSecs/mf, r.PumpCPUSecs/mf
			r.LoopMaxPerM = r.LoopMaxCPUSecs / mf
			if busiest := max(r.LoopMaxPerM, r.PumpPerM); busiest > 0 {
				r.CeilingFPS = 1e6 / busiest
			}
		}
	}
}

// cdfQuantiles are the quantiles (0..1) sampled for the latency CDF plots;
// the Rust client uses the same list.
func cdfQuantiles() []float64 {
	var v []float64
	for q := 0.0; q < 0.9-1e-9; q += 0.02 {
		v = append(v, q)
	}
	for tail := 0.1; tail > 0.00001; tail /= 10 {
		for _, k := range []float64{1, 0.5, 0.25} {
			v = append(v, 1-tail*k)
		}
	}
	return append(v, 1)
}

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, 60_000_000_000, 3) }

func histInto(r *Result, h *hdrhistogram.Histogram) {
	us := func(v int64) float64 { return float64(v) / 1000 }
	r.Count = h.TotalCount()
	if r.Count == 0 {
		r.Err = "no samples"
		return
	}
	r.P50, r.P99, r.P999, r.Max = us(h.ValueAtQuantile(50)), us(h.ValueAtQuantile(99)), us(h.ValueAtQuantile(99.9)), us(h.Max())
	for _, q := range cdfQuantiles() {
		r.CDF = append(r.CDF, [2]float64{q * 100, us(h.ValueAtQuantile(q * 100))})
	}
}
