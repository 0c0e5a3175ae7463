//go:build linux

package main

// The burst workload: one client sends orders of 64 B in bursts of 64 to
// a server that only reads them (the feed's /sink), and the server
// stamps when each burst's first and last order arrive. It measures the
// send path: the rate, the client's CPU and its write syscalls per order
// over a stream of --burst-orders orders sent back to back, and how long
// a burst takes to reach the server, started on an idle connection and
// started behind the stream.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
)

const (
	burstLen    = 64 // orders per burst: one SendBatch
	orderSize   = 64 // bytes per order
	orderHdr    = 24 // an order's header: burst number, index in the burst, burst length (u64 little endian each)
	burstGap    = time.Millisecond
	maxIsolated = 500 // isolated bursts at most (one in 20 of the stream's, at least one)
)

// burstPeers are the Go peers the burst workload runs (--clients picks
// among them).
var burstPeers = map[string]bool{"gorilla": true, "coder": true}

// monoNow reads CLOCK_MONOTONIC in nanoseconds: one clock for the client
// and the feed server in its own process (Go's monotonic readings are not
// comparable across processes).
func monoNow() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// procSyscw returns the write syscalls of this process so far, every
// thread's, exited ones included: /proc/self/io's syscw, which counts
// write(2), writev(2) and the like (an eventfd write too), not send(2),
// sendto(2) or sendmsg(2), nor what io_uring writes. 0 when unreadable.
func procSyscw() uint64 {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "syscw:"); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// sinkBurst is what the sink saw of one burst: how many of its orders
// arrived, and when (CLOCK_MONOTONIC ns) its first and its last did.
type sinkBurst struct {
	burst, n    uint64
	first, last int64
}

// sinkStats is a /sink connection's record: every order counted, one
// sinkBurst per burst (a connection's bursts arrive in order).
type sinkStats struct {
	orders uint64
	bursts []sinkBurst
}

// order records one order (p: its payload, at least orderHdr bytes). The
// clock is read twice per burst: at its first order and its last.
func (s *sinkStats) order(p []byte) {
	s.orders++
	burst, idx, n := binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:]), binary.LittleEndian.Uint64(p[16:])
	k := len(s.bursts) - 1
	if k < 0 || s.bursts[k].burst != burst {
		s.bursts = append(s.bursts, sinkBurst{burst: burst, first: monoNow()})
		k++
	}
	sb := &s.bursts[k]
	sb.n++
	if idx+1 == n {
		sb.last = monoNow()
	}
}

// appendReport encodes s: the order count, the burst count, then each
// burst's number, orders, first and last arrival (u64 little endian each).
func (s *sinkStats) appendReport(dst []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, s.orders)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(s.bursts)))
	for _, sb := range s.bursts {
		dst = binary.LittleEndian.AppendUint64(dst, sb.burst)
		dst = binary.LittleEndian.AppendUint64(dst, sb.n)
		dst = binary.LittleEndian.AppendUint64(dst, uint64(sb.first))
		dst = binary.LittleEndian.AppendUint64(dst, uint64(sb.last))
	}
	return dst
}

// parseSinkReport decodes what appendReport wrote.
func parseSinkReport(p []byte) (sinkStats, error) {
	var s sinkStats
	if len(p) < 16 {
		return s, fmt.Errorf("sink report of %d bytes", len(p))
	}
	s.orders = binary.LittleEndian.Uint64(p)
	n := binary.LittleEndian.Uint64(p[8:])
	p = p[16:]
	if uint64(len(p)) != n*32 {
		return s, fmt.Errorf("sink report: %d bursts in %d bytes", n, len(p))
	}
	s.bursts = make([]sinkBurst, n)
	for i := range s.bursts {
		q := p[i*32:]
		s.bursts[i] = sinkBurst{burst: binary.LittleEndian.Uint64(q), n: binary.LittleEndian.Uint64(q[8:]),
			first: int64(binary.LittleEndian.Uint64(q[16:])), last: int64(binary.LittleEndian.Uint64(q[24:]))}
	}
	return s, nil
}

// sinkReportReq asks the sink for its report: any data message shorter
// than an order's header.
var sinkReportReq = []byte("report")

// burstClient is one client of the burst workload.
type burstClient struct {
	// send hands one burst to the client's API and returns once all of it
	// was accepted.
	send func(msgs [][]byte) error
	// flush returns once everything accepted was written to the socket
	// (talaris: Conn.Flush; nil: the Go peers' writes are synchronous).
	flush func() error
	// report asks the sink for its report, after everything sent, and
	// returns it.
	report func() ([]byte, error)
	// sendCalls, when set, returns the client's send(2) calls so far,
	// which syscw does not count (talaris' direct sends).
	sendCalls func() uint64
	// threads: split the CPU by thread (talaris: the loop thread's share).
	threads bool
}

// burstURL is the sink's address for the transport.
func (b *bench) burstURL(tlsOn bool) string {
	if tlsOn {
		return "wss://" + b.feed.WSS + "/sink"
	}
	return "ws://" + b.feed.WS + "/sink"
}

