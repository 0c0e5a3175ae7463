//go:build linux

package main

import (
	"fmt"
	"math"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/talaris-go/talaris"
)

func (b *bench) notes() []string {
	var n []string
	if b.tlsNote != "" {
		n = append(n, b.tlsNote)
	}
	if b.rustNote != "" {
		n = append(n, b.rustNote)
	}
	for _, r := range b.results {
		if r.Note != "" {
			n = append(n, fmt.Sprintf("%s %s %s x%d: %s", r.Workload, r.Transport, r.Client, r.Conns, r.Note))
		}
	}
	return n
}

func fmtRate(v float64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f M", v/1e6)
}

func fmtF(v float64, prec int) string {
	if v == 0 || math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.*f", prec, v)
}

// markdownTables renders every workload's results as Markdown tables.
func (b *bench) markdownTables() string {
	var s strings.Builder
	by := func(wl string) []Result {
		var out []Result
		for _, r := range b.results {
			if r.Workload == wl {
				out = append(out, r)
			}
		}
		return out
	}
	errCell := func(r Result) string { return "error: " + strings.ReplaceAll(r.Err, "|", "/") }
	if rs := by("decode"); len(rs) > 0 {
		fmt.Fprintf(&s, "### decode: in-memory, %d mixed messages (1/3 binary u64, 2/3 text {\"id\":i}), 4096-byte reads, best of %d rounds (the in-process clients' rounds interleaved); the talaris Pool with Config.Tuning.Prefault, as the rounds pass the arena's memory once only, where a zero Config takes its page faults (steady state: each page faults once per process)\n\n", b.decodeN, b.decodeRounds)
		s.WriteString("| client | ns/msg | M msg/s |\n|---|---:|---:|\n")
		for _, r := range rs {
			if r.Err != "" {
				fmt.Fprintf(&s, "| %s | %s | |\n", r.Client, errCell(r))
				continue
			}
			fmt.Fprintf(&s, "| %s | %.1f | %.2f |\n", r.Client, r.NsPerMsg, 1e3/r.NsPerMsg)
		}
		s.WriteString("\n")
	}
	if rs := by("ingress"); len(rs) > 0 {
		fmt.Fprintf(&s, "### ingress: loopback flood, feed server in another process, %v per run after %v warm-up\n\n", b.dur, b.warm)
		s.WriteString("CPU columns are CPU seconds per million frames (= microseconds per thousand frames): the whole client process, " +
			"then its threads over the same interval (talaris: the C loop thread `talaris-loop` and the busiest other thread, which runs the pumping goroutine " +
			"(not locked to it, as a user's is not: a rare move of the goroutine puts part of the pump in the other threads); " +
			"with N loop threads, their sum and, after it, N and the busiest one's; " +
			"the Rust crate: its one pool thread is both). Ceiling = 1 / the busiest thread's CPU per frame: the rate if that thread " +
			"had a core of its own and the others kept up (a spinning thread counts its spin too). " +
			"The floor row is a bare recv() loop that never parses: on wss it reads the ciphertext raw after crypto/tls' handshake and never decrypts it, " +
			"so it is what the feed server on this box sends when its client costs almost nothing; % of floor is each row's share of it. " +
			"Server CPU is the feed server process's CPU over the same interval, in % of one core: one connection is one server goroutine, " +
			"so near 100 % the server, not the client, bounds that row.\n\n")
		s.WriteString("| transport | frame | conns | client | frames/s | MB/s | CPU s / M frames | loop thread | pump thread | ceiling frames/s | % of floor | server CPU % |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range rs {
			if r.Err != "" {
				fmt.Fprintf(&s, "| %s | %d B | %d | %s | %s | | | | | | | |\n", r.Transport, r.Size, r.Conns, r.Client, errCell(r))
				continue
			}
			srv := 0.0
			if r.Secs > 0 {
				srv = 100 * r.ServerCPUSecs / r.Secs
			}
			fmt.Fprintf(&s, "| %s | %d B | %d | %s | %s | %.1f | %s | %s | %s | %s | %s | %s |\n", r.Transport, r.Size, r.Conns, r.Client,
				fmtRate(r.FramesPerSec), r.MBPerSec, fmtF(r.CPUPerM, 3), loopCell(r), pumpCell(r), fmtRate(r.CeilingFPS), fmtF(r.FloorPct, 0), fmtF(srv, 0))
		}
		s.WriteString("\n")
	}
	for _, wl := range []string{"latency", "rtt"} {
		rs := by(wl)
		if len(rs) == 0 {
			continue
		}
		rounds := fmt.Sprintf("%v per client: the in-process clients in %d interleaved rounds of %v, each after a %v warm-up, their samples merged; the Rust crate in one run",
			b.wlDur(wl), max(b.latRounds, 1), b.wlDur(wl)/time.Duration(max(b.latRounds, 1)), b.warm)
		if wl == "latency" {
			fmt.Fprintf(&s, "### latency: one-way, %d msg/s of 64 B with a send timestamp, %s (microseconds)\n\n", b.rate, rounds)
		} else {
			fmt.Fprintf(&s, "### rtt: echo round trip, 64 B, one message outstanding, %s (microseconds)\n\n", rounds)
		}
		latencyTable(&s, rs, errCell)
	}
	if rs := by("orders"); len(rs) > 0 {
		fmt.Fprintf(&s, "### orders: echo round trip of 64 B orders on connection O while the same client reads a flood on F and keeps sending %d KiB messages to S, whose peer stopped reading (at most %d MiB); %v per run (microseconds)\n\n", stuckMsg>>10, b.stallBytes>>20, b.ordersDur)
		latencyTable(&s, rs, errCell)
		for _, r := range rs {
			if r.Note != "" && r.Err == "" {
				fmt.Fprintf(&s, "- %s: %s\n", r.Client, r.Note)
			}
		}
		s.WriteString("\n")
	}
	if rs := by("burst"); len(rs) > 0 {
		stream, iso := b.burstCounts()
		fmt.Fprintf(&s, "### burst: %d orders of %d B in bursts of %d, sent back to back to a server in another process that reads them (the feed's /sink), after %d isolated bursts (%d orders more)\n\n",
			stream*burstLen, orderSize, burstLen, iso, iso*burstLen)
		fmt.Fprintf(&s, "One connection per row. talaris (the zero Config, or the variant its client name shows; a goroutine in its pump, as a user has) sends a burst with one `Conn.SendBatch` (SendBatch rows) "+
			"or with `SendBinary` per order (SendBinary rows); gorilla with `WriteMessage` and coder with `Write` per order. "+
			"The stream's bursts follow each other as fast as the client accepts them: frames/s is its orders over the time from its first burst's start "+
			"to the server's arrival of its last order; CPU (the whole client process, getrusage; for talaris also its loop thread) and send syscalls "+
			"are counted from that start until the client handed the last order to the kernel (talaris: `Conn.Flush` returned). "+
			"Send syscalls per frame = write-type syscalls of every thread (/proc/self/io syscw: write(2) and writev(2), which the Go peers send with, "+
			"and eventfd writes that wake talaris' loop) + talaris' direct send(2) calls (sendto, not in syscw; from its direct-send counters); "+
			"the sends talaris' loop submits to io_uring are no syscalls of their own and its io_uring_enter calls are not counted. "+
			"Latency, in microseconds: from a burst's start (read just before its first send) to the server's arrival of its first and of its last order, "+
			"both clocks CLOCK_MONOTONIC (one clock for both processes); isolated: %d bursts before the stream, each sent on an idle connection "+
			"(the previous one flushed and %v of quiet); loaded: the stream's bursts, which queue behind the ones before. "+
			"Server CPU is the reading server process's, in %% of one core, over the stream.\n\n", iso, burstGap)
		s.WriteString("| transport | client | frames/s | CPU us / frame | loop thread us / frame | send syscalls / frame | first-of-64 p50 / p99 | last-of-64 p50 / p99 | loaded last-of-64 p50 / p99 | server CPU % |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range rs {
			if r.Err != "" {
				fmt.Fprintf(&s, "| %s | %s | %s | | | | | | | |\n", r.Transport, r.Client, errCell(r))
				continue
			}
			srv := 0.0
			if r.Secs > 0 {
				srv = 100 * r.ServerCPUSecs / r.Secs
			}
			fmt.Fprintf(&s, "| %s | %s | %s | %.3f | %s | %.3f | %.1f / %.1f | %.1f / %.1f | %.1f / %.1f | %s |\n", r.Transport, r.Client,
				fmtRate(r.FramesPerSec), r.CPUPerM, fmtF(r.LoopPerM, 3), r.SyscallsPerFrame, r.FirstP50, r.FirstP99, r.LastP50, r.LastP99,
				r.LoadedLastP50, r.LoadedLastP99, fmtF(srv, 0))
		}
		s.WriteString("\n")
	}
	if rs := by("idle"); len(rs) > 0 {
		fmt.Fprintf(&s, "### idle: process CPU (getrusage) with one open, quiet connection and a goroutine waiting in the pump (Go peers: in a read), over %v\n\n", b.idleDur)
		s.WriteString("| client | CPU % of one core | CPU ms |\n|---|---:|---:|\n")
		for _, r := range rs {
			if r.Err != "" {
				fmt.Fprintf(&s, "| %s | %s | |\n", r.Client, errCell(r))
				continue
			}
			fmt.Fprintf(&s, "| %s | %.2f | %.1f |\n", r.Client, idlePct(r), r.CPUSecs*1e3)
		}
		s.WriteString("\n")
	}
	return s.String()
}

