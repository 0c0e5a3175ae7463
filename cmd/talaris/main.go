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
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const usage = `talaris: low-latency WebSocket client toolkit (io_uring + C hot path)

usage:
  talaris demo  [flags]        local feed server (child process) + Pool: live frames/s, MB/s, latency
  talaris cat   [flags] URL    dial a ws:// or wss:// URL and print messages
  talaris bench [flags]        benchmarks against gorilla, gobwas, gws, coder and Rust talaris

Run "talaris COMMAND -h" for the flags of a command.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "demo":
		err = demoMain(args)
	case "cat":
		err = catMain(args)
	case "bench":
		err = benchMain(args)
	case "feed-server": // hidden: the child process of demo and bench
		err = feedServerMain(args)
	case "-h", "-help", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "talaris: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "talaris:", err)
		var ee exitCode
		if errors.As(err, &ee) {
			os.Exit(int(ee))
		}
		os.Exit(1)
	}
}

// exitCode is an error that carries a process exit status.
type exitCode int

func (e exitCode) Error() string { return "exit status " + strconv.Itoa(int(e)) }

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ", ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// parseInterspersed parses flags that may come before or after positional
// arguments (talaris cat URL -H ...), returning the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// pinProcess pins every thread of this process (and so every thread created
// later, which inherits its creator's mask) to cpu.
func pinProcess(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("pin to CPU %d: %w", cpu, err)
		}
	}
	return nil
}

// cpuSeconds returns the user+system CPU time of this process.
func cpuSeconds() float64 {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
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

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func kernelVersion() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Sysname[:]) + " " + unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Machine[:])
}

// ---- test PKI for the local wss:// feed ----

// pki names the files of a test CA and a server certificate for localhost,
// 127.0.0.1 and ::1.
type pki struct {
	CAFile, CertFile, KeyFile string
	tmp                       string // removed by cleanup when we generated the files
}

func (p *pki) cleanup() {
	if p != nil && p.tmp != "" {
		os.RemoveAll(p.tmp)
	}
}

// findTestdata returns the repository's testdata directory when the
// working directory is inside the repository: the nearest ancestor with a
// go.mod and a testdata directory (cmd/talaris has a go.mod of its own), or
// else the nearest go.mod's.
func findTestdata() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	first := ""
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			td := filepath.Join(dir, "testdata")
			if st, err := os.Stat(td); err == nil && st.IsDir() {
				return td
			}
			if first == "" {
				first = td
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return first
		}
		dir = parent
	}
}

// loadPKI uses testdata/ca.pem with a matching server certificate and key
// when the repository has them, and otherwise generates a throw-away CA and
// server certificate in a temporary directory.
func loadPKI() (*pki, error) {
	if td := findTestdata(); td != "" {
		ca := filepath.Join(td, "ca.pem")
		if _, err := os.Stat(ca); err == nil {
			for _, pair := range [][2]string{
				{"server.pem", "server-key.pem"}, {"server.pem", "server.key"},
				{"server.crt", "server.key"}, {"server-cert.pem", "server-key.pem"},
				{"localhost.pem", "localhost-key.pem"},
			} {
				c, k := filepath.Join(td, pair[0]), filepath.Join(td, pair[1])
				if _, err := os.Stat(c); err != nil {
					continue
				}
				if _, err := os.Stat(k); err != nil {
					continue
				}
				return &pki{CAFile: ca, CertFile: c, KeyFile: k}, nil
			}
		}
	}
	return generatePKI()
}

func generatePKI() (*pki, error) {
	dir, err := os.MkdirTemp("", "talaris-pki-")
	if err != nil {
		return nil, err
	}
	p := &pki{tmp: dir, CAFile: filepath.Join(dir, "ca.pem"), CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem")}
	fail := func(err error) (*pki, error) {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("generating the test PKI: %w", err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fail(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "talaris demo CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return fail(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fail(err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		return fail(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return fail(err)
	}
	for _, f := range []struct {
		name, typ string
		der       []byte
	}{{p.CAFile, "CERTIFICATE", caDER}, {p.CertFile, "CERTIFICATE", srvDER}, {p.KeyFile, "EC PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(f.name, pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), 0o600); err != nil {
			return fail(err)
		}
	}
	return p, nil
}

// ---- the feed server child process ----

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
