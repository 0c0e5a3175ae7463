//go:build linux && cgo

package talaris_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/ws"
)

// Peers that run in processes of their own: Python websockets, Node ws,
// the reconnect server (internal/reconsrv) and `openssl s_server`.

// peerProc is a WebSocket server in another process that printed
// "LISTEN <port>"; its later stdout lines arrive on lines.
type peerProc struct {
	cmd   *exec.Cmd
	port  string
	lines chan string
}

func startPeerProc(t *testing.T, bin string, args, env []string) *peerProc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT) // a stopped process cannot die of SIGKILL until continued
		cmd.Process.Kill()
		cmd.Wait()
	})
	br := bufio.NewReader(out)
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "LISTEN ") {
		t.Fatalf("%s did not start: %q %v", bin, line, err)
	}
	pp := &peerProc{cmd: cmd, port: strings.TrimSpace(strings.TrimPrefix(line, "LISTEN ")), lines: make(chan string, 64)}
	go func() {
		defer close(pp.lines)
		for {
			l, err := br.ReadString('\n')
			if err != nil {
				return
			}
			pp.lines <- strings.TrimSpace(l)
		}
	}()
	return pp
}

// startPython runs testdata/python/ws_server.py (Python's websockets).
func startPython(t *testing.T, tls bool) *peerProc {
	t.Helper()
	if err := exec.Command("python3", "-c", "import websockets").Run(); err != nil {
		t.Skip("python3 with the websockets module is not installed (./build.sh test installs it)")
	}
	args := []string{"../testdata/python/ws_server.py"}
	if tls {
		args = append(args, "--tls", testCertFile, testKeyFile)
	}
	return startPeerProc(t, "python3", args, nil)
}

// startNode runs testdata/node/wss_server.js (Node's TLS and the ws package).
func startNode(t *testing.T) *peerProc {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found")
	}
	modDir, _ := filepath.Abs("../build/node/node_modules")
	if d := os.Getenv("TALARIS_NODE_MODULES"); d != "" {
		modDir = d
	}
	if _, err := os.Stat(filepath.Join(modDir, "ws")); err != nil {
		t.Skipf("Node module ws not found in %s (./build.sh test installs it)", modDir)
	}
	return startPeerProc(t, node, []string{"../testdata/node/wss_server.js", testCertFile, testKeyFile}, []string{"NODE_PATH=" + modDir})
}

// waitLine returns the process's next stdout line that starts with prefix.
func (pp *peerProc) waitLine(t *testing.T, prefix string) string {
	t.Helper()
	tm := time.NewTimer(30 * time.Second) // hang guard only
	defer tm.Stop()
	for {
		select {
		case l, ok := <-pp.lines:
			if !ok {
				t.Fatalf("peer exited before printing %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-tm.C:
			t.Fatalf("peer printed no %q line", prefix)
		}
	}
}

// startPythonPeer runs testdata/python/ws_server.py (Python's websockets
// library) and returns its port. Skips when python3 or websockets is
// missing (./build.sh installs websockets).
func startPythonPeer(t *testing.T, tls bool) string {
	t.Helper()
	if err := exec.Command("python3", "-c", "import websockets").Run(); err != nil {
		t.Skip("python3 with the websockets module is not installed (./build.sh test installs it)")
	}
	args := []string{"../testdata/python/ws_server.py"}
	if tls {
		args = append(args, "--tls", "../testdata/server.pem", "../testdata/server-key.pem")
	}
	return startListener(t, "python peer", exec.Command("python3", args...))
}

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

// startWS starts an in-process server over ws:// (start) or, with useTLS,
// over wss:// with the test certificate (startTLS), and returns the
// DialOptions that trust it (nil for ws://). Pass the server's methods:
// startWS(t, useTLS, srv.Start, srv.StartTLS).
func startWS[S any](t testing.TB, useTLS bool, start func(testing.TB) S, startTLS func(testing.TB, *tls.Config) S) *talaris.DialOptions {
	t.Helper()
	if useTLS {
		startTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
		return tlsOpts
	}
	start(t)
	return nil
}

// dialPumped dials url on p (within dialCtx) and pumps p in the
// background (startPump) for c's final event.
func dialPumped(t *testing.T, p *talaris.Pool, url string, opts *talaris.DialOptions) (talaris.Conn, *bgPump) {
	t.Helper()
	ctx, cancel := dialCtx(t)
	defer cancel()
	c, err := p.Dial(ctx, url, opts)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	return c, startPump(t, p, c)
}

// ---- the server process ----

var (
	reconsrvOnce sync.Once
	reconsrvBin  string
	reconsrvErr  error
)

// reconsrvPath builds internal/reconsrv once per test binary.
func reconsrvPath(t *testing.T) string {
	t.Helper()
	reconsrvOnce.Do(func() {
		dir, err := os.MkdirTemp("", "reconsrv")
		if err != nil {
			reconsrvErr = err
			return
		}
		reconsrvBin = filepath.Join(dir, "reconsrv")
		out, err := exec.Command("go", "build", "-o", reconsrvBin, "./internal/reconsrv").CombinedOutput()
		if err != nil {
			reconsrvErr = fmt.Errorf("go build ./internal/reconsrv: %v\n%s", err, out)
		}
	})
	if reconsrvErr != nil {
		t.Fatal(reconsrvErr)
	}
	return reconsrvBin
}

// srvProc is one running reconsrv process and the lines it printed.
type srvProc struct {
	t     *testing.T
	cmd   *exec.Cmd
	mu    sync.Mutex
	cond  *sync.Cond
	lines []string
	done  bool
}

// startSrvProc starts reconsrv on addr (TLS when tlsOn) and waits for it
// to listen.
func startSrvProc(t *testing.T, addr string, tlsOn bool) *srvProc {
	t.Helper()
	args := []string{"-addr", addr}
	if tlsOn {
		args = append(args, "-cert", testCertFile, "-key", testKeyFile)
	}
	s := &srvProc{t: t, cmd: exec.Command(reconsrvPath(t), args...)}
	s.cond = sync.NewCond(&s.mu)
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stderr = os.Stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			s.mu.Lock()
			s.lines = append(s.lines, sc.Text())
			s.cond.Broadcast()
			s.mu.Unlock()
		}
		s.mu.Lock()
		s.done = true
		s.cond.Broadcast()
		s.mu.Unlock()
	}()
	t.Cleanup(s.kill)
	s.waitLine("READY")
	return s
}

