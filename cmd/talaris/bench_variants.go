//go:build linux

package main

import (
	"strings"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
)

type talVariant struct {
	name       string
	loop, cons talaris.WaitStrategy
	spin       bool          // pump with a loop over PumpDataNowait instead of PumpData
	spinTime   time.Duration // Config.SpinTime (0: the default)
	ringFlags  uint32        // testhook.Knobs.RingFlags (0: the default)
	evRing     uint32        // testhook.Knobs.EventRingSize (0: the default)
	connEvents uint32        // testhook.Knobs.MaxConnPendingEvents (0: the default)
	noDirect   bool          // testhook.Knobs.NoDirectSend
	bell       bool          // testhook.Knobs.ReplyDoorbell
	loops      int           // Config.Loops (0: the default)
	noBundle   bool          // testhook.Knobs.NoRecvBundle
	noTLSRec   bool          // Config.Tuning.NoTLSRecordLayer
	libGCM     bool          // Config.Tuning.NoOwnGCM
	replySpin  time.Duration // Config.Tuning.ReplySpin (0: the default)
	inline     bool          // Config.Tuning.InlineLoop
	minWait    time.Duration // Config.Tuning.MinWait (0: the default; negative: off)
	minWaitN   int           // testhook.Knobs.MinWaitCompletions (0: the default)
	bufSize    uint32        // Config.BufSize (0: the default)
	bufCount   uint32        // Config.BufCount (0: the default)
}

// talVariants are the talaris configurations the bench can run (--variants).
// "default" is the zero Config: Wait is WaitAdaptive, every Tuning switch at its default.
var talVariants = []talVariant{
	{name: "default"},
	{name: "block", loop: talaris.WaitBlock, cons: talaris.WaitBlock},
	{name: "spin", loop: talaris.WaitSpin, cons: talaris.WaitSpin, spin: true},
	{name: "spin-then-block", loop: talaris.WaitSpinThenBlock, cons: talaris.WaitSpinThenBlock},
	{name: "adaptive", loop: talaris.WaitAdaptive, cons: talaris.WaitAdaptive},
	// The loop blocks; the pump spins 5us before it sleeps, so a flood's next
	// batch usually finds it awake (no futex wake-up per batch).
	{name: "block+pumpspin", loop: talaris.WaitBlock, cons: talaris.WaitSpinThenBlock, spinTime: 5 * time.Microsecond},
	// Variants measured while choosing the default wait strategy.
	{name: "adaptive50", loop: talaris.WaitAdaptive, cons: talaris.WaitAdaptive, spinTime: 50 * time.Microsecond},
	{name: "adaptive35", loop: talaris.WaitAdaptive, cons: talaris.WaitAdaptive, spinTime: 35 * time.Microsecond},
	{name: "adaptive100", loop: talaris.WaitAdaptive, cons: talaris.WaitAdaptive, spinTime: 100 * time.Microsecond},
	{name: "adaptive200", loop: talaris.WaitAdaptive, cons: talaris.WaitAdaptive, spinTime: 200 * time.Microsecond},
	{name: "adaptive-pump", loop: talaris.WaitBlock, cons: talaris.WaitAdaptive},
	{name: "adaptive-loop", loop: talaris.WaitAdaptive, cons: talaris.WaitBlock},
	{name: "loopspin", loop: talaris.WaitSpinThenBlock, cons: talaris.WaitBlock},
	{name: "pumpspin", loop: talaris.WaitBlock, cons: talaris.WaitSpinThenBlock},
	{name: "sqpoll", ringFlags: testhook.RingSQPoll | testhook.RingSingleIssuer},
	// The default with a 4096-event ring: how much of the orders
	// workload's round trip is the flood queued ahead of the echo.
	{name: "default-ring4k", evRing: 4096},
	// The default with another share of the ring per connection
	// (MaxConnPendingEvents; "fair-off": the whole ring, as before the
	// share existed).
	{name: "fair64", connEvents: 64},
	{name: "fair128", connEvents: 128},
	{name: "fair256", connEvents: 256},
	{name: "fair512", connEvents: 512},
	{name: "fair1k", connEvents: 1024},
	{name: "fair2k", connEvents: 2048},
	{name: "fair4k", connEvents: 4096},
	{name: "fair-off", connEvents: 1 << 30},
	// The default with every send going through the loop (what
	// the direct send path buys).
	{name: "nodirect", noDirect: true},
	// The default with the pump's reply doorbell (after
	// a direct send the reply's data wakes the pump with the loop).
	{name: "bell", bell: true},
	// The default with its connections sharded over 2, 3 or 4 loop
	// threads (Config.Loops).
	{name: "loops2", loops: 2},
	{name: "loops3", loops: 3},
	{name: "loops4", loops: 4},
	// The default without recv bundles (testhook.Knobs.NoRecvBundle).
	{name: "nobundle", noBundle: true},
	// The default with every TLS record opened by the library's SSL_read
	// (Config.Tuning.NoTLSRecordLayer).
	{name: "notlsrec", noTLSRec: true},
	// The record layer with the TLS library's AES-GCM instead of talaris'
	// own VAES code (Config.Tuning.NoOwnGCM).
	{name: "libgcm", libGCM: true},
	// The same pair with both sides blocking (WaitBlock): whether a row's
	// CPU per frame follows the cipher or the adaptive wait's spinning.
	{name: "block-libgcm", loop: talaris.WaitBlock, cons: talaris.WaitBlock, libGCM: true},
	// The default without the reply spin, or with another length
	// (Config.Tuning.ReplySpin).
	{name: "noreplyspin", replySpin: -1},
	{name: "replyspin100", replySpin: 100 * time.Microsecond},
	{name: "replyspin1m", replySpin: time.Millisecond},
	// The default with no loop thread: the pump goroutine runs the loop
	// (Config.Tuning.InlineLoop).
	{name: "inline", inline: true},
	{name: "inline-noreplyspin", inline: true, replySpin: -1},
	// The default with the loop's minimum-wait batching off, or on with
	// another wait or completion count (Config.Tuning.MinWait,
	// testhook.Knobs.MinWaitCompletions).
	{name: "nominwait", minWait: -1},
	{name: "minwait20", minWait: 20 * time.Microsecond},
	{name: "minwait50", minWait: 50 * time.Microsecond},
	{name: "minwait100", minWait: 100 * time.Microsecond},
	{name: "minwait200", minWait: 200 * time.Microsecond},
	{name: "minwait50-n64", minWait: 50 * time.Microsecond, minWaitN: 64},
	{name: "minwait100-n64", minWait: 100 * time.Microsecond, minWaitN: 64},
	// Provided receive buffers: fewer or smaller, so what the kernel copied
	// is still in cache when the loop parses it.
	{name: "bufs256", bufCount: 256},
	{name: "buf4k", bufSize: 4096, bufCount: 1024},
	{name: "buf64k-128", bufSize: 65536, bufCount: 128},
	{name: "buf64k-256", bufSize: 65536, bufCount: 256},
}

// variantNames lists the variants for --help.
func variantNames() string {
	var n []string
	for _, v := range talVariants {
		n = append(n, v.name)
	}
	return strings.Join(n, ",")
}

// variant returns the talVariant called name.
func variant(name string) talVariant {
	for _, v := range talVariants {
		if v.name == name {
			return v
		}
	}
	panic("no talaris variant " + name)
}
