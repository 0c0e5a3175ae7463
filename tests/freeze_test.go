package talaris_test

import (
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"
)

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