// kill ends the process with SIGKILL and reaps it.
func (s *srvProc) kill() {
	if s.cmd.ProcessState != nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGKILL)
	s.cmd.Wait()
}

// waitLine waits (30 s at most: a failure, never a hang) until a line
// starting with prefix was printed and returns it and the lines before.
func (s *srvProc) waitLine(prefix string) (string, []string) {
	s.t.Helper()
	return s.waitMatch(prefix, func(l string) bool { return strings.HasPrefix(l, prefix) })
}

// waitMatch is waitLine for the first line match accepts (what names it
// in a failure).
func (s *srvProc) waitMatch(what string, match func(string) bool) (string, []string) {
	s.t.Helper()
	stop := time.AfterFunc(30*time.Second, func() {
		s.mu.Lock()
		s.done = true
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer stop.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 0; ; i++ {
		for ; i < len(s.lines); i++ {
			if match(s.lines[i]) {
				return s.lines[i], append([]string(nil), s.lines[:i]...)
			}
		}
		if s.done {
			s.t.Fatalf("server process: no line %q; got %q", what, s.lines)
		}
		s.cond.Wait()
		i--
	}
}

// ---- openssl s_server ----

// sServer is a scripted `openssl s_server`: what it reads from the client
// appears on its stdout (with -msg protocol traces); what is written to its
// stdin is sent to the client, except one-letter command lines.
type sServer struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	port  string

	mu   sync.Mutex
	out  []byte
	cond *sync.Cond
	done bool
}

func startSServer(t *testing.T, args ...string) *sServer {
	t.Helper()
	bin, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("openssl binary not found (Debian package openssl)")
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	all := append([]string{"s_server", "-accept", fmt.Sprintf("127.0.0.1:%d", port), "-naccept", "1",
		"-cert", testCertFile, "-key", testKeyFile, "-msg", "-alpn", "http/1.1"}, args...)
	s := &sServer{t: t, port: fmt.Sprint(port)}
	s.cond = sync.NewCond(&s.mu)
	s.cmd = exec.Command(bin, all...)
	s.cmd.Env = append(os.Environ(), "OPENSSL_CONF=/dev/null")
	s.stdin, err = s.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stderr = s.cmd.Stdout
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := stdout.Read(buf)
			s.mu.Lock()
			s.out = append(s.out, buf[:n]...)
			if err != nil {
				s.done = true
			}
			s.cond.Broadcast()
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		s.stdin.Close()
		s.cmd.Process.Kill()
		s.cmd.Wait()
		if t.Failed() {
			t.Logf("s_server output (tail):\n%s", s.tail(4000))
		}
		if f := os.Getenv("TALARIS_SSERVER_LOG"); f != "" {
			s.mu.Lock()
			os.WriteFile(f, s.out, 0o644)
			s.mu.Unlock()
		}
	})
	s.waitFor(regexp.MustCompile(`ACCEPT`), 0)
	return s
}