// burstCounts returns the stream's bursts (--burst-orders, rounded up to
// whole bursts) and the isolated bursts sent before it.
func (b *bench) burstCounts() (stream, isolated int) {
	stream = max((b.burstOrders+burstLen-1)/burstLen, 1)
	return stream, min(max(stream/20, 1), maxIsolated)
}

// burstRun runs the workload on one connection of bc. First the isolated
// bursts, each started on an idle connection (flushed, then burstGap of
// quiet), whose arrival times give the latency columns; then the stream:
// every burst right after the previous one was accepted, whose rate,
// CPU and syscalls are measured from its start until the client handed
// its last order to the kernel (CPU, syscalls) and until the sink got it
// (rate). Every burst's start is read just before its first send; the
// sink's report must show every order of every burst, in order.
func (b *bench) burstRun(bc burstClient) (Result, error) {
	stream, iso := b.burstCounts()
	msgs := make([][]byte, burstLen)
	for i := range msgs {
		msgs[i] = make([]byte, orderSize)
		binary.LittleEndian.PutUint64(msgs[i][8:], uint64(i))
		binary.LittleEndian.PutUint64(msgs[i][16:], burstLen)
	}
	starts := make([]int64, iso+stream)
	send := func(k int) error {
		for _, m := range msgs {
			binary.LittleEndian.PutUint64(m, uint64(k))
		}
		starts[k] = monoNow()
		if err := bc.send(msgs); err != nil {
			return fmt.Errorf("burst %d: %w", k, err)
		}
		return nil
	}
	flush := func() error {
		if bc.flush == nil {
			return nil
		}
		return bc.flush()
	}
	calls := func() uint64 {
		if bc.sendCalls == nil {
			return 0
		}
		return bc.sendCalls()
	}
	for k := range iso {
		if err := send(k); err != nil {
			return Result{}, err
		}
		if err := flush(); err != nil {
			return Result{}, err
		}
		time.Sleep(burstGap)
	}
	var th0 []taskCPU
	if bc.threads {
		th0 = tasksCPU()
	}
	w0, d0, s0, c0 := procSyscw(), calls(), b.feed.cpu(), cpuSeconds()
	for k := iso; k < iso+stream; k++ {
		if err := send(k); err != nil {
			return Result{}, err
		}
	}
	if err := flush(); err != nil {
		return Result{}, err
	}
	c1, w1, d1 := cpuSeconds(), procSyscw(), calls()
	var th1 []taskCPU
	if bc.threads {
		th1 = tasksCPU()
	}
	data, err := bc.report()
	if err != nil {
		return Result{}, fmt.Errorf("sink report: %w", err)
	}
	s1 := b.feed.cpu()
	rep, err := parseSinkReport(data)
	if err != nil {
		return Result{}, err
	}
	if want := uint64(iso+stream) * burstLen; rep.orders != want || len(rep.bursts) != iso+stream {
		return Result{}, fmt.Errorf("the sink got %d orders in %d bursts, want %d in %d", rep.orders, len(rep.bursts), want, iso+stream)
	}
	for k, sb := range rep.bursts {
		if sb.burst != uint64(k) || sb.n != burstLen || sb.last == 0 {
			return Result{}, fmt.Errorf("the sink's burst %d: number %d, %d orders, last arrival %d", k, sb.burst, sb.n, sb.last)
		}
	}
	frames := uint64(stream) * burstLen
	r := Result{Frames: frames, Bytes: frames * orderSize, Count: int64(iso), CPUSecs: c1 - c0,
		Secs: float64(rep.bursts[iso+stream-1].last-starts[iso]) / 1e9, ServerCPUSecs: serverDelta(s0, s1)}
	if r.Secs > 0 {
		r.FramesPerSec, r.MBPerSec = float64(frames)/r.Secs, float64(r.Bytes)/r.Secs/1e6
	}
	mf := float64(frames) / 1e6
	r.CPUPerM = r.CPUSecs / mf
	r.SyscallsPerFrame = float64(w1-w0+d1-d0) / float64(frames)
	if bc.threads {
		threadSplit(&r, tasksDelta(th0, th1), 0, false)
		r.LoopPerM, r.PumpPerM, r.LoopMaxPerM = r.LoopCPUSecs/mf, r.PumpCPUSecs/mf, r.LoopMaxCPUSecs/mf
	}
	hf, hl, lf, ll := newHist(), newHist(), newHist(), newHist()
	for k, sb := range rep.bursts {
		f, l := hf, hl
		if k >= iso {
			f, l = lf, ll
		}
		f.RecordValue(max(sb.first-starts[k], 1))
		l.RecordValue(max(sb.last-starts[k], 1))
	}
	us := func(v int64) float64 { return float64(v) / 1e3 }
	r.FirstP50, r.FirstP99 = us(hf.ValueAtQuantile(50)), us(hf.ValueAtQuantile(99))
	r.LastP50, r.LastP99 = us(hl.ValueAtQuantile(50)), us(hl.ValueAtQuantile(99))
	r.LoadedFirstP50, r.LoadedLastP50, r.LoadedLastP99 = us(lf.ValueAtQuantile(50)), us(ll.ValueAtQuantile(50)), us(ll.ValueAtQuantile(99))
	r.Note = fmt.Sprintf("send syscalls per order: %.3f write-type (syscw) + %.3f send(2)", float64(w1-w0)/float64(frames), float64(d1-d0)/float64(frames))
	return r, nil
}

