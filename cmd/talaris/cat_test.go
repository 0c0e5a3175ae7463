//go:build linux

package main

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// TestCatHelper runs catMain in a child process (TestCatReconnect starts
// it): cat writes to the process's stdout and exits.
func TestCatHelper(t *testing.T) {
	args := os.Getenv("TALARIS_CAT_ARGS")
	if args == "" {
		t.Skip("helper process only")
	}
	if err := catMain(strings.Split(args, "\x1f")); err != nil {
		os.Stderr.WriteString("cat: " + err.Error() + "\n")
		os.Exit(1)
	}
	os.Exit(0)
}

// TestCatReconnect: `talaris cat --reconnect --send sub --count 2` against
// a server whose first connection sends one message and drops: cat
// reconnects, the server receives the --send message on both connections,
// and cat prints both messages and exits cleanly.
func TestCatReconnect(t *testing.T) {
	var mu sync.Mutex
	var got []string
	n := 0
	srv := wstest.NewRaw(func(c *wstest.RawConn) {
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		_, sub, err := c.ReadMessage()
		if err != nil {
			return
		}
		mu.Lock()
		got = append(got, string(sub))
		mu.Unlock()
		if i == 1 {
			c.WriteFrame(true, ws.OpText, []byte("one"))
			return // the handler's return drops the connection
		}
		c.WriteFrame(true, ws.OpText, []byte("two"))
		if code, _, err := c.ExpectClose(); err == nil { // cat closes after --count
			c.WriteClose(code, "")
		}
	}).Start(t)
	args := []string{"--reconnect", "--reconnect-min", "10ms", "--reconnect-max", "50ms", "--send", "sub", "--count", "2", srv.URL}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCatHelper$")
	cmd.Env = append(os.Environ(), "TALARIS_CAT_ARGS="+strings.Join(args, "\x1f"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("cat: %v\nstderr:\n%s", err, stderr.String())
	}
	if stdout.String() != "one\ntwo\n" {
		t.Errorf("cat printed %q, want \"one\\ntwo\\n\"", stdout.String())
	}
	if !strings.Contains(stderr.String(), "reconnecting in") || !strings.Contains(stderr.String(), "reconnect 1") {
		t.Errorf("cat's stderr does not report the reconnect:\n%s", stderr.String())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0] != "sub" || got[1] != "sub" {
		t.Errorf("server received %q, want the --send message on both connections", got)
	}
}
