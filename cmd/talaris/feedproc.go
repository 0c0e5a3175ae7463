//go:build linux

// Command talaris is the command-line face of the talaris WebSocket client:
//
//	talaris demo            a local feed server in a child process, a Pool reading from it, live rates and latency
//	talaris cat URL         subscribe to any ws:// or wss:// URL and print what arrives
//	talaris bench           talaris side by side with gorilla, gobwas, gws, coder (and the Rust talaris crate)
//
// Run "talaris COMMAND -h" for the flags of each command.
package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// feedProc is a running "talaris feed-server" child.
type feedProc struct {
	cmd       *exec.Cmd
	stdin     interface{ Close() error }
	WS, WSS   string // host:port of the plain and TLS listeners ("" when TLS is off)
	TLSActive bool
}

// startFeed re-executes this binary as "feed-server" and waits for it to
// report its listening addresses. The child exits when Stop closes its
// stdin (or this process dies).
func startFeed(p *pki, cpu int) (*feedProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"feed-server", "--cpu", strconv.Itoa(cpu)}
	if p != nil {
		args = append(args, "--cert", p.CertFile, "--key", p.KeyFile)
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the feed server: %w", err)
	}
	fp := &feedProc{cmd: cmd, stdin: in}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "FEED ") {
				line <- sc.Text()
			}
		}
		close(line)
	}()
	select {
	case l, ok := <-line:
		if !ok {
			fp.Stop()
			return nil, errors.New("feed server exited before listening")
		}
		for _, f := range strings.Fields(l)[1:] {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "ws":
				fp.WS = v
			case "wss":
				if v != "-" {
					fp.WSS, fp.TLSActive = v, true
				}
			}
		}
	case <-time.After(10 * time.Second):
		fp.Stop()
		return nil, errors.New("feed server did not start within 10s")
	}
	return fp, nil
}

// Stop ends the child and waits for it.
func (f *feedProc) Stop() {
	if f == nil || f.cmd == nil {
		return
	}
	f.stdin.Close()
	done := make(chan struct{})
	go func() { f.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		f.cmd.Process.Kill()
		<-done
	}
	f.cmd = nil
}

// cpu returns the CPU seconds the feed server process has used (user and
// system, all its threads; /proc/<pid>/stat at 10 ms resolution), or -1
// when it is not a child process (the tests' in-process feed) or cannot be
// read.
func (f *feedProc) cpu() float64 {
	if f == nil || f.cmd == nil || f.cmd.Process == nil {
		return -1
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", f.cmd.Process.Pid))
	if err != nil {
		return -1
	}
	// Fields after the command's closing parenthesis: state is the 3rd
	// field of the line, utime the 14th, stime the 15th.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return -1
	}
	fs := strings.Fields(string(b[i+1:]))
	if len(fs) < 13 {
		return -1
	}
	ut, err1 := strconv.ParseUint(fs[11], 10, 64)
	st, err2 := strconv.ParseUint(fs[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return float64(ut+st) / 100 // USER_HZ
}