// talBurst is the burst workload for talaris (variant v; the bench runs
// the first --variants entry, by default the zero Config) on one
// connection, with a goroutine in PumpData as a user has (it receives
// the sink's report). batch: each burst is one Conn.SendBatch; when it
// returns ErrWouldBlock (the send queue, Config.MaxSendQueue, cannot take
// the burst whole) the sender waits in Conn.Flush until the queue has
// reached the socket and sends the burst again: waiting, not retrying in
// a loop, so the CPU per order is what the send costs, not a spin. Not
// batch: SendBinary per order, SendContext when it returns ErrWouldBlock.
func (b *bench) talBurst(v talVariant, batch, tlsOn bool) (Result, error) {
	if tlsOn && !b.tlsOK {
		return Result{}, errors.New(b.tlsNote)
	}
	if v.inline {
		return Result{}, errors.New("an inline variant's pump must run on the goroutine that sends: not measured")
	}
	p, err := b.talPool(v, 0)
	if err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	c, err := p.Dial(dctx, b.burstURL(tlsOn), b.talDialOpts(tlsOn))
	if err != nil {
		p.Close()
		return Result{}, err
	}
	reports := make(chan []byte, 1)
	pumped := make(chan error, 1)
	go func() {
		for {
			if _, err := talPump(p, v, func(_ talaris.Conn, _ talaris.Opcode, pl []byte) {
				select {
				case reports <- append([]byte(nil), pl...):
				default:
				}
			}); err != nil {
				pumped <- err
				return
			}
		}
	}()
	defer func() {
		c.Close(1000, "")
		p.Close()
		<-pumped
	}()
	var wouldBlock uint64
	bc := burstClient{threads: true, flush: func() error { return c.Flush(ctx) }}
	per := uint64(1)
	if batch {
		per = burstLen
		bc.send = func(msgs [][]byte) error {
			for {
				err := c.SendBatch(talaris.OpBinary, msgs)
				if !errors.Is(err, talaris.ErrWouldBlock) {
					return err
				}
				wouldBlock++
				if err := c.Flush(ctx); err != nil {
					return err
				}
			}
		}
	} else {
		bc.send = func(msgs [][]byte) error {
			for _, m := range msgs {
				err := c.SendBinary(m)
				if errors.Is(err, talaris.ErrWouldBlock) {
					wouldBlock++
					err = c.SendContext(ctx, talaris.OpBinary, m)
				}
				if err != nil {
					return err
				}
			}
			return nil
		}
	}
	// A direct send of a burst (or of an order) is one send(2), and a
	// short one is retried once before its rest goes to the loop
	// (DirectSends' handoffs): counted as one more.
	bc.sendCalls = func() uint64 {
		s, h := testhook.DirectSends(c)
		return s/per + h
	}
	bc.report = func() ([]byte, error) {
		if err := c.SendBinary(sinkReportReq); err != nil {
			return nil, err
		}
		select {
		case rep := <-reports:
			return rep, nil
		case err := <-pumped:
			pumped <- err
			return nil, err
		case <-time.After(30 * time.Second):
			return nil, errors.New("no report within 30s")
		}
	}
	ds0, _ := testhook.DirectSends(c)
	r, err := b.burstRun(bc)
	if err != nil {
		return r, err
	}
	ds1, _ := testhook.DirectSends(c)
	_, iso := b.burstCounts()
	sent := r.Frames + uint64(iso)*burstLen
	how := "one SendBatch per burst; on ErrWouldBlock, Flush then the burst again"
	if !batch {
		how = "SendBinary per order; on ErrWouldBlock, SendContext"
	}
	r.Note = fmt.Sprintf("%s (%d times); %.1f %% of the orders written by direct sends, the rest by the loop (io_uring sends: no syscall of their own, not counted); %s",
		how, wouldBlock, 100*float64(ds1-ds0)/float64(max(sent, 1)), r.Note)
	return r, nil
}

// peerBurst is the burst workload for a Go peer: one write call per
// order (gorilla WriteMessage, coder Write), one write(2) each.
func (b *bench) peerBurst(gp goPeer, tlsOn bool) (Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pc, err := gp.dial(ctx, b.burstURL(tlsOn), b.peerTLS(tlsOn), nil)
	if err != nil {
		return Result{}, err
	}
	defer pc.close()
	bc := burstClient{
		send: func(msgs [][]byte) error {
			for _, m := range msgs {
				if err := pc.write(m); err != nil {
					return err
				}
			}
			return nil
		},
		report: func() ([]byte, error) {
			if err := pc.write(sinkReportReq); err != nil {
				return nil, err
			}
			var rep []byte
			err := pc.readOne(func(_ bool, p []byte) { rep = append([]byte(nil), p...) })
			return rep, err
		},
	}
	return b.burstRun(bc)
}
