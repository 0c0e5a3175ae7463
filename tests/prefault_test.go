//go:build linux && cgo

package talaris_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/talaris-go/talaris"
)

// rssBytes is this process's resident set (VmRSS).
func rssBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// TestPrefault: a zero Config maps the 64 MiB arena and the 16 MiB of
// receive slots lazily (NewPool adds far less than them to the resident
// set); Tuning.Prefault populates both up front (it adds at least them).
func TestPrefault(t *testing.T) {
	const arena, slots = 64 << 20, 16 << 20 // the Config defaults
	for _, prefault := range []bool{false, true} {
		before := rssBytes(t)
		p, err := talaris.NewPool(talaris.Config{Tuning: talaris.Tuning{Prefault: prefault}})
		if err != nil {
			t.Fatal(err)
		}
		grew := rssBytes(t) - before
		p.Close()
		t.Logf("Prefault %v: NewPool added %d MiB of RSS", prefault, grew>>20)
		if prefault && grew < arena+slots {
			t.Errorf("Prefault: RSS grew %d bytes, want at least the arena and slots (%d)", grew, arena+slots)
		}
		if !prefault && grew > (arena+slots)/4 {
			t.Errorf("zero Config: RSS grew %d bytes, want well under the arena and slots (%d)", grew, arena+slots)
		}
	}
}
