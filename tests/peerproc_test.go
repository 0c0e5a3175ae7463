package talaris_test

import (
	"bufio"
	"os/exec"
	"strings"
	"testing"
)

// startListener starts cmd, a peer process that prints "LISTEN <port or
// addr>" as its first line of stdout, kills it when the test ends, and
// returns what followed LISTEN. what names the peer in a failure.
func startListener(t testing.TB, what string, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "LISTEN ") {
		t.Fatalf("%s did not start: %q %v", what, line, err)
	}
	return strings.TrimSpace(strings.TrimPrefix(line, "LISTEN "))
}
