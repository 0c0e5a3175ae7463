//go:build linux

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
)

type bench struct {
	workloads, clients, variants  map[string]bool
	transports                    map[string]bool
	conns                         []int
	warm, dur, latDur, rttDur     time.Duration
	idleDur, ordersDur            time.Duration
	stallBytes                    int64
	rate, decodeN, decodeRounds   int
	burstOrders                   int
	latRounds                     int
	clientCPU, serverCPU, loopCPU int
	tlsMode                       string
	rustBin, rustNote, rustCrate  string
	rustFlags                     []string
	quick                         bool
	samples                       []uint32 // Config.SampleEvery rows for talaris decode and ingress (0: off)

	pki       *pki
	feed      *feedProc
	tlsOK     bool // talaris can dial wss://
	tlsNote   string
	goTLS     *tls.Config
	results   []Result
	cmdline   string
	startedAt time.Time
	loadAvg   string
}

func splitSet(s string) map[string]bool {
	m := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			m[f] = true
		}
	}
	return m
}

func benchMain(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: talaris bench [flags]\n\nRuns decode, ingress, latency and rtt workloads for talaris and the Go peers\n(and the Rust talaris crate when bench/rust-talaris is built) against a feed\nserver in a child process.\n\nThe burst workload is opt-in (--workloads burst, or add it to the list; about\n10 s for ws and wss): --burst-orders orders of 64 B sent in bursts of 64 to a\nserver that reads them, by talaris (Conn.SendBatch per burst, and SendBinary\nper order; the first --variants entry), gorilla and coder; the rate, CPU and\nsend syscalls per order, and when each burst's first and last order arrive.\n\n")
		fs.PrintDefaults()
	}
	b := &bench{}
	workloads := fs.String("workloads", "decode,ingress,latency,rtt,orders,idle", "workloads to run (floor runs with ingress; burst is opt-in, see above)")
	clients := fs.String("clients", "talaris,gorilla,gobwas,gws,coder,rust,floor", "clients to run")
	variants := fs.String("variants", "default,block,spin,spin-then-block", "talaris configurations to run: "+variantNames())
	conns := fs.String("conns", "1,4,16,64", "connection counts for ingress")
	transports := fs.String("transports", "ws,wss", "ingress and burst transports: ws, wss (ingress frames: 64 B on ws, 256 B on wss; burst orders: 64 B on both)")
	samples := fs.String("sample", "off,64,1", "talaris decode and ingress rows per Config.SampleEvery: off, or N to stamp one completion in N (ingress: the first --variants entry only)")
	quick := fs.Bool("quick", false, "short run (about 1-2 minutes): conns 1,16, shorter durations")
	fs.DurationVar(&b.warm, "warmup", 300*time.Millisecond, "warm-up before each measurement")
	fs.DurationVar(&b.dur, "duration", 2*time.Second, "measurement time per ingress run")
	fs.DurationVar(&b.latDur, "lat-duration", 10*time.Second, "measurement time per latency run")
	fs.DurationVar(&b.rttDur, "rtt-duration", 3*time.Second, "measurement time per rtt run")
	fs.DurationVar(&b.ordersDur, "orders-duration", 3*time.Second, "measurement time per orders run")
	fs.DurationVar(&b.idleDur, "idle-duration", 10*time.Second, "idle workload: process CPU measured over this long")
	fs.Int64Var(&b.stallBytes, "stall-bytes", 1<<30, "orders workload: bytes at most sent to the connection whose peer stopped reading (past its queue, sends get ErrWouldBlock and are retried)")
	fs.IntVar(&b.rate, "rate", 20000, "latency workload: messages per second")
	fs.IntVar(&b.burstOrders, "burst-orders", 640000, "burst workload: orders of 64 B in the measured stream (rounded up to whole bursts of 64)")
	fs.IntVar(&b.decodeN, "decode-n", 100000, "decode workload: messages per round")
	fs.IntVar(&b.decodeRounds, "decode-rounds", 11, "decode workload: rounds per client, interleaved across the in-process clients (each one's best is reported)")
	fs.IntVar(&b.latRounds, "lat-rounds", 5, "latency and rtt workloads: rounds per client, interleaved across the in-process clients, each of 1/N of the duration after its own warm-up (the rounds' samples are merged)")
	fs.IntVar(&b.clientCPU, "client-cpu", -1, "pin the client process to this CPU")
	fs.IntVar(&b.serverCPU, "server-cpu", -1, "pin the feed server process to this CPU")
	fs.IntVar(&b.loopCPU, "loop-cpu", -1, "pin the talaris loop thread to this CPU")
	fs.StringVar(&b.tlsMode, "tls", "auto", "TLS ingress: auto (when talaris has a TLS backend), on, off")
	rustFlags := fs.String("rust-flags", "", "extra flags for the Rust client's ingress, latency and rtt runs, space-separated (A/B of the crate's knobs: --bundle, --per-event, --copy-batch N, --post-spin N, --slot N --slots N, --cq N)")
	rust := fs.String("rust", "auto", "Rust talaris bench client binary: auto (build/rust-talaris/release/rust-talaris-bench), a path, or off")
	jsonOut := fs.String("json", "", "write results as JSON to this file")
	mdOut := fs.String("md", "", "write a Markdown report to this file")
	plots := fs.String("plots", "", "write PNG plots to this directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	b.quick = *quick
	if *quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		def := func(name string, f func()) {
			if !set[name] {
				f()
			}
		}
		def("conns", func() { *conns = "1,16" })
		def("warmup", func() { b.warm = 200 * time.Millisecond })
		def("duration", func() { b.dur = 500 * time.Millisecond })
		def("lat-duration", func() { b.latDur = 3 * time.Second })
		def("rtt-duration", func() { b.rttDur = time.Second })
		def("orders-duration", func() { b.ordersDur = time.Second })
		def("idle-duration", func() { b.idleDur = 3 * time.Second })
		def("decode-rounds", func() { b.decodeRounds = 3 })
		def("lat-rounds", func() { b.latRounds = 3 })
	}
	b.workloads, b.clients, b.variants = splitSet(*workloads), splitSet(*clients), splitSet(*variants)
	b.transports = splitSet(*transports)
	for _, s := range strings.Split(*samples, ",") {
		switch s = strings.TrimSpace(s); s {
		case "":
		case "off", "0":
			b.samples = append(b.samples, 0)
		default:
			n, err := strconv.ParseUint(s, 10, 32)
			if err != nil || n == 0 {
				return fmt.Errorf("bad --sample %q: want off or a positive N", *samples)
			}
			b.samples = append(b.samples, uint32(n))
		}
	}
	for _, s := range strings.Split(*conns, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("bad --conns %q", *conns)
		}
		b.conns = append(b.conns, n)
	}
	if b.burstOrders < 1 {
		return fmt.Errorf("bad --burst-orders %d", b.burstOrders)
	}
	b.cmdline = "talaris bench " + strings.Join(args, " ")
	b.startedAt = time.Now()
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		b.loadAvg = strings.Join(strings.Fields(string(la))[:3], " ")
	}
	if b.clientCPU >= 0 {
		if err := pinProcess(b.clientCPU); err != nil {
			return err
		}
	}
	b.findRust(*rust)
	b.rustFlags = strings.Fields(*rustFlags)

	var err error
	if b.pki, err = loadPKI(); err != nil {
		return err
	}
	defer b.pki.cleanup()
	if b.feed, err = startFeed(b.pki, b.serverCPU); err != nil {
		return err
	}
	defer b.feed.Stop()
	b.setupTLS()
	fmt.Fprintf(os.Stderr, "bench: %s | %s | %d CPUs | talaris TLS backend %q | feed ws=%s wss=%s\n",
		cpuModel(), kernelVersion(), runtime.NumCPU(), talaris.TLSBackend(), b.feed.WS, b.feed.WSS)
	if b.tlsNote != "" {
		fmt.Fprintf(os.Stderr, "bench: %s\n", b.tlsNote)
	}
	if b.rustNote != "" {
		fmt.Fprintf(os.Stderr, "bench: %s\n", b.rustNote)
	}

	jobs := b.plan()
	for i, j := range jobs {
		fmt.Fprintf(os.Stderr, "[%3d/%d] %-60s ", i+1, len(jobs), j.label)
		r, err := j.run()
		r.Workload, r.Client = j.workload, j.client
		if r.Transport == "" {
			r.Transport, r.Size, r.Conns = j.transport, j.size, j.conns
		}
		if err != nil {
			r.Err = oneLine(err.Error())
		}
		r.finish()
		b.results = append(b.results, r)
		fmt.Fprintln(os.Stderr, summaryOf(&r))
		if r.Note != "" {
			fmt.Fprintf(os.Stderr, "        note: %s\n", r.Note)
		}
	}
	b.floorFractions()

	fmt.Println(b.markdownTables())
	if *jsonOut != "" {
		out := map[string]any{"command": b.cmdline, "cpu": cpuModel(), "kernel": kernelVersion(), "go": runtime.Version(),
			"tls_backend": talaris.TLSBackend(), "started": b.startedAt.UTC().Format(time.RFC3339), "notes": b.notes(), "results": b.results}
		data, _ := json.MarshalIndent(out, "", "  ")
		if err := os.WriteFile(*jsonOut, data, 0o644); err != nil {
			return err
		}
	}
	var plotFiles []string
	if *plots != "" {
		if plotFiles, err = b.writePlots(*plots); err != nil {
			return err
		}
	}
	if *mdOut != "" {
		if err := os.WriteFile(*mdOut, []byte(b.markdownReport(*mdOut, plotFiles)), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	return s
}

func summaryOf(r *Result) string {
	if r.Err != "" {
		return "ERROR " + r.Err
	}
	switch r.Workload {
	case "decode":
		return fmt.Sprintf("%8.1f ns/msg", r.NsPerMsg)
	case "ingress":
		s := fmt.Sprintf("%7.3f M/s %8.1f MB/s %6.3f CPU-s/M", r.FramesPerSec/1e6, r.MBPerSec, r.CPUPerM)
		if r.CeilingFPS > 0 {
			s += fmt.Sprintf(" | loop %s pump %s other %.3f CPU-s/M, ceiling %.2f M/s", loopCell(*r), pumpCell(*r),
				r.OtherCPUSecs/(float64(r.Frames)/1e6), r.CeilingFPS/1e6)
		}
		return s
	case "idle":
		return fmt.Sprintf("CPU %.2f %% of one core (%.1f ms in %.1f s)", idlePct(*r), r.CPUSecs*1e3, r.Secs)
	case "burst":
		return fmt.Sprintf("%7.3f M/s %6.3f CPU-us/frame %6.3f syscalls/frame | last-of-64 p50 %.1f us (isolated), %.1f us (loaded)",
			r.FramesPerSec/1e6, r.CPUPerM, r.SyscallsPerFrame, r.LastP50, r.LoadedLastP50)
	default:
		return fmt.Sprintf("p50 %7.1f  p99 %8.1f  p99.9 %8.1f  max %8.1f us (n=%d) CPU %.1f us/sample", r.P50, r.P99, r.P999, r.Max, r.Count, cpuPerSample(*r))
	}
}

func (b *bench) findRust(flagVal string) {
	switch flagVal {
	case "off":
		b.rustNote = "Rust talaris client disabled (--rust off)"
		return
	case "auto":
		root := filepath.Dir(findTestdata())
		if root == "." || root == "" {
			b.rustNote = "Rust talaris client not found (run from the repository)"
			return
		}
		flagVal = filepath.Join(root, "build", "rust-talaris", "release", "rust-talaris-bench")
	}
	if st, err := os.Stat(flagVal); err != nil || st.IsDir() {
		b.rustNote = fmt.Sprintf("Rust talaris client not built (%s missing; build it with: CARGO_TARGET_DIR=build/rust-talaris cargo build --release --manifest-path bench/rust-talaris/Cargo.toml)", flagVal)
		return
	}
	b.rustBin = flagVal
	// The client prints the crate version it was built against (an older
	// build without the version mode fails here: say so rather than guess).
	out, err := exec.Command(flagVal, "version").Output()
	if v := strings.TrimSpace(string(out)); err == nil && strings.HasPrefix(v, "talaris ") {
		b.rustCrate = v
		b.rustNote = fmt.Sprintf("Rust anchor: crate %s (bench/rust-talaris), batch data pumps (pump_data_batches; /spin rows: pump_data_spin_batches), 16 KiB x 256 receive slots", v)
	} else {
		b.rustNote = fmt.Sprintf("Rust talaris client %s does not report its crate version (stale build? rebuild it)", flagVal)
	}
}

// setupTLS decides whether wss:// runs: the Go peers always can (crypto/tls),
// talaris when its C core has a TLS backend and a probe dial works.
func (b *bench) setupTLS() {
	caPEM, err := os.ReadFile(b.pki.CAFile)
	if err == nil {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM)
		b.goTLS = &tls.Config{RootCAs: pool, ServerName: "localhost", NextProtos: []string{"http/1.1"}}
	}
	if b.tlsMode == "off" || !b.feed.TLSActive {
		b.tlsNote = "TLS workloads off"
		return
	}
	if talaris.TLSBackend() == "" {
		b.tlsNote = "talaris has no C core in this build (no linux or no cgo): wss:// rows for talaris are marked as errors"
		return
	}
	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		b.tlsNote = "talaris TLS probe: " + err.Error()
		return
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := p.Dial(ctx, "wss://"+b.feed.WSS+"/echo", b.talDialOpts(true))
	if err != nil {
		b.tlsNote = "talaris wss:// probe dial failed: " + err.Error()
		return
	}
	c.Close(1000, "")
	b.tlsOK = true
}

