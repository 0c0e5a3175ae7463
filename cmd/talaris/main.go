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
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

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
