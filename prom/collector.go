// Package prom exports a talaris Pool's metrics to Prometheus through
// github.com/prometheus/client_golang. It is a module of its own so that
// the talaris library keeps no dependency on client_golang; the library's
// Pool.WritePrometheus writes the same families as text without it.
//
//	reg.MustRegister(prom.NewCollector(pool, "feed-a"))
package prom

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/talaris-go/talaris"
)

// MetricsSource is what the collector reads on every scrape. *talaris.Pool
// satisfies it (Pool.Metrics returns the cumulative snapshot).
type MetricsSource interface {
	Metrics() talaris.Metrics
}

// NewCollector returns a Collector exporting src's metrics with the label
// pool="<pool>" on every series: the same families, names, help texts,
// labels and buckets as talaris.Pool.WritePrometheus (every counter of
// talaris.Metrics.EachCounter, every gauge of talaris.Metrics.EachGauge
// with its conn label, talaris_stage_rejected_total{stage} and the
// histogram talaris_stage_latency_seconds{stage} with
// talaris.LatencyBucketBounds in seconds). One difference in form: a
// gauge's pool-wide sample carries conn="" (client_golang gives every
// sample of a family the same label names), where WritePrometheus leaves
// the label out; Prometheus stores the two alike. It calls src.Metrics
// once per Collect and builds const metrics from that one snapshot, so a
// scrape is consistent.
func NewCollector(src MetricsSource, pool string) prometheus.Collector {
	c := &collector{src: src}
	labels := prometheus.Labels{"pool": pool}
	var zero talaris.Metrics
	zero.EachCounter(func(name, help string, _ uint64) {
		c.counters = append(c.counters, prometheus.NewDesc(name, help, nil, labels))
	})
	c.gauges = map[string]*prometheus.Desc{}
	zero.EachGauge(func(name, help, _ string, _ uint64) {
		c.gauges[name] = prometheus.NewDesc(name, help, []string{"conn"}, labels)
		c.gaugeOrder = append(c.gaugeOrder, c.gauges[name])
	})
	c.rejected = prometheus.NewDesc(talaris.StageRejectedName, talaris.StageRejectedHelp, []string{"stage"}, labels)
	c.latency = prometheus.NewDesc(talaris.StageLatencyName, talaris.StageLatencyHelp, []string{"stage"}, labels)
	for i, d := range talaris.LatencyBucketBounds() {
		c.bounds[i] = d.Seconds()
	}
	return c
}

type collector struct {
	src      MetricsSource
	counters []*prometheus.Desc // in EachCounter order
	// gauges by name, labelled conn; gaugeOrder in EachGauge order
	gauges     map[string]*prometheus.Desc
	gaugeOrder []*prometheus.Desc
	rejected   *prometheus.Desc
	latency    *prometheus.Desc
	bounds     [talaris.NumLatencyBuckets]float64
}

// Describe sends every family's descriptor.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.counters {
		ch <- d
	}
	for _, d := range c.gaugeOrder {
		ch <- d
	}
	ch <- c.rejected
	ch <- c.latency
}

// Collect takes one snapshot from the source and sends it as const metrics.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := c.src.Metrics()
	i := 0
	m.EachCounter(func(_, _ string, v uint64) {
		ch <- prometheus.MustNewConstMetric(c.counters[i], prometheus.CounterValue, float64(v))
		i++
	})
	m.EachGauge(func(name, _, conn string, v uint64) {
		ch <- prometheus.MustNewConstMetric(c.gauges[name], prometheus.GaugeValue, float64(v), conn)
	})
	for s := range m.Stages {
		h := &m.Stages[s]
		stage := talaris.Stage(s).String()
		ch <- prometheus.MustNewConstMetric(c.rejected, prometheus.CounterValue, float64(h.Rejected), stage)
		buckets := make(map[float64]uint64, len(c.bounds))
		for j, b := range c.bounds {
			buckets[b] = h.Buckets[j]
		}
		ch <- prometheus.MustNewConstHistogram(c.latency, h.Count, h.Sum.Seconds(), buckets, stage)
	}
}
