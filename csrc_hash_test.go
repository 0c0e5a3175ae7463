//go:build linux && cgo

package talaris

import (
	"testing"

	"github.com/talaris-go/talaris/internal/cgohash"
)

// TestCSourceHash fails when csrc/ changed but csrc_hash.go was not
// regenerated: the build cache could then be running an old C core.
func TestCSourceHash(t *testing.T) {
	sum, err := cgohash.Sum(".")
	if err != nil {
		t.Fatal(err)
	}
	if sum != csrcHash {
		t.Fatalf("csrc/ fingerprint %s, csrc_hash.go says %s: run `go run ./internal/cgohash/gen` (./build.sh does)", sum, csrcHash)
	}
}
