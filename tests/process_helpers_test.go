//go:build linux && cgo

package talaris_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Probes of this process: descriptors, memory, the loop threads and their
// CPU, freezes of the whole process (freezeWatch), log records.

// procFDs is the number of open descriptors of this process.
func procFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("read /proc/self/fd: %v", err)
	}
	return len(ents) - 1 // (the directory's own descriptor)
}

// procStatusKB returns a "Name:   N kB" field of /proc/self/status.
func procStatusKB(t testing.TB, name string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatalf("read /proc/self/status: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", name, line, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/self/status", name)
	return 0
}

// waitFDs waits until the process holds at most want descriptors: the
// peers' ends close in their own goroutines after the client's final
// event. A guard, not a timing assertion: on failure it lists them.
func waitFDs(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for procFDs(t) > want {
		if time.Now().After(deadline) {
			var b strings.Builder
			ents, _ := os.ReadDir("/proc/self/fd")
			for _, e := range ents {
				l, _ := os.Readlink("/proc/self/fd/" + e.Name())
				fmt.Fprintf(&b, " %s->%s", e.Name(), l)
			}
			t.Fatalf("%d descriptors open, want at most %d (the baseline):%s", procFDs(t), want, b.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitFor polls cond (nothing is pumped meanwhile) until it holds; a test
// guard, not a timing assertion: what it waits for happens in
// microseconds unless the loop is wrongly holding it back.
func waitFor(t *testing.T, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after 30s (%s)", what, state())
		}
		time.Sleep(time.Millisecond)
	}
}

// freezeWatch measures how long this test process was not running while a
// wall-clock bound was being timed: a process stopped (SIGSTOP), a VM
// whose vCPUs the host did not run, a box so loaded that no thread of the
// process got a CPU. A goroutine wakes every freezeTick; a wake-up late by
// more than freezeGap counts as a freeze of that length (the Go scheduler
// runs a ready goroutine within a few ms on a busy process, so a gap that
// long means none of the process's threads ran). Reproduced: a SIGSTOP of
// 1.3 s during TestPingIntervalKeepsIdleOpen/with ends the connection with
// the read timeout after 14 pongs, as the flake seen at load 7-13 did
// (12 pongs): neither side could send while frozen, and both the client's
// read timeout and the server's idle limit measure wall-clock time.
type freezeWatch struct {
	mu     sync.Mutex
	last   time.Time     // the watch's last wake-up
	total  time.Duration // sum of the freezes seen
	worst  time.Duration
	stop   chan struct{}
	done   chan struct{}
	closed bool
}

const (
	freezeTick = 10 * time.Millisecond
	freezeGap  = 100 * time.Millisecond
)

// watchFreezes starts a freezeWatch; it stops at Stop or when t ends.
func watchFreezes(t testing.TB) *freezeWatch {
	w := &freezeWatch{stop: make(chan struct{}), done: make(chan struct{}), last: time.Now()}
	go func() {
		defer close(w.done)
		tk := time.NewTicker(freezeTick)
		defer tk.Stop()
		for {
			select {
			case <-w.stop:
				w.see(true)
				return
			case <-tk.C:
				w.see(true)
			}
		}
	}()
	t.Cleanup(w.Stop)
	return w
}

// see returns the freezes so far, the time since the last wake-up
// included (the caller may come straight out of a freeze, before any tick
// ran after it); commit counts that time as seen.
func (w *freezeWatch) see(commit bool) (total, worst time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now() // (a tick's own time is when it was due, not when we ran)
	total, worst = w.total, w.worst
	if gap := now.Sub(w.last) - freezeTick; gap >= freezeGap {
		total += gap
		worst = max(worst, gap)
	}
	if commit {
		w.total, w.worst, w.last = total, worst, now
	}
	return total, worst
}

// Stop ends the watch (idempotent).
func (w *freezeWatch) Stop() {
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.stop)
	}
	w.mu.Unlock()
	<-w.done
}

// Frozen returns the total and the longest freeze seen so far.
func (w *freezeWatch) Frozen() (total, worst time.Duration) { return w.see(false) }

// Running returns d less the freezes seen so far: how long the process
// ran of a span d timed while the watch ran. Upper bounds on wall-clock
// spans compare it, so that a stopped or starved process is not blamed on
// the code under test (whose own timers go on meanwhile: a freeze never
// makes a timeout fire late, only the test's clock read late).
func (w *freezeWatch) Running(d time.Duration) time.Duration {
	total, _ := w.see(false)
	return d - total
}

// TestFreezeWatch: the watch sees no freeze over a plain sleep, and sees
// one of the process's own: a child shell stops the whole process with
// SIGSTOP and continues it with SIGCONT 400 ms later. The child sends both,
// in that order, so the stop always ends. (When the test sent SIGSTOP
// itself, racing a child's timed SIGCONT, a stop that came late - the
// test goroutine not run for 400 ms on a loaded machine - was never
// continued: the process stayed stopped, beyond any timeout. A SIGCONT
// that lands while a multithreaded process is still stopping can even
// leave it stopped later: seen with a child sending SIGCONT every 50 ms
// around a self-sent SIGSTOP, in 4 of 6 go test runs.)
func TestFreezeWatch(t *testing.T) {
	w := watchFreezes(t)
	time.Sleep(200 * time.Millisecond)
	if _, worst := w.Frozen(); worst >= 400*time.Millisecond {
		t.Logf("frozen %v over a 200 ms sleep (a loaded box)", worst)
	}
	pid := strconv.Itoa(os.Getpid())
	t0 := time.Now()
	if err := exec.Command("sh", "-c", "kill -STOP "+pid+"; sleep 0.4; kill -CONT "+pid).Run(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Since(t0)  // the child's whole run: the stop and a little more
	time.Sleep(3 * freezeTick) // the watch's next tick
	total, worst := w.Frozen()
	t.Logf("stopped within %v: the watch saw %v (longest %v)", stopped, total, worst)
	if worst < 300*time.Millisecond {
		t.Errorf("the process was stopped for 400 ms; the watch's longest freeze is %v", worst)
	}
	if run := w.Running(stopped); run > stopped-300*time.Millisecond {
		t.Errorf("the process was stopped for 400 ms of %v; the watch says it ran %v of it", stopped, run)
	}
	w.Stop()
	w.Stop() // idempotent
}

// syncBuffer is a bytes.Buffer for a slog handler written from several
// goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) records(t *testing.T) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(s.b.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// findRecord returns the first record with msg, or nil.
func findRecord(recs []map[string]any, msg string) map[string]any {
	for _, r := range recs {
		if r["msg"] == msg {
			return r
		}
	}
	return nil
}

// loopTids lists this process's threads named "talaris-loop" (the name the
// C loop gives its thread, so tools and `talaris bench` can find it).
func loopTids(t *testing.T) map[int]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	m := map[int]bool{}
	for _, e := range ents {
		comm, err := os.ReadFile("/proc/self/task/" + e.Name() + "/comm")
		if err != nil {
			continue // the thread ended while we listed
		}
		if strings.TrimSpace(string(comm)) == "talaris-loop" {
			tid, _ := strconv.Atoi(e.Name())
			m[tid] = true
		}
	}
	return m
}

// taskLive reports whether thread tid of this process still runs (its
// /proc entry exists and is not a zombie or dead task).
func taskLive(tid int) bool {
	stat, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/stat")
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// taskCPU is the CPU time (user and system) thread tid of this process
// has used, read from its per-thread CPU clock (the clock id
// pthread_getcpuclockid builds: MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)),
// to the nanosecond (threadCPU in run_test.go reads /proc's 10 ms ticks).
// Unlike cpuTime it counts that thread alone, not the in-process peers,
// the GC or the rest of the test binary, so a CPU check of the code under
// test does not depend on the machine's load: a thread that sleeps uses
// no CPU however busy the box is. The thread must still run (a loop
// thread: read it before Pool.Close). No testing.TB: goroutines that may
// not call t.Fatal read it.
func taskCPU(tid int) (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(int32(^uint32(tid)<<3|6), &ts); err != nil {
		return 0, fmt.Errorf("CPU clock of thread %d: %w", tid, err)
	}
	return time.Duration(ts.Nano()), nil
}

// tasksCPU sums taskCPU over tids.
func tasksCPU(tids map[int]bool) (time.Duration, error) {
	var d time.Duration
	for tid := range tids {
		c, err := taskCPU(tid)
		if err != nil {
			return 0, err
		}
		d += c
	}
	return d, nil
}

// newLoopTids returns the "talaris-loop" threads that are not in before
// (a loopTids taken earlier): the loop threads of the pools made since
// (a pool with a loop thread of its own was: none is a failure).
func newLoopTids(t *testing.T, before map[int]bool) map[int]bool {
	t.Helper()
	m := loopTids(t)
	for tid := range before {
		delete(m, tid)
	}
	if len(m) == 0 {
		t.Fatal("no new talaris-loop thread")
	}
	return m
}