func (s *sServer) tail(n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.out
	if len(o) > n {
		o = o[len(o)-n:]
	}
	return strings.Map(func(r rune) rune {
		if r == '\n' || (r >= 0x20 && r < 0x7f) {
			return r
		}
		return '.'
	}, string(o))
}

// waitFor waits until re matches the output after offset from and returns
// the submatches and the end offset of the match.
func (s *sServer) waitFor(re *regexp.Regexp, from int) ([][]byte, int) {
	s.t.Helper()
	m, end, err := s.find(re, from)
	if err != nil {
		s.t.Fatal(err)
	}
	return m, end
}

// find is waitFor for any goroutine.
func (s *sServer) find(re *regexp.Regexp, from int) ([][]byte, int, error) {
	return s.match(re.String(), func(b []byte) ([][]byte, int, bool) {
		loc := re.FindSubmatchIndex(b)
		if loc == nil {
			return nil, 0, false
		}
		return re.FindSubmatch(b), loc[1], true
	}, from)
}

// waitForBytes waits for the raw bytes pat (regexp works on UTF-8).
func (s *sServer) waitForBytes(pat []byte, from int) int {
	s.t.Helper()
	_, end, err := s.match(fmt.Sprintf("%x", pat), func(b []byte) ([][]byte, int, bool) {
		i := bytes.Index(b, pat)
		return nil, i + len(pat), i >= 0
	}, from)
	if err != nil {
		s.t.Fatal(err)
	}
	return end
}

func (s *sServer) match(what string, fn func([]byte) ([][]byte, int, bool), from int) ([][]byte, int, error) {
	deadline := time.Now().Add(hangGuard)
	tm := time.AfterFunc(hangGuard, func() {
		s.mu.Lock()
		s.cond.Broadcast()
		s.mu.Unlock()
	})
	defer tm.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if from <= len(s.out) {
			if m, end, ok := fn(s.out[from:]); ok {
				return m, from + end, nil
			}
		}
		if s.done || time.Now().After(deadline) {
			done := s.done
			s.mu.Unlock()
			out := s.tail(4000)
			s.mu.Lock()
			return nil, 0, fmt.Errorf("s_server: %s not seen (exited %v); output tail:\n%s", what, done, out)
		}
		s.cond.Wait()
	}
}

func (s *sServer) outLen() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.out)
}

// write sends b through s_server's stdin: b must not start with a command
// letter. Writes stay under PIPE_BUF so s_server reads each in one piece.
func (s *sServer) write(b []byte) {
	s.t.Helper()
	if err := s.writeNoFatal(b); err != nil {
		s.t.Fatal(err)
	}
}

func (s *sServer) writeNoFatal(b []byte) error {
	for len(b) > 0 {
		n := min(len(b), 4000)
		if _, err := s.stdin.Write(b[:n]); err != nil {
			return fmt.Errorf("s_server stdin: %w", err)
		}
		b = b[n:]
		if len(b) > 0 {
			time.Sleep(5 * time.Millisecond) // let s_server read it alone
		}
	}
	return nil
}

// command sends a one-letter s_server command on its own.
func (s *sServer) command(c string) {
	time.Sleep(20 * time.Millisecond) // not merged with earlier data
	if _, err := io.WriteString(s.stdin, c+"\n"); err != nil {
		s.t.Fatalf("s_server stdin: %v", err)
	}
	time.Sleep(20 * time.Millisecond)
}

// sServerSession dials s (which upgrades by script) with opts and returns
// the open connection.
func sServerSession(t *testing.T, p *talaris.Pool, s *sServer, opts *talaris.DialOptions) talaris.Conn {
	t.Helper()
	return sServerSessionThen(t, p, s, opts, nil)
}

// sServerSessionThen is sServerSession that runs beforeUpgrade (from
// another goroutine) once s has the upgrade request, before its 101.
func sServerSessionThen(t *testing.T, p *talaris.Pool, s *sServer, opts *talaris.DialOptions, beforeUpgrade func() error) talaris.Conn {
	t.Helper()
	go func() {
		m, _, err := s.find(wsKeyRe, 0)
		if err == nil {
			_, _, err = s.find(regexp.MustCompile(`\r\n\r\n`), 0)
		}
		if err == nil && beforeUpgrade != nil {
			err = beforeUpgrade()
		}
		if err != nil {
			t.Errorf("%v", err) // the Dial below fails with a timeout
			return
		}
		s.writeNoFatal([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " +
			ws.AcceptKey(string(m[1])) + "\r\n\r\n"))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), tlsDialTimeout)
	defer cancel()
	c, err := p.Dial(ctx, "wss://127.0.0.1:"+s.port+"/feed", opts)
	if err != nil {
		t.Fatalf("Dial s_server: %v", err)
	}
	return c
}
