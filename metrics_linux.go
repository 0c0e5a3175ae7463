//go:build linux && cgo

package talaris

// The Linux half of Pool.Metrics, ConnCount and testhook.Stats: the loops'
// published counters, summed over the shards (the gauges: gauges_linux.go).

/*
#include <stdlib.h>
#include "csrc/talaris.h"
*/
import "C"

import (
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/talaris-go/talaris/internal/testhook"
)

// poolMetrics is what Go keeps for Pool.Metrics beside the loops'
// counters.
type poolMetrics struct {
	// rec folds the stamps of sampled messages into Metrics' histograms
	// (nil when Config.SampleEvery is 0). Written only by the pumper.
	rec    *metricsRecorder
	start  time.Time
	labels connLabels // per slot: the dial's DialOptions.Label (gauges_linux.go)
}

func (p *Pool) connCount() int {
	if p.closed.Load() {
		return 0 // every connection ended with the loop; their events were dropped
	}
	return int(p.nconns.Load())
}

// loadStats sums the loops' counters: live ones with atomic loads, the
// final copies once the loops are freed. (Every field is a count.)
func (p *Pool) loadStats() C.struct_tl_pool_stats {
	p.freeMu.RLock()
	defer p.freeMu.RUnlock()
	var out C.struct_tl_pool_stats
	dst := unsafe.Slice((*uint64)(unsafe.Pointer(&out)), unsafe.Sizeof(out)/8)
	freed := p.freed.Load()
	for _, sh := range p.shards {
		if freed {
			src := unsafe.Slice((*uint64)(unsafe.Pointer(&sh.final)), len(dst))
			for i := range src {
				dst[i] += src[i]
			}
			continue
		}
		src := unsafe.Slice((*uint64)(unsafe.Pointer(sh.cstats)), len(dst))
		for i := range src {
			dst[i] += atomic.LoadUint64(&src[i])
		}
	}
	return out
}

func (p *Pool) poolStats() testhook.PoolStats {
	s := p.loadStats()
	return testhook.PoolStats{
		Events: uint64(s.events), Batches: uint64(s.batches), CQEs: uint64(s.cqes), Rearms: uint64(s.rearms),
		NoBufs: uint64(s.nobufs), Stalls: uint64(s.stalls), LoopWakes: uint64(s.loop_wakes),
		PumpSleeps:       uint64(s.pump_sleeps),
		Reconnects:       uint64(s.reconnects),
		FairHolds:        uint64(s.fair_holds),
		TLSRecords:       uint64(s.tls_records),
		TLSRecordsOwnGCM: uint64(s.tls_records_gcm),
		MinWaits:         uint64(s.min_waits),
		RecvRevived:      uint64(s.recv_revived),
		BellSleeps:       p.bellSleeps.Load(),
		BellRings:        p.bellRings.Load(),
		ReplySpins:       p.replySpins.Load(),
		ReplyLate:        p.replyLates.Load(),
	}
}

// metrics is Metrics (reset false) or MetricsInterval (reset true).
func (p *Pool) metrics(reset bool) Metrics {
	var m Metrics
	if p.rec != nil {
		m = p.rec.snapshot(reset)
	} else {
		m.Elapsed = time.Since(p.start)
	}
	s := p.loadStats()
	m.Messages, m.Bytes, m.WireBytes = uint64(s.msgs), uint64(s.bytes), uint64(s.wire_bytes)
	m.loop = testhook.LoopCounters{
		Events: uint64(s.events), Completions: uint64(s.cqes), Rearms: uint64(s.rearms),
		NoBufs: uint64(s.nobufs), Stalls: uint64(s.stalls), Batches: uint64(s.batches),
		PumpSleeps: uint64(s.pump_sleeps), LoopWakes: uint64(s.loop_wakes),
	}
	m.SendQueueFull, m.Reconnects = uint64(s.sendq_full)+p.txFullTotal.Load(), uint64(s.reconnects)
	m.RecvRevived = uint64(s.recv_revived)
	m.SendDropped = uint64(s.send_dropped)
	m.TLSRecords, m.TLSRecordsOwnGCM = uint64(s.tls_records), uint64(s.tls_records_gcm)
	m.GCMSelfTestFailures = uint64(C.tl_gcm_selftest_failed())
	p.gauges(&m)
	return m
}

func (p *Pool) name() string { return p.cfg.Name }
