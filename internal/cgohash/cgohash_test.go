package cgohash

import (
	"os"
	"path/filepath"
	"testing"
)

// TestSumFolders: the sum covers the layer folders under csrc/ (an edit or
// a move there changes it) and skips the C tests, fuzzers and benchmarks.
func TestSumFolders(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, s string) {
		t.Helper()
		p := filepath.Join(dir, "csrc", filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sum := func() string {
		t.Helper()
		s, err := Sum(dir)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	write("talaris.h", "api")
	write("base/evq.h", "a")
	write("base/evq.c", "b")
	s0 := sum()

	write("base/evq.c", "c")
	s1 := sum()
	if s1 == s0 {
		t.Fatal("an edit in csrc/base left the sum unchanged")
	}

	if err := os.Remove(filepath.Join(dir, "csrc", "base", "evq.c")); err != nil {
		t.Fatal(err)
	}
	write("loop/evq.c", "c")
	if sum() == s1 {
		t.Fatal("moving a file between folders left the sum unchanged")
	}
	s2 := sum()

	write("test/test_x.c", "t")
	write("fuzz/fuzz_x.c", "f")
	write("bench/bench_x.c", "b")
	write("base/notes.txt", "n")
	if sum() != s2 {
		t.Fatal("a C test, fuzzer, benchmark or non-C file changed the sum")
	}
}
