//go:build linux

package main

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talaris-go/talaris"
)

// burnThread spins on the calling (locked) thread until its own CPU clock
// has advanced by d: CPU time, not wall time, so a loaded machine only makes
// it take longer.
func burnThread(t *testing.T, d time.Duration) {
	t.Helper()
	var ts unix.Timespec
	now := func() time.Duration {
		if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ts.Nano())
	}
	end := now() + d
	x := 0
	for now() < end {
		for i := range 10000 {
			x += i
		}
	}
	runtime.KeepAlive(x)
}

func findTask(ts []taskCPU, tid int) *taskCPU {
	for i := range ts {
		if ts[i].Tid == tid {
			return &ts[i]
		}
	}
	return nil
}

// TestTasksCPUThisThread: CPU burnt on one locked thread shows up on that
// thread's tid in the per-thread snapshot, and the per-thread times add up
// to no more than the process's getrusage total.
func TestTasksCPUThisThread(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	before, c0 := tasksCPU(), cpuSeconds()
	if findTask(before, tid) == nil {
		t.Fatalf("tid %d not in /proc/self/task snapshot %v", tid, before)
	}
	const burn = 60 * time.Millisecond
	burnThread(t, burn)
	after, c1 := tasksCPU(), cpuSeconds()
	d := tasksDelta(before, after)
	me := findTask(d, tid)
	if me == nil || me.CPU < burn.Seconds() {
		t.Fatalf("this thread's delta %+v, want >= %v", me, burn)
	}
	sum := 0.0
	for _, x := range d {
		if x.CPU < 0 {
			t.Fatalf("negative delta %+v", x)
		}
		sum += x.CPU
	}
	// getrusage is read after the second snapshot: it can only be larger
	// (one clock tick of slack for its own rounding).
	if sum > c1-c0+0.011 {
		t.Fatalf("threads sum to %.4f s, the process used %.4f s", sum, c1-c0)
	}
	var r Result
	threadSplit(&r, d, tid, false)
	if r.PumpCPUSecs != me.CPU {
		t.Fatalf("pump %.4f s, want this thread's %.4f s", r.PumpCPUSecs, me.CPU)
	}
}

// TestLoopThreadFound: a Pool's C loop thread is named talaris-loop and the
// per-thread snapshot finds it (a new tid with that name).
func TestLoopThreadFound(t *testing.T) {
	loops := func() map[int]bool {
		m := map[int]bool{}
		for _, x := range tasksCPU() {
			if x.Name == loopThreadName {
				m[x.Tid] = true
			}
		}
		return m
	}
	before := loops()
	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var fresh []int
	for tid := range loops() {
		if !before[tid] {
			fresh = append(fresh, tid)
		}
	}
	if len(fresh) != 1 {
		t.Fatalf("new %q threads after NewPool: %v, want one", loopThreadName, fresh)
	}
}

// TestThreadSplit: the attribution rules on a snapshot. The loop threads
// are the talaris-loop ones (summed; the busiest bounds the ceiling), the
// pump the given tid (else the busiest other), and a single-threaded
// client's one thread is both.
func TestThreadSplit(t *testing.T) {
	ts := []taskCPU{{1, "talaris", 0.05}, {2, loopThreadName, 0.40}, {3, "talaris", 0.30}, {4, loopThreadName, 0.10}, {5, "talaris", 0.02}}
	r := Result{Workload: "ingress", Frames: 1_000_000, Secs: 1, CPUSecs: 0.87}
	threadSplit(&r, ts, 5, false)
	r.finish()
	if r.LoopCPUSecs != 0.50 || r.LoopMaxCPUSecs != 0.40 || r.LoopThreads != 2 || r.PumpCPUSecs != 0.02 || r.SameThread {
		t.Fatalf("with pump tid: %+v", r)
	}
	if got := r.LoopCPUSecs + r.PumpCPUSecs + r.OtherCPUSecs; got < 0.8699 || got > 0.8701 {
		t.Fatalf("split sums to %v, want 0.87", got)
	}
	if r.CeilingFPS != 2.5e6 || loopCell(r) != "0.500 (2, busiest 0.400)" {
		t.Fatalf("two loops: ceiling %v from the busiest loop, cell %q", r.CeilingFPS, loopCell(r))
	}
	r = Result{}
	threadSplit(&r, ts, 0, false)
	if r.LoopMaxCPUSecs != 0.40 || r.PumpCPUSecs != 0.30 {
		t.Fatalf("busiest other as pump: %+v", r)
	}
	r = Result{Workload: "ingress", Frames: 2_000_000, Secs: 1, CPUSecs: 0.5}
	threadSplit(&r, []taskCPU{{7, "rust-talaris-be", 0.5}}, 0, true)
	r.finish()
	if !r.SameThread || r.LoopPerM != 0.25 || r.PumpPerM != 0.25 || r.CeilingFPS != 4e6 || pumpCell(r) != "= loop" {
		t.Fatalf("single-threaded client: %+v", r)
	}
}

// TestRustAnchorPerThread runs the Rust anchor client (when it has been
// built: build/rust-talaris, as ./build.sh bench does) against the
// in-process feed: it reports the crate version Cargo.lock pins and its
// per-thread CPU, and the driver attributes the busiest thread as both loop
// and pump.
func TestRustAnchorPerThread(t *testing.T) {
	b := &bench{warm: 50 * time.Millisecond, dur: 300 * time.Millisecond, clientCPU: -1}
	b.findRust("auto")
	if b.rustBin == "" {
		t.Skip(b.rustNote)
	}
	lock, err := os.ReadFile(filepath.Join(filepath.Dir(findTestdata()), "bench", "rust-talaris", "Cargo.lock"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, _ := strings.Cut(string(lock), "name = \"talaris\"\nversion = \"")
	want, _, _ := strings.Cut(after, "\"")
	if want == "" || b.rustCrate != "talaris "+want {
		t.Fatalf("client reports %q, Cargo.lock pins %q", b.rustCrate, want)
	}
	addr := startTestFeed(t)
	r, err := b.rustNet("ingress", addr, "/flood?size=64", 2, false, false)
	if err != nil {
		t.Fatal(err)
	}
	r.Workload = "ingress"
	r.finish()
	if r.Crate != b.rustCrate || r.Frames == 0 || len(r.Threads) == 0 || !r.SameThread || r.LoopCPUSecs <= 0 ||
		r.LoopCPUSecs != r.PumpCPUSecs || r.LoopCPUSecs > r.CPUSecs+0.011 || r.CeilingFPS <= 0 {
		t.Fatalf("rust ingress: %+v", r)
	}
}