// pumpCell is the pump thread's CPU per frame, "= loop" when one thread is
// both (the Rust crate), "-" when not measured (Go peers: goroutines move
// between threads).
// loopCell is the loop thread column: its CPU per frame, or with several
// loop threads their sum, their number and the busiest one's.
func loopCell(r Result) string {
	if r.LoopThreads > 1 {
		return fmt.Sprintf("%s (%d, busiest %s)", fmtF(r.LoopPerM, 3), r.LoopThreads, fmtF(r.LoopMaxPerM, 3))
	}
	return fmtF(r.LoopPerM, 3)
}

func pumpCell(r Result) string {
	if r.SameThread {
		return "= loop"
	}
	return fmtF(r.PumpPerM, 3)
}

// latencyTable writes the percentile table of latency, rtt or orders
// results, with the process CPU time per sample where it was measured.
func latencyTable(s *strings.Builder, rs []Result, errCell func(Result) string) {
	s.WriteString("| client | p50 | p99 | p99.9 | max | samples | CPU us / sample |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rs {
		if r.Err != "" {
			fmt.Fprintf(s, "| %s | %s | | | | | |\n", r.Client, errCell(r))
			continue
		}
		fmt.Fprintf(s, "| %s | %.1f | %.1f | %.1f | %.1f | %d | %s |\n", r.Client, r.P50, r.P99, r.P999, r.Max, r.Count, fmtF(cpuPerSample(r), 1))
	}
	s.WriteString("\n")
}

