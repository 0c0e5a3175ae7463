//go:build linux

package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// The cat subcommand run as a subprocess (the real binary, real signals)
// against raw Go servers that stay idle: it must stop on --duration,
// SIGTERM and the first SIGINT although no message ever arrives, closing
// cleanly (the server receives 1000 and the handshake completes), and its
// --ping and --read-timeout reach the loop.

var (
	catBinOnce sync.Once
	catBinDir  string
	catBinErr  error
)

// TestMain removes the binary buildCat made.
func TestMain(m *testing.M) {
	code := m.Run()
	if catBinDir != "" {
		os.RemoveAll(catBinDir)
	}
	os.Exit(code)
}

// buildCat builds this command once per test run.
func buildCat(t *testing.T) string {
	t.Helper()
	catBinOnce.Do(func() {
		if catBinDir, catBinErr = os.MkdirTemp("", "talaris-cat-test-"); catBinErr != nil {
			return
		}
		if out, err := exec.Command("go", "build", "-o", filepath.Join(catBinDir, "talaris"), ".").CombinedOutput(); err != nil {
			catBinErr = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if catBinErr != nil {
		t.Fatalf("go build: %v", catBinErr)
	}
	return filepath.Join(catBinDir, "talaris")
}

// idleServer never sends data; it answers pings (counted) unless mute,
// and records the close code it receives, echoing it.
type idleServer struct {
	*wstest.RawServer
	mu     sync.Mutex
	pings  int
	closes []int
}

func newIdleServer(t *testing.T, mute bool) *idleServer {
	s := &idleServer{}
	s.RawServer = wstest.NewRaw(func(c *wstest.RawConn) {
		c.SetDeadline(30 * time.Second) // hang guard only
		for {
			h, p, err := c.ReadFrame()
			if err != nil {
				return
			}
			switch h.Op {
			case ws.OpPing:
				s.mu.Lock()
				s.pings++
				s.mu.Unlock()
				if !mute {
					c.WriteFrame(true, ws.OpPong, p)
				}
			case ws.OpClose:
				code, _, _ := ws.ParseClosePayload(p)
				s.mu.Lock()
				s.closes = append(s.closes, code)
				s.mu.Unlock()
				c.WriteClose(code, "")
				return
			}
		}
	}).Start(t)
	return s
}

// runCat starts cat with args, waits for its "connected" line, runs
// during (which may signal the process) and returns its exit error, its
// stderr and how long it ran after connecting.
func runCat(t *testing.T, args []string, during func(p *exec.Cmd)) (error, string, time.Duration) {
	t.Helper()
	cmd := exec.Command(buildCat(t), append([]string{"cat"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	guard := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() }) // hang guard only
	defer guard.Stop()
	br := bufio.NewReader(stderr)
	first, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "connected to ") {
		rest, _ := io.ReadAll(br)
		cmd.Wait()
		t.Fatalf("cat did not connect: %q %s", first, rest)
	}
	t0 := time.Now()
	if during != nil {
		during(cmd)
	}
	rest, _ := io.ReadAll(br)
	werr := cmd.Wait()
	return werr, first + string(rest), time.Since(t0)
}

func TestCatStopsOnIdleStream(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		args       []string
		sig        syscall.Signal
	}{
		{"duration", "duration reached", []string{"--duration", "300ms"}, 0},
		{"sigterm", "terminated", nil, syscall.SIGTERM},
		{"sigint", "interrupted", nil, syscall.SIGINT},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newIdleServer(t, false)
			err, stderr, d := runCat(t, append(tc.args, srv.URL+"/"), func(p *exec.Cmd) {
				if tc.sig != 0 {
					time.Sleep(200 * time.Millisecond)
					p.Process.Signal(tc.sig)
				}
			})
			t.Logf("cat ran %v after connecting; stderr:\n%s", d, stderr)
			if err != nil {
				t.Fatalf("cat exited with %v", err)
			}
			if !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, "close handshake done (1000)") {
				t.Errorf("stderr lacks %q and a completed close handshake", tc.want)
			}
			if d > 5*time.Second {
				t.Errorf("cat took %v to stop", d)
			}
			srv.mu.Lock()
			defer srv.mu.Unlock()
			if len(srv.closes) != 1 || srv.closes[0] != 1000 {
				t.Errorf("server received closes %v, want [1000]", srv.closes)
			}
		})
	}
}

func TestCatHeartbeatFlags(t *testing.T) {
	t.Run("ping", func(t *testing.T) {
		srv := newIdleServer(t, false)
		err, stderr, _ := runCat(t, []string{"--ping", "50ms", "--read-timeout", "2s", "--duration", "1s", srv.URL + "/"}, nil)
		if err != nil {
			t.Fatalf("cat exited with %v; stderr:\n%s", err, stderr)
		}
		srv.mu.Lock()
		defer srv.mu.Unlock()
		t.Logf("server answered %d pings in 1s (--ping 50ms)", srv.pings)
		if srv.pings < 5 {
			t.Errorf("%d pings in 1s of --ping 50ms", srv.pings)
		}
	})
	t.Run("read-timeout", func(t *testing.T) {
		srv := newIdleServer(t, true) // pings go unanswered
		err, stderr, d := runCat(t, []string{"--ping", "50ms", "--read-timeout", "300ms", srv.URL + "/"}, nil)
		t.Logf("cat ran %v; stderr:\n%s", d, stderr)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || !strings.Contains(stderr, "read timeout") {
			t.Fatalf("cat exited with %v, want a read timeout failure", err)
		}
		if d > 5*time.Second {
			t.Errorf("read timeout of 300ms took %v", d)
		}
	})
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
	cmd := exec.Command(buildCat(t), append([]string{"cat"}, args...)...)
	guard := time.AfterFunc(60*time.Second, func() { cmd.Process.Kill() }) // hang guard only
	defer guard.Stop()
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
