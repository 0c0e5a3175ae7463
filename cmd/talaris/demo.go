//go:build linux

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
)

func demoMain(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: talaris demo [flags]\n\nStarts a local feed server in a child process (wss:// with a throw-away test CA when\nthe C core has TLS, else ws://), connects a Pool, subscribes and shows live\nframes/s, MB/s and one-way latency. No internet needed.\n\n")
		fs.PrintDefaults()
	}
	dur := fs.Duration("duration", 10*time.Second, "how long to run")
	conns := fs.Int("conns", 4, "connections")
	rate := fs.Int("rate", 100000, "messages per second in total (all connections)")
	size := fs.Int("size", 64, "message size in bytes (>= 16)")
	plain := fs.Bool("ws", false, "use ws:// even when TLS is available")
	loopCPU := fs.Int("loop-cpu", -1, "pin the C loop thread to this CPU")
	serverCPU := fs.Int("server-cpu", -1, "pin the feed server to this CPU")
	sample := fs.Uint("sample", 64, "stamp one receive completion in N for the per-stage breakdown (Config.SampleEvery; 0: off)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *conns < 1 || *rate < *conns || *size < 16 {
		return errors.New("demo: need conns >= 1, rate >= conns, size >= 16")
	}
	tlsOn := !*plain && talaris.TLSBackend() != "" // "" without the C core
	var p *pki
	var err error
	if tlsOn {
		if p, err = loadPKI(); err != nil {
			return err
		}
		defer p.cleanup()
	}
	feed, err := startFeed(p, *serverCPU)
	if err != nil {
		return err
	}
	defer feed.Stop()

	cfg := talaris.Config{SampleEvery: uint32(*sample), Name: "demo"}
	if *loopCPU >= 0 {
		cfg.LoopCPUs = []int{*loopCPU}
	}
	pool, err := talaris.NewPool(cfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	perConn := *rate / *conns
	batch := max(1, perConn/5000) // about one write per 200 us per connection
	path := fmt.Sprintf("/paced?size=%d&rate=%d&batch=%d&sub=1", *size, perConn, batch)
	scheme, addr := "ws", feed.WS
	var opts *talaris.DialOptions
	if tlsOn {
		scheme, addr = "wss", feed.WSS
		opts = &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAFile: p.CAFile, ServerName: "localhost"}}
	}
	url := scheme + "://" + addr + path
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fmt.Printf("talaris demo: %d connections to %s (feed server pid %d, TLS backend %q)\n", *conns, url, feed.cmd.Process.Pid, talaris.TLSBackend())
	if !tlsOn && !*plain {
		fmt.Println("  (ws:// because this build's C core has no TLS backend yet)")
	}
	cs := make([]talaris.Conn, *conns)
	for i := range cs {
		t0 := time.Now()
		if cs[i], err = pool.Dial(ctx, url, opts); err != nil {
			return fmt.Errorf("dial: %w", describeDialErr(err))
		}
		fmt.Printf("  conn %d open in %v\n", i, time.Since(t0).Round(time.Microsecond))
	}
	for _, c := range cs {
		if err := c.SendText([]byte(`{"op":"subscribe","channel":"trades"}`)); err != nil {
			return err
		}
	}
	fmt.Printf("subscribed; receiving %d msg/s of %d B for %v (Ctrl-C stops)\n\n", *rate, *size, *dur)

	var stop atomic.Bool
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	go func() { <-sig; stop.Store(true) }()

	total, interval := newHist(), newHist()
	next := make([]uint64, 1024) // by Conn.Slot (Config.MaxConns defaults to 1024)
	var frames, nbytes, gaps uint64
	fn := func(c talaris.Conn, _ talaris.Opcode, pl []byte) {
		frames++
		nbytes += uint64(len(pl))
		if len(pl) < 16 {
			return
		}
		now := time.Now().UnixNano()
		d := max(now-int64(binary.LittleEndian.Uint64(pl[8:])), 1)
		total.RecordValue(d)
		interval.RecordValue(d)
		if s := c.Slot(); s < len(next) {
			if seq := binary.LittleEndian.Uint64(pl); seq != next[s] {
				gaps++
			}
			next[s] = binary.LittleEndian.Uint64(pl) + 1
		}
	}
	start := time.Now()
	lastT, lastF, lastB := start, uint64(0), uint64(0)
	for !stop.Load() && time.Since(start) < *dur {
		if _, err := pool.PumpData(fn); err != nil {
			return err
		}
		if now := time.Now(); now.Sub(lastT) >= time.Second {
			el := now.Sub(lastT).Seconds()
			fmt.Printf("%5.1fs  %9.0f frames/s  %7.2f MB/s  latency p50 %6.1f us  p99 %7.1f us  p99.9 %7.1f us\n",
				now.Sub(start).Seconds(), float64(frames-lastF)/el, float64(nbytes-lastB)/el/1e6,
				float64(interval.ValueAtQuantile(50))/1e3, float64(interval.ValueAtQuantile(99))/1e3, float64(interval.ValueAtQuantile(99.9))/1e3)
			if *sample > 0 {
				fmt.Printf("        %s\n", stagesLine(pool.MetricsInterval()))
			}
			lastT, lastF, lastB = now, frames, nbytes
			interval.Reset()
		}
	}
	el := time.Since(start).Seconds()
	ps := testhook.Stats(pool)
	fmt.Printf("\n\nsummary (%s, %d connections, %.1f s):\n", strings.ToUpper(scheme), len(cs), el)
	fmt.Printf("  frames      %d (%.0f/s), %.1f MB (%.2f MB/s), sequence gaps %d\n", frames, float64(frames)/el, float64(nbytes)/1e6, float64(nbytes)/el/1e6, gaps)
	fmt.Printf("  latency     p50 %.1f us  p99 %.1f us  p99.9 %.1f us  max %.1f us (one-way, server send stamp to callback)\n",
		float64(total.ValueAtQuantile(50))/1e3, float64(total.ValueAtQuantile(99))/1e3, float64(total.ValueAtQuantile(99.9))/1e3, float64(total.Max())/1e3)
	if ps.Batches > 0 {
		fmt.Printf("  loop        %d events in %d batches (%.1f per batch), %d CQEs, %d re-arms, %d pump sleeps\n",
			ps.Events, ps.Batches, float64(ps.Events)/float64(ps.Batches), ps.CQEs, ps.Rearms, ps.PumpSleeps)
	}
	printStages(os.Stdout, pool.Metrics())
	for i, c := range cs {
		st := c.Stats()
		fmt.Printf("  conn %d      %d msgs, %d wire bytes in, state %v\n", i, st.MsgsIn, st.WireIn, c.State())
	}
	if gaps > 0 {
		return fmt.Errorf("demo: %d sequence gaps", gaps)
	}
	return nil
}