// cpuPerSample is the process CPU time per latency sample in microseconds
// (0 when not measured).
func cpuPerSample(r Result) float64 {
	if r.Count == 0 || r.CPUSecs == 0 {
		return 0
	}
	return r.CPUSecs * 1e6 / float64(r.Count)
}

// idlePct is an idle result's CPU time as a percentage of one core.
func idlePct(r Result) float64 {
	if r.Secs == 0 {
		return 0
	}
	return 100 * r.CPUSecs / r.Secs
}

// bestOf returns the best value of metric among results of a workload
// whose client satisfies pick (lower is better when low is set).
func (b *bench) bestOf(match func(Result) bool, metric func(Result) float64, low bool) (float64, string) {
	best, who := 0.0, ""
	for _, r := range b.results {
		if r.Err != "" || !match(r) {
			continue
		}
		v := metric(r)
		if v == 0 {
			continue
		}
		if who == "" || (low && v < best) || (!low && v > best) {
			best, who = v, r.Client
		}
	}
	return best, who
}

func isTalaris(r Result) bool { return strings.HasPrefix(r.Client, "talaris") }

// isTalarisUnsampled: a talaris row without stage sampling (the targets
// compare those; the +sampleN rows measure what sampling costs).
func isTalarisUnsampled(r Result) bool { return isTalaris(r) && !strings.Contains(r.Client, "+sample") }
func isRust(r Result) bool             { return strings.HasPrefix(r.Client, "rust-talaris") }
func isGoPeer(r Result) bool           { return !isTalaris(r) && !isRust(r) && r.Client != "floor" }

