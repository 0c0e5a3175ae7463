package talaris

import (
	"io"
	"math"
	"strconv"
)

// writePrometheus writes m in the Prometheus text exposition format
// version 0.0.4, every sample labelled pool="<pool>"; an HTTP handler
// serving it sets Content-Type: text/plain; version=0.0.4; charset=utf-8.
//
//   - each counter of m (see Metrics.EachCounter) as a counter family named
//     talaris_<name>_total;
//   - each gauge of m (see Metrics.EachGauge) as a gauge family: the
//     pool's sample, then one with a conn label per Metrics.Conns entry;
//   - the stage latencies as one histogram family,
//     talaris_stage_latency_seconds, with a stage label (a Stage's String):
//     cumulative _bucket samples at LatencyBucketBounds() in seconds plus
//     le="+Inf", then _sum (seconds) and _count;
//   - talaris_stage_rejected_total{stage}: samples whose stamps went
//     backwards.
//
// Every stage is written, recorded or not, so the set of series is fixed.
// Pool.WritePrometheus writes it with the pool's Metrics and Config.Name;
// the tests reach it with a snapshot of their own through
// testhook.WritePrometheus. It makes one Write call.
func writePrometheus(w io.Writer, pool string, m *Metrics) error {
	b := make([]byte, 0, 16<<10)
	poolLabel := appendLabel(nil, "pool", pool)

	m.EachCounter(func(name, help string, v uint64) {
		b = appendFamilyHeader(b, name, help, "counter")
		b = appendSample(b, name, poolLabel, nil, nil)
		b = strconv.AppendUint(b, v, 10)
		b = append(b, '\n')
	})

	family := ""
	m.EachGauge(func(name, help, conn string, v uint64) {
		if name != family {
			b = appendFamilyHeader(b, name, help, "gauge")
			family = name
		}
		var connLabel []byte
		if conn != "" {
			connLabel = appendLabel(nil, "conn", conn)
		}
		b = appendSample(b, name, poolLabel, connLabel, nil)
		b = strconv.AppendUint(b, v, 10)
		b = append(b, '\n')
	})

	b = appendFamilyHeader(b, StageRejectedName, StageRejectedHelp, "counter")
	for s := range m.Stages {
		b = appendSample(b, StageRejectedName, poolLabel, appendLabel(nil, "stage", Stage(s).String()), nil)
		b = strconv.AppendUint(b, m.Stages[s].Rejected, 10)
		b = append(b, '\n')
	}

	b = appendFamilyHeader(b, StageLatencyName, StageLatencyHelp, "histogram")
	bucket := StageLatencyName + "_bucket"
	for s := range m.Stages {
		h := &m.Stages[s]
		stage := appendLabel(nil, "stage", Stage(s).String())
		for i, bound := range latencyBounds {
			le := appendLabel(nil, "le", formatFloat(bound.Seconds()))
			b = appendSample(b, bucket, poolLabel, stage, le)
			b = strconv.AppendUint(b, h.Buckets[i], 10)
			b = append(b, '\n')
		}
		b = appendSample(b, bucket, poolLabel, stage, appendLabel(nil, "le", "+Inf"))
		b = strconv.AppendUint(b, h.Count, 10)
		b = append(b, '\n')
		b = appendSample(b, StageLatencyName+"_sum", poolLabel, stage, nil)
		b = append(b, formatFloat(h.Sum.Seconds())...)
		b = append(b, '\n')
		b = appendSample(b, StageLatencyName+"_count", poolLabel, stage, nil)
		b = strconv.AppendUint(b, h.Count, 10)
		b = append(b, '\n')
	}
	_, err := w.Write(b)
	return err
}

// appendFamilyHeader appends the # HELP and # TYPE lines of a family.
func appendFamilyHeader(b []byte, name, help, typ string) []byte {
	b = append(b, "# HELP "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = appendEscaped(b, help, false)
	b = append(b, "\n# TYPE "...)
	b = append(b, name...)
	b = append(b, ' ')
	b = append(b, typ...)
	return append(b, '\n')
}

// appendSample appends `name{labels} ` where labels are the non-empty
// pre-rendered label pairs joined by commas; the caller appends the value.
func appendSample(b []byte, name string, labels ...[]byte) []byte {
	b = append(b, name...)
	b = append(b, '{')
	first := true
	for _, l := range labels {
		if len(l) == 0 {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(b, l...)
	}
	return append(b, "} "...)
}

// appendLabel appends name="value" with the value escaped as the text
// format asks: backslash, double quote and newline.
func appendLabel(b []byte, name, value string) []byte {
	b = append(b, name...)
	b = append(b, `="`...)
	b = appendEscaped(b, value, true)
	return append(b, '"')
}

// appendEscaped appends s with backslash and newline escaped (HELP text)
// and, when quoted, double quotes too (label values).
func appendEscaped(b []byte, s string, quoted bool) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, `\\`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '"' && quoted:
			b = append(b, `\"`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// formatFloat renders v as the text format expects (Go float syntax,
// +Inf/-Inf/NaN spelled out).
func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
