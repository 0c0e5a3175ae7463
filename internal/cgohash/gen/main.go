// Command gen rewrites csrc_hash.go when the C core changed.
package main

import (
	"bytes"
	"log"
	"os"

	"github.com/talaris-go/talaris/internal/cgohash"
)

func main() {
	sum, err := cgohash.Sum(".")
	if err != nil {
		log.Fatal(err)
	}
	want := []byte(cgohash.File(sum))
	if old, err := os.ReadFile("csrc_hash.go"); err == nil && bytes.Equal(old, want) {
		return
	}
	if err := os.WriteFile("csrc_hash.go", want, 0o644); err != nil {
		log.Fatal(err)
	}
}