// targets checks the performance targets on this run's numbers: decode
// cost, latency against the best Go peer and the Rust client, idle CPU,
// then the throughput and sampling rows.
func (b *bench) targets() string {
	var s strings.Builder
	s.WriteString("| target | this run | met |\n|---|---|:-:|\n")
	row := func(target, value string, ok bool, have bool) {
		m := "no"
		if !have {
			m, value = "n/a", value+" (not measured)"
		} else if ok {
			m = "yes"
		}
		fmt.Fprintf(&s, "| %s | %s | %s |\n", target, value, m)
	}
	wl := func(w string, extra func(Result) bool) func(Result) bool {
		return func(r Result) bool { return r.Workload == w && (extra == nil || extra(r)) }
	}
	and := func(a, c func(Result) bool) func(Result) bool { return func(r Result) bool { return a(r) && c(r) } }
	ns := func(r Result) float64 { return r.NsPerMsg }
	tv, tw := b.bestOf(wl("decode", isTalarisUnsampled), ns, true)
	gv, gw := b.bestOf(wl("decode", isGoPeer), ns, true)
	row("decode <= 10 ns/msg", fmt.Sprintf("talaris %.1f ns/msg (best Go peer %s %.1f)", tv, gw, gv), tv <= 10, tv > 0)
	_ = tw
	fps := func(r Result) float64 { return r.FramesPerSec }
	for _, tr := range []string{"ws", "wss"} {
		for _, n := range b.conns {
			m := func(r Result) bool { return r.Transport == tr && r.Conns == n }
			tv, tw := b.bestOf(and(wl("ingress", isTalarisUnsampled), m), fps, false)
			gv, gw := b.bestOf(and(wl("ingress", isGoPeer), m), fps, false)
			rv, _ := b.bestOf(and(wl("ingress", isRust), m), fps, false)
			if gv == 0 {
				continue
			}
			v := fmt.Sprintf("%s %s / %s %s = %.2fx", tw, fmtRate(tv), gw, fmtRate(gv), tv/gv)
			row(fmt.Sprintf("%s ingress x%d >= 2x best Go peer", tr, n), v, tv >= 2*gv, tv > 0)
			if rv > 0 {
				row(fmt.Sprintf("%s ingress x%d >= 1x Rust talaris", tr, n), fmt.Sprintf("%s / %s = %.2fx", fmtRate(tv), fmtRate(rv), tv/rv), tv >= rv, tv > 0)
			}
		}
	}
	p50 := func(r Result) float64 { return r.P50 }
	p999 := func(r Result) float64 { return r.P999 }
	tv, tw = b.bestOf(wl("latency", isTalarisUnsampled), p50, true)
	gv, gw = b.bestOf(wl("latency", isGoPeer), p50, true)
	rv, rw := b.bestOf(wl("latency", isRust), p50, true)
	if gv > 0 {
		row("latency p50 <= 0.5x best Go peer", fmt.Sprintf("%s %.1f us / %s %.1f us = %.2fx", tw, tv, gw, gv, tv/gv), tv <= 0.5*gv, tv > 0)
	}
	if rv > 0 {
		row("latency p50 <= Rust talaris", fmt.Sprintf("%.1f us / %s %.1f us", tv, rw, rv), tv <= rv, tv > 0)
	}
	tv, tw = b.bestOf(wl("latency", isTalarisUnsampled), p999, true)
	gv, gw = b.bestOf(wl("latency", isGoPeer), p999, true)
	rv, rw = b.bestOf(wl("latency", isRust), p999, true)
	if gv > 0 {
		row("latency p99.9 <= 0.2x best Go peer", fmt.Sprintf("%s %.1f us / %s %.1f us = %.2fx", tw, tv, gw, gv, tv/gv), tv <= 0.2*gv, tv > 0)
	}
	if rv > 0 {
		row("latency p99.9 <= Rust talaris", fmt.Sprintf("%.1f us / %s %.1f us", tv, rw, rv), tv <= rv, tv > 0)
	}
	// The default configuration against the best Go peer (the one-way and round-trip targets).
	isDefault := func(r Result) bool { return r.Client == "talaris/default" }
	for _, t := range []struct {
		w, name string
		metric  func(Result) float64
	}{{"rtt", "p50", p50}, {"rtt", "p99.9", p999}, {"latency", "p50", p50}, {"orders", "p50", p50}, {"orders", "p99.9", p999}} {
		dv, _ := b.bestOf(wl(t.w, isDefault), t.metric, true)
		gv, gw := b.bestOf(wl(t.w, isGoPeer), t.metric, true)
		if gv > 0 {
			row(fmt.Sprintf("%s %s talaris/default <= best Go peer", t.w, t.name), fmt.Sprintf("%.1f us / %s %.1f us = %.2fx", dv, gw, gv, dv/gv), dv <= gv, dv > 0)
		}
	}
	if iv, _ := b.bestOf(wl("idle", isDefault), idlePct, true); iv > 0 {
		row("idle talaris/default < 1 % of a CPU", fmt.Sprintf("%.2f %%", iv), iv < 1, true)
	}
	b.throughputTargets(row, isDefault)
	b.samplingTargets(row)
	b.burstTargets(row)
	return s.String()
}

