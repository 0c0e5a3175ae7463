//go:build linux && cgo

package talaris_test

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
)

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

// TestLoopThreadName: each Pool's C loop runs on one new thread named
// "talaris-loop", which is gone once Pool.Close has returned.
func TestLoopThreadName(t *testing.T) {
	before := loopTids(t)
	p, err := talaris.NewPool(smallPool())
	if err != nil {
		t.Fatal(err)
	}
	var fresh []int
	for tid := range loopTids(t) {
		if !before[tid] {
			fresh = append(fresh, tid)
		}
	}
	if len(fresh) != 1 {
		p.Close()
		t.Fatalf("new talaris-loop threads after NewPool: %v, want exactly one", fresh)
	}
	p.Close()
	// Close joins the thread; the kernel wakes the joiner a moment before
	// the task leaves /proc, hence the short wait (bounded generously).
	for deadline := time.Now().Add(5 * time.Second); taskLive(fresh[0]); {
		if time.Now().After(deadline) {
			t.Fatalf("loop thread %d still running 5 s after Pool.Close returned", fresh[0])
		}
		time.Sleep(time.Millisecond)
	}
}
