//go:build linux

package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/talaris-go/talaris"
)

// printStages writes a Pool's stage latency breakdown (Pool.Metrics with
// Config.SampleEvery set) as a table, then its loop counters.
func printStages(w io.Writer, m talaris.Metrics) {
	if m.Sampled == 0 {
		fmt.Fprintf(w, "stages: no sampled messages (sampling off or nothing received)\n")
	} else {
		fmt.Fprintf(w, "stages (%d sampled messages, CLOCK_MONOTONIC stamps from the C loop and the pump):\n", m.Sampled)
		fmt.Fprintf(w, "  %-22s %9s %9s %9s %9s %9s %9s\n", "stage", "min", "p50", "p90", "p99", "p99.9", "max")
		for s := talaris.Stage(0); s < talaris.NumStages; s++ {
			h := m.Stages[s]
			if h.Count == 0 {
				why := ""
				if s == talaris.StageWireToCallback {
					why = " (no kernel receive timestamps: multishot recv has no cmsg)"
				}
				fmt.Fprintf(w, "  %-22s %9s%s\n", s, "-", why)
				continue
			}
			fmt.Fprintf(w, "  %-22s %9s %9s %9s %9s %9s %9s\n", s, fmtNs(int64(h.Min)), fmtNs(int64(h.P50)),
				fmtNs(int64(h.P90)), fmtNs(int64(h.P99)), fmtNs(int64(h.P999)), fmtNs(int64(h.Max)))
		}
	}
	// Every counter, the loop's internal ones included, by its Prometheus
	// name without the talaris_ prefix and _total suffix.
	fmt.Fprint(w, "loop:")
	sep := " "
	m.EachCounter(func(name, _ string, v uint64) {
		fmt.Fprintf(w, "%s%s %d", sep, strings.TrimSuffix(strings.TrimPrefix(name, "talaris_"), "_total"), v)
		sep = ", "
	})
	fmt.Fprintln(w)
}

// stagesLine is a one-line p50/p99 of each in-process stage for live
// displays (an interval snapshot).
func stagesLine(m talaris.Metrics) string {
	if m.Sampled == 0 {
		return "stages: no samples"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "stages p50/p99 (%d sampled):", m.Sampled)
	for _, s := range []struct {
		st   talaris.Stage
		name string
	}{{talaris.StageCQEToPlaintext, "cqe>pt"}, {talaris.StagePlaintextToPublish, "pt>pub"},
		{talaris.StagePublishToCallback, "pub>cb"}, {talaris.StageCQEToCallback, "cqe>cb"}} {
		h := m.Stages[s.st]
		fmt.Fprintf(&b, "  %s %s/%s", s.name, fmtNs(int64(h.P50)), fmtNs(int64(h.P99)))
	}
	return b.String()
}