// burstTargets adds the burst rows, per transport: the stream's rate of
// talaris' SendBatch and SendBinary loop against gorilla's, and the
// isolated bursts' last-of-64 latency of SendBatch against gorilla's.
func (b *bench) burstTargets(row func(target, value string, ok, have bool)) {
	for _, tr := range []string{"ws", "wss"} {
		g := b.findResult("burst", "gorilla", tr, 1)
		if g == nil || g.FramesPerSec == 0 {
			continue
		}
		for _, t := range []struct {
			client string
			want   float64
		}{{"talaris/SendBatch", 2.5}, {"talaris/SendBinary", 0.9}} {
			if r := b.findResult("burst", t.client, tr, 1); r != nil {
				row(fmt.Sprintf("burst %s %s frames/s >= %.1fx gorilla", tr, t.client, t.want),
					fmt.Sprintf("%s / %s = %.2fx", fmtRate(r.FramesPerSec), fmtRate(g.FramesPerSec), r.FramesPerSec/g.FramesPerSec),
					r.FramesPerSec >= t.want*g.FramesPerSec, r.FramesPerSec > 0)
			}
		}
		if r := b.findResult("burst", "talaris/SendBatch", tr, 1); r != nil && g.LastP50 > 0 {
			row(fmt.Sprintf("burst %s last-of-64 p50 talaris/SendBatch <= 0.3x gorilla", tr),
				fmt.Sprintf("%.1f us / %.1f us = %.2fx", r.LastP50, g.LastP50, r.LastP50/g.LastP50), r.LastP50 <= 0.3*g.LastP50, r.LastP50 > 0)
		}
	}
}

