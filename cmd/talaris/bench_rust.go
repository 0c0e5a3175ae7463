//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

type rustOut struct {
	Crate    string       `json:"crate"`
	Threads  []taskCPU    `json:"threads"`
	Frames   uint64       `json:"frames"`
	Bytes    uint64       `json:"bytes"`
	Secs     float64      `json:"secs"`
	CPU      float64      `json:"cpu_s"`
	NsPerMsg float64      `json:"ns_per_msg"`
	Count    int64        `json:"count"`
	P50      float64      `json:"p50_us"`
	P99      float64      `json:"p99_us"`
	P999     float64      `json:"p999_us"`
	Max      float64      `json:"max_us"`
	CDF      [][2]float64 `json:"cdf"`
}

func (b *bench) rustRun(args ...string) (Result, error) {
	return b.rustRunFor(2*time.Minute, args...)
}

// rustRunFor runs the Rust client, killed after limit: its blocking pumps
// wait for completions without a timeout, so a flood that stalls inside the
// crate (seen with --bundle and --cq at 64 connections) would otherwise stop
// the whole bench.
func (b *bench) rustRunFor(limit time.Duration, args ...string) (Result, error) {
	if b.clientCPU >= 0 {
		args = append(args, "--cpu", strconv.Itoa(b.clientCPU))
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.rustBin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if ctx.Err() != nil {
		return Result{}, fmt.Errorf("rust client killed after %v (stalled): %s", limit, strings.TrimSpace(stderr.String()))
	}
	if err != nil {
		return Result{}, fmt.Errorf("rust client: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	for _, l := range strings.Split(string(out), "\n") {
		if js, ok := strings.CutPrefix(l, "RESULT "); ok {
			var o rustOut
			if err := json.Unmarshal([]byte(js), &o); err != nil {
				return Result{}, fmt.Errorf("rust client: bad RESULT line: %v", err)
			}
			r := Result{Frames: o.Frames, Bytes: o.Bytes, Secs: o.Secs, CPUSecs: o.CPU, NsPerMsg: o.NsPerMsg,
				Count: o.Count, P50: o.P50, P99: o.P99, P999: o.P999, Max: o.Max, CDF: o.CDF, Crate: o.Crate}
			if len(o.Threads) > 0 {
				// The crate's Pool runs on the calling thread: the
				// busiest thread is both its loop and its pump.
				r.Threads = o.Threads
				threadSplit(&r, o.Threads, 0, true)
			}
			return r, nil
		}
	}
	return Result{}, errors.New("rust client printed no RESULT line")
}

func (b *bench) rustNet(mode, addr, path string, conns int, tlsOn, spin bool) (Result, error) {
	d := b.dur
	if mode == "latency" {
		d = b.latDur
	} else if mode == "rtt" {
		d = b.rttDur
	}
	args := []string{mode, "--addr", addr, "--path", path, "--conns", strconv.Itoa(conns),
		"--warmup-ms", strconv.Itoa(int(b.warm.Milliseconds())), "--duration-ms", strconv.Itoa(int(d.Milliseconds()))}
	if tlsOn {
		args = append(args, "--tls", "--ca", b.pki.CAFile)
	}
	if spin {
		args = append(args, "--spin")
	}
	// Handshakes take at most 10 s inside the client; past that and the
	// run's own length, a generous margin.
	r, err := b.rustRunFor(b.warm+d+40*time.Second, append(args, b.rustFlags...)...)
	if err == nil && mode == "ingress" && r.Frames == 0 {
		// One pump call outlived the whole measurement: the flood stalled.
		err = fmt.Errorf("rust client: no frames in the measured %v (stalled)", d)
	}
	return r, err
}
