package talaris

import (
	"runtime"
	"testing"
	"time"
)

// TestLockedToThread holds the runtime to the stack header lockedToThread
// reads: a Go release that changed it would turn the pump's passes through
// the scheduler on for locked goroutines (40-50 us each) without this.
func TestLockedToThread(t *testing.T) {
	var buf [64]byte
	done := make(chan [3]bool)
	go func() {
		var r [3]bool
		r[0] = lockedToThread(buf[:])
		runtime.LockOSThread()
		r[1] = lockedToThread(buf[:])
		runtime.UnlockOSThread()
		r[2] = lockedToThread(buf[:])
		done <- r
	}()
	if r := <-done; r != [3]bool{false, true, false} {
		t.Fatalf("locked before, inside, after LockOSThread: %v, want [false true false]", r)
	}
	if n := testing.AllocsPerRun(100, func() { lockedToThread(buf[:]) }); n != 0 {
		t.Fatalf("lockedToThread allocates %v times", n)
	}
}

// TestPumpSchedPacing: beforeSleep passes through the scheduler once per
// pumpSchedEvery while the pump sleeps often, never after a long sleep,
// and never on a goroutine locked to its thread.
func TestPumpSchedPacing(t *testing.T) {
	ms := int64(time.Millisecond)
	every := int64(pumpSchedEvery)
	run := func(locked bool) (passes []int64) {
		done := make(chan []int64)
		go func() {
			if locked {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
			}
			var s pumpSched
			var got []int64
			now := int64(1000 * ms)
			// Sleeps every 100 us for 50 ms, then one of 100 ms (idle),
			// then every 100 us again for 20 ms.
			for ; now < 1050*ms; now += ms / 10 {
				if s.beforeSleep(now) {
					got = append(got, now)
					if s.beforeSleep(now) {
						t.Error("passed twice in a row")
					}
				}
			}
			now += 100 * ms
			if s.beforeSleep(now) {
				got = append(got, -now) // a pass after a long sleep
			}
			for end := now + 20*ms; now < end; now += ms / 10 {
				if s.beforeSleep(now) {
					got = append(got, now)
				}
			}
			done <- got
		}()
		return <-done
	}
	passes := run(false)
	if len(passes) < 7 {
		t.Fatalf("passes at %v: want one per %v over 70 ms of frequent sleeps", passes, pumpSchedEvery)
	}
	for i, p := range passes {
		if p < 0 {
			t.Fatalf("passed right after a 100 ms sleep (passes %v)", passes)
		}
		if i > 0 && p-passes[i-1] < every && p-passes[i-1] > 0 {
			t.Fatalf("passes %d and %d %v apart, under %v", i-1, i, time.Duration(p-passes[i-1]), pumpSchedEvery)
		}
	}
	if gaps := passes[1] - passes[0]; gaps > every+ms {
		t.Fatalf("first two passes %v apart, want about %v", time.Duration(gaps), pumpSchedEvery)
	}
	if locked := run(true); len(locked) != 0 {
		t.Fatalf("a locked goroutine passed at %v", locked)
	}
}