// findResult returns the successful row of workload w for client (for
// ingress: on transport tr with conns connections), or nil.
func (b *bench) findResult(w, client, tr string, conns int) *Result {
	for i := range b.results {
		r := &b.results[i]
		if r.Err == "" && r.Workload == w && r.Client == client && (w == "decode" || r.Transport == tr && r.Conns == conns) {
			return r
		}
	}
	return nil
}

// throughputTargets adds the throughput rows: the default configuration's
// ingress rate and client CPU per frame against gobwas and the best Go
// peer, and the decode cost of the Pool and of the synchronous decoder.
func (b *bench) throughputTargets(row func(target, value string, ok, have bool), isDefault func(Result) bool) {
	find := b.findResult
	for _, c := range []string{"talaris", "talaris-decoder"} {
		if r := find("decode", c, "", 0); r != nil {
			row(fmt.Sprintf("decode %s <= 12 ns/msg", c), fmt.Sprintf("%.1f ns/msg", r.NsPerMsg), r.NsPerMsg <= 12, r.NsPerMsg > 0)
		}
	}
	cpu := func(r *Result) float64 { return r.CPUSecs / float64(max(r.Frames, 1)) * 1e6 }
	if d, g := find("ingress", "talaris/default", "wss", 1), find("ingress", "gobwas", "wss", 1); d != nil && g != nil && g.Frames > 0 && d.Frames > 0 && g.CPUSecs > 0 {
		v := fmt.Sprintf("%s / %s = %.2fx", fmtRate(d.FramesPerSec), fmtRate(g.FramesPerSec), d.FramesPerSec/g.FramesPerSec)
		if f := find("ingress", "floor", "wss", 1); f != nil && f.FramesPerSec > 0 {
			// What the feed server sends a client that costs nothing: no
			// client can be faster than this ratio to gobwas here.
			v += fmt.Sprintf(" (floor %s = %.2fx gobwas)", fmtRate(f.FramesPerSec), f.FramesPerSec/g.FramesPerSec)
		}
		row("wss x1 talaris/default frames/s >= 1.5x gobwas", v, d.FramesPerSec >= 1.5*g.FramesPerSec, true)
		row("wss x1 talaris/default CPU per frame <= 0.7x gobwas", fmt.Sprintf("%.3f us / %.3f us = %.2fx", cpu(d), cpu(g), cpu(d)/cpu(g)), cpu(d) <= 0.7*cpu(g), true)
	}
	fps := func(r Result) float64 { return r.FramesPerSec }
	for _, t := range []struct {
		tr   string
		want float64
	}{{"wss", 1.0}, {"ws", 1.5}} {
		m := func(r Result) bool { return r.Workload == "ingress" && r.Transport == t.tr && r.Conns == 16 }
		dv, _ := b.bestOf(func(r Result) bool { return m(r) && isDefault(r) }, fps, false)
		gv, gw := b.bestOf(func(r Result) bool { return m(r) && isGoPeer(r) }, fps, false)
		if gv > 0 {
			row(fmt.Sprintf("%s x16 talaris/default frames/s >= %.1fx best Go peer", t.tr, t.want), fmt.Sprintf("%s / %s %s = %.2fx", fmtRate(dv), gw, fmtRate(gv), dv/gv), dv >= t.want*gv, dv > 0)
		}
	}
}

// samplingTargets adds the sampling-cost rows: the difference
// between a +sampleN row and its unsampled twin, in ns per message (decode:
// wall time; ingress: client CPU per frame, steadier on a shared machine).
func (b *bench) samplingTargets(row func(target, value string, ok, have bool)) {
	find := b.findResult
	limits := map[string]float64{"+sample64": 2, "+sample1": 25}
	for _, suf := range []string{"+sample64", "+sample1"} {
		lim := limits[suf]
		if off, on := find("decode", "talaris", "", 0), find("decode", "talaris"+suf, "", 0); off != nil && on != nil {
			d := on.NsPerMsg - off.NsPerMsg
			row(fmt.Sprintf("decode %s costs <= %g ns/msg", suf, lim), fmt.Sprintf("%.1f - %.1f = %+.1f ns/msg", on.NsPerMsg, off.NsPerMsg, d), d <= lim, true)
		}
		for _, r := range b.results {
			if r.Workload != "ingress" || !strings.HasSuffix(r.Client, suf) || r.Err != "" || r.Frames == 0 {
				continue
			}
			off := find("ingress", strings.TrimSuffix(r.Client, suf), r.Transport, r.Conns)
			if off == nil || off.Frames == 0 {
				continue
			}
			on, base := r.CPUSecs/float64(r.Frames)*1e9, off.CPUSecs/float64(off.Frames)*1e9
			row(fmt.Sprintf("ingress %s x%d %s costs <= %g ns/msg (CPU)", r.Transport, r.Conns, suf, lim),
				fmt.Sprintf("%.1f - %.1f = %+.1f ns/frame", on, base, on-base), on-base <= lim, true)
		}
	}
}

