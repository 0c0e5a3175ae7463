//go:build linux

package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Per-thread CPU accounting for the ingress rows: the
// whole-process figure says what a frame costs, the per-thread figures say
// which thread would bound throughput on a machine with cores to spare.

// loopThreadName is the name the C loop gives its thread (name_loop_thread
// in csrc/loop/setup.c), as /proc/self/task/<tid>/comm shows it.
const loopThreadName = "talaris-loop"

// taskCPU is one thread's CPU time (user + system) at a point in time, or
// over an interval after delta.
type taskCPU struct {
	Tid  int     `json:"tid"`
	Name string  `json:"name"`
	CPU  float64 `json:"cpu_s"`
}

// threadCPUSeconds reads the CPU time of thread tid of this process from its
// per-thread CPU clock (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED): the
// scheduler's nanosecond runtime, the same sum utime + stime estimate), and
// falls back to utime + stime of /proc/self/task/<tid>/stat (clock ticks).
func threadCPUSeconds(tid int) (float64, bool) {
	var ts unix.Timespec
	clock := int32(^uint32(tid)<<3 | 6)
	if unix.ClockGettime(clock, &ts) == nil {
		return float64(ts.Sec) + float64(ts.Nsec)/1e9, true
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/stat", tid))
	if err != nil {
		return 0, false
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0, false
	}
	f := strings.Fields(s[i+2:]) // f[0] is field 3 (state): utime is field 14, stime 15
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseFloat(f[11], 64)
	st, err2 := strconv.ParseFloat(f[12], 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return (ut + st) / 100, true // USER_HZ is 100 on Linux
}

// tasksCPU snapshots every thread of this process.
func tasksCPU() []taskCPU {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil
	}
	out := make([]taskCPU, 0, len(ents))
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		name, _ := os.ReadFile("/proc/self/task/" + e.Name() + "/comm")
		if cpu, ok := threadCPUSeconds(tid); ok {
			out = append(out, taskCPU{Tid: tid, Name: strings.TrimSpace(string(name)), CPU: cpu})
		}
	}
	return out
}

// tasksDelta is each thread's CPU time between two snapshots; a thread born
// in between counts from zero, one that ended is lost (its time is still in
// the process total).
func tasksDelta(before, after []taskCPU) []taskCPU {
	prev := make(map[int]float64, len(before))
	for _, t := range before {
		prev[t.Tid] = t.CPU
	}
	out := make([]taskCPU, 0, len(after))
	for _, t := range after {
		t.CPU = max(t.CPU-prev[t.Tid], 0)
		out = append(out, t)
	}
	return out
}

// threadSplit attributes an interval's per-thread CPU to the loop threads,
// the pump thread and the rest, and fills r's per-thread fields. The loop
// threads are every thread named talaris-loop (Config.Loops of them; a
// closed pool's threads have exited): LoopCPUSecs is their sum and
// LoopMaxCPUSecs the busiest one's, which is what bounds throughput. The
// pump is pumpTid, or the busiest remaining thread when pumpTid is 0; for a
// single-threaded client (the Rust crate, whose pool thread is both) loop
// and pump are the same thread (sameThread).
func threadSplit(r *Result, ts []taskCPU, pumpTid int, sameThread bool) {
	isLoop := make([]bool, len(ts))
	nloop, busiest := 0, -1
	for i, t := range ts {
		if t.Name == loopThreadName && !sameThread {
			isLoop[i] = true
			nloop++
			if busiest < 0 || t.CPU > ts[busiest].CPU {
				busiest = i
			}
		}
	}
	pump := -1
	for i, t := range ts {
		if isLoop[i] {
			continue
		}
		if pumpTid != 0 {
			if t.Tid == pumpTid {
				pump = i
			}
		} else if pump < 0 || t.CPU > ts[pump].CPU {
			pump = i
		}
	}
	if sameThread && pump >= 0 {
		isLoop[pump], nloop, busiest = true, 1, pump
	}
	if nloop == 0 && pump < 0 {
		return
	}
	other, loops := 0.0, 0.0
	for i, t := range ts {
		switch {
		case isLoop[i]:
			loops += t.CPU
		case i != pump:
			other += t.CPU
		}
	}
	if busiest >= 0 {
		r.LoopCPUSecs, r.LoopMaxCPUSecs, r.LoopThreads = loops, ts[busiest].CPU, nloop
	}
	if pump >= 0 {
		r.PumpCPUSecs = ts[pump].CPU
	}
	r.OtherCPUSecs = other
	r.SameThread = sameThread
}