func (b *bench) talDialOpts(tlsOn bool) *talaris.DialOptions {
	if !tlsOn {
		return nil
	}
	return &talaris.DialOptions{TLS: talaris.TLSOptions{RootCAFile: b.pki.CAFile, ServerName: "localhost"}}
}

type job struct {
	label, workload, client, transport string
	size, conns                        int
	run                                func() (Result, error)
}

func (b *bench) plan() []job {
	var jobs []job
	add := func(j job) { jobs = append(jobs, j) }
	want := func(c string) bool { return b.clients[c] }
	var tvs []talVariant
	for _, v := range talVariants {
		if b.variants[v.name] {
			tvs = append(tvs, v)
		}
	}
	if b.workloads["decode"] {
		// The in-process clients' rounds run interleaved (decodeRounds),
		// so every client's best comes from the same stretch of time.
		var rounds []decodeRound
		if want("talaris") {
			for _, se := range b.samples {
				rounds = append(rounds, decodeRound{"talaris" + sampleSuffix(se), func() (Result, error) { return b.talDecode(se, 1) }})
			}
			rounds = append(rounds, decodeRound{"talaris-decoder", func() (Result, error) { return b.talDecoder(1) }})
		}
		for _, p := range goPeers {
			if want(p.name) {
				rounds = append(rounds, decodeRound{p.name, func() (Result, error) { return b.peerDecode(p, 1) }})
			}
		}
		d := &decodeRounds{rounds: rounds, n: b.decodeRounds}
		for _, r := range rounds {
			add(job{label: "decode " + r.client, workload: "decode", client: r.client, run: func() (Result, error) { return d.best(r.client) }})
		}
		if want("rust") && b.rustBin != "" {
			add(job{label: "decode rust-talaris", workload: "decode", client: "rust-talaris", run: func() (Result, error) {
				return b.rustRun("decode", "--n", strconv.Itoa(b.decodeN), "--rounds", strconv.Itoa(b.decodeRounds))
			}})
		}
	}
	if b.workloads["ingress"] || b.workloads["floor"] {
		for _, tr := range []struct {
			name string
			size int
		}{{"ws", 64}, {"wss", 256}} {
			if !b.transports[tr.name] || tr.name == "wss" && (b.tlsMode == "off" || !b.feed.TLSActive) {
				continue
			}
			tlsOn := tr.name == "wss"
			addr := b.feed.WS
			if tlsOn {
				addr = b.feed.WSS
			}
			path := fmt.Sprintf("/flood?size=%d", tr.size)
			url := tr.name + "://" + addr + path
			for _, n := range b.conns {
				base := job{workload: "ingress", transport: tr.name, size: tr.size, conns: n}
				lbl := fmt.Sprintf("ingress %s %dB x%d ", tr.name, tr.size, n)
				if b.workloads["ingress"] {
					if want("talaris") {
						for vi, v := range tvs {
							for _, se := range b.samples {
								if se != 0 && vi > 0 {
									continue // sampling rows for the first variant only
								}
								j := base
								name := "talaris/" + v.name + sampleSuffix(se)
								j.label, j.client = lbl+name, name
								j.run = func() (Result, error) {
									if tlsOn && !b.tlsOK {
										return Result{}, errors.New(b.tlsNote)
									}
									return b.talIngress(v, url, n, b.talDialOpts(tlsOn), se)
								}
								add(j)
							}
						}
					}
					for _, p := range goPeers {
						if want(p.name) {
							j := base
							j.label, j.client = lbl+p.name, p.name
							j.run = func() (Result, error) { return b.peerIngress(p, url, n, tlsOn) }
							add(j)
						}
					}
					if want("rust") && b.rustBin != "" {
						// The crate's blocking batch pump and its busy-poll
						// one (the talaris/spin row's counterpart).
						for _, spin := range []bool{false, true} {
							j := base
							j.client = "rust-talaris"
							if spin {
								j.client += "/spin"
							}
							j.label = lbl + j.client
							j.run = func() (Result, error) { return b.rustNet("ingress", addr, path, n, tlsOn, spin) }
							add(j)
						}
					}
				}
				if want("floor") {
					j := base
					j.label, j.client = lbl+"floor (bare recv)", "floor"
					j.run = func() (Result, error) { return b.floor(addr, path, tr.size, n, tlsOn) }
					add(j)
				}
			}
		}
	}
	for _, wl := range []string{"latency", "rtt"} {
		if !b.workloads[wl] {
			continue
		}
		path := fmt.Sprintf("/paced?size=64&rate=%d", b.rate)
		if wl == "rtt" {
			path = "/echo"
		}
		url := "ws://" + b.feed.WS + path
		base := job{workload: wl, transport: "ws", size: 64, conns: 1}
		// The in-process clients' rounds run interleaved (latRounds).
		lr := &latRounds{n: b.latRounds, d: b.wlDur(wl)}
		if want("talaris") {
			for _, v := range tvs {
				lr.rounds = append(lr.rounds, latRound{"talaris/" + v.name,
					func(d time.Duration, h *hdrhistogram.Histogram, st *testhook.PoolStats) (Result, error) {
						return b.talLatencyRound(wl, v, url, d, h, st)
					}})
			}
		}
		for _, p := range goPeers {
			if want(p.name) {
				lr.rounds = append(lr.rounds, latRound{p.name,
					func(d time.Duration, h *hdrhistogram.Histogram, _ *testhook.PoolStats) (Result, error) {
						return b.peerLatencyRound(wl, p, url, d, h)
					}})
			}
		}
		for _, r := range lr.rounds {
			j := base
			j.label, j.client = wl+" "+r.client, r.client
			j.run = func() (Result, error) { return lr.result(r.client) }
			add(j)
		}
		if want("rust") && b.rustBin != "" {
			for _, spin := range []bool{false, true} {
				if spin && b.quick {
					continue
				}
				j := base
				j.client = "rust-talaris"
				if spin {
					j.client += "/spin"
				}
				j.label = wl + " " + j.client
				j.run = func() (Result, error) { return b.rustNet(wl, b.feed.WS, path, 1, false, spin) }
				add(j)
			}
		}
	}
	if b.workloads["orders"] {
		base := job{workload: "orders", transport: "ws", size: 64, conns: 3}
		if want("talaris") {
			for _, v := range tvs {
				j := base
				j.label, j.client = "orders talaris/"+v.name, "talaris/"+v.name
				j.run = func() (Result, error) { return b.talOrders(v) }
				add(j)
			}
		}
		for _, p := range goPeers {
			if want(p.name) {
				j := base
				j.label, j.client = "orders "+p.name, p.name
				j.run = func() (Result, error) { return b.peerOrders(p) }
				add(j)
			}
		}
	}
	if b.workloads["burst"] {
		for _, tr := range []string{"ws", "wss"} {
			if !b.transports[tr] || tr == "wss" && (b.tlsMode == "off" || !b.feed.TLSActive) {
				continue
			}
			tlsOn := tr == "wss"
			base := job{workload: "burst", transport: tr, size: orderSize, conns: 1}
			lbl := fmt.Sprintf("burst %s %d x %d B ", tr, b.burstOrders, orderSize)
			if want("talaris") && len(tvs) > 0 {
				// The first --variants entry only ("talaris/<send>" for
				// the default, "talaris/<variant>/<send>" otherwise).
				v, name := tvs[0], "talaris/"
				if v.name != "default" {
					name += v.name + "/"
				}
				for _, batch := range []bool{true, false} {
					j := base
					j.client = name + "SendBinary"
					if batch {
						j.client = name + "SendBatch"
					}
					j.label = lbl + j.client
					j.run = func() (Result, error) { return b.talBurst(v, batch, tlsOn) }
					add(j)
				}
			}
			for _, p := range goPeers {
				if want(p.name) && burstPeers[p.name] {
					j := base
					j.label, j.client = lbl+p.name, p.name
					j.run = func() (Result, error) { return b.peerBurst(p, tlsOn) }
					add(j)
				}
			}
		}
	}
	if b.workloads["idle"] {
		base := job{workload: "idle", transport: "ws", conns: 1}
		if want("talaris") {
			for _, v := range tvs {
				j := base
				j.label, j.client = "idle talaris/"+v.name, "talaris/"+v.name
				j.run = func() (Result, error) { return b.talIdle(v) }
				add(j)
			}
		}
		for _, p := range goPeers {
			if want(p.name) {
				j := base
				j.label, j.client = "idle "+p.name, p.name
				j.run = func() (Result, error) { return b.peerIdle(p) }
				add(j)
			}
		}
	}
	return jobs
}