func (b *bench) markdownReport(mdPath string, plots []string) string {
	var s strings.Builder
	s.WriteString("# talaris benchmark results\n\n")
	s.WriteString("Generated by `talaris bench`; every number below comes from the run described here (nothing typed by hand).\n\n")
	fmt.Fprintf(&s, "- command: `%s`\n", strings.TrimSpace(b.cmdline))
	s.WriteString("- to reproduce: `go -C cmd/talaris build -o ../../build/talaris . && CARGO_TARGET_DIR=build/rust-talaris cargo build --release --manifest-path bench/rust-talaris/Cargo.toml && ./build/talaris bench --quick --md docs/BENCH.md --plots docs/ --json docs/bench.json` (drop `--quick` for the full run)\n")
	fmt.Fprintf(&s, "- CPU: %s, %d logical CPUs\n", cpuModel(), runtime.NumCPU())
	fmt.Fprintf(&s, "- kernel: %s\n", kernelVersion())
	fmt.Fprintf(&s, "- Go: %s; talaris TLS backend: %q\n", runtime.Version(), talaris.TLSBackend())
	fmt.Fprintf(&s, "- date: %s; duration of the run: %s\n", b.startedAt.UTC().Format(time.RFC3339), time.Since(b.startedAt).Round(time.Second))
	pin := func(v int) string {
		if v < 0 {
			return "not pinned"
		}
		return fmt.Sprintf("CPU %d", v)
	}
	fmt.Fprintf(&s, "- load average when the run started (other processes on the machine): %s\n", b.loadAvg)
	fmt.Fprintf(&s, "- pinning: client %s, feed server %s, talaris loop thread %s\n", pin(b.clientCPU), pin(b.serverCPU), pin(b.loopCPU))
	s.WriteString("- feed server: `talaris feed-server` in a child process (pre-built frames in 256 KiB writes; crypto/tls for wss); Go peers use their fastest read API, crypto/tls for wss\n")
	s.WriteString("- talaris variants: `default` is the zero Config (Wait: WaitAdaptive); the others set the wait strategy of both the C loop and the consumer (`block`, `spin` with a loop over PumpDataNowait, `spin-then-block`, ...; see `talaris bench -h`)\n")
	if len(b.rustFlags) > 0 {
		fmt.Fprintf(&s, "- Rust client extra flags: `%s`\n", strings.Join(b.rustFlags, " "))
	}
	for _, n := range b.notes() {
		fmt.Fprintf(&s, "- note: %s\n", n)
	}
	s.WriteString("\n")
	s.WriteString(b.markdownTables())
	s.WriteString("### targets, computed from the tables above\n\n")
	s.WriteString(b.targets())
	s.WriteString("\n")
	if len(plots) > 0 {
		s.WriteString("### plots\n\n")
		for _, p := range plots {
			rel, err := filepath.Rel(filepath.Dir(mdPath), p)
			if err != nil {
				rel = p
			}
			fmt.Fprintf(&s, "![%s](%s)\n\n", strings.TrimSuffix(filepath.Base(p), ".png"), filepath.ToSlash(rel))
		}
	}
	return s.String()
}
