//go:build !linux

// Command talaris is the command-line face of the talaris WebSocket client.
// It needs Linux (io_uring); elsewhere it only says so.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "talaris: this command needs Linux (io_uring)")
	os.Exit(1)
}
