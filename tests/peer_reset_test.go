//go:build linux && cgo

package talaris_test

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
)

// Streams the peer ends with a TCP reset (SO_LINGER 0) while data flows.
// Linux 6.18 sometimes never completes the multishot recv of such a
// stream: the request stays in the ring's poll list with no task work
// queued and the connection's end never comes. The loop's receive probe
// (csrc/loop/probe.c) revives it; testhook.Knobs.NoRecvProbe turns the
// probe off to show the kernel's behaviour.

// stormSpec is one run of reset streams on one pool.
type stormSpec struct {
	total, width int           // streams, and how many at a time
	msgs         int           // the streams carry msgs, msgs-1, ... messages of 100 bytes
	budget       time.Duration // no new stream after this long (0: none)
	bound        time.Duration // a connection with no final event this long after the last one is lost
}

// resetStorm is the outcome of a run.
type resetStorm struct {
	started, ended int
	wrongEnd       int      // final events other than EventError ErrConnectionLost 1006
	firstWrong     string   // the first of them
	lost           []string // connections whose final event never came: what they had seen
	polls          []string // the ring's poll list (fdinfo) when the bound closed the pool
	stats          testhook.PoolStats
}

// runResetStorm dials the streams of sp (DialAsync from the pumping
// goroutine) to url's /drop with rst=1: the server writes the messages and
// closes with SO_LINGER 0, so the reset meets the client's multishot recv
// while data still flows. When no final event comes for sp.bound, what is
// still open is lost: the pool is closed (so the run cannot hang) and
// those connections are recorded, with the kernel's list of armed polls.
func runResetStorm(t *testing.T, cfg talaris.Config, url string, opts *talaris.DialOptions, sp stormSpec) resetStorm {
	t.Helper()
	p, err := talaris.NewPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var (
		st       resetStorm
		mu       sync.Mutex
		open     = map[talaris.Conn]int{} // messages each stream carries
		lastEnd  = time.Now()
		finished bool
		bounded  bool // the bound closed the pool: no more dials
		closed   = make(chan struct{})
	)
	defer func() { // a failed test's goroutine ends too (deferred before p.Close)
		mu.Lock()
		finished = true
		mu.Unlock()
	}()
	go func() { // the bound
		defer close(closed)
		for {
			time.Sleep(min(sp.bound/20, 20*time.Millisecond))
			mu.Lock()
			fin, stop := finished, finished || time.Since(lastEnd) > sp.bound
			if stop && !fin {
				bounded = true
				for c, n := range open {
					s := c.Stats()
					st.lost = append(st.lost, fmt.Sprintf("state %v, %d of %d messages, %d wire bytes in", c.State(), s.MsgsIn, n, s.WireIn))
				}
				st.polls = ringPolls(t)
			}
			mu.Unlock()
			if stop {
				p.Close()
				return
			}
		}
	}()
	t0 := time.Now()
	for {
		mu.Lock()
		for !bounded && len(open) < sp.width && st.started < sp.total && (sp.budget == 0 || time.Since(t0) < sp.budget) {
			n := sp.msgs - st.started%sp.msgs
			c, err := p.DialAsync(fmt.Sprintf("%s/drop?n=%d&size=100&rst=1", url, n), opts)
			if err != nil {
				mu.Unlock()
				t.Fatalf("DialAsync: %v", err)
			}
			open[c] = n
			st.started++
		}
		more := len(open) > 0
		mu.Unlock()
		if !more {
			break
		}
		if _, err := p.Pump(func(c talaris.Conn, ev talaris.Event) {
			if ev.Kind != talaris.EventClose && ev.Kind != talaris.EventError {
				return
			}
			mu.Lock()
			delete(open, c)
			lastEnd = time.Now()
			mu.Unlock()
			st.ended++
			if ev.Kind != talaris.EventError || !errors.Is(ev.Err, talaris.ErrConnectionLost) || ev.Code != talaris.CloseAbnormal {
				if st.wrongEnd == 0 {
					st.firstWrong = fmt.Sprintf("%v %d %v", ev.Kind, ev.Code, ev.Err)
				}
				st.wrongEnd++
			}
		}); err != nil {
			break // closed by the bound
		}
	}
	st.stats = testhook.Stats(p)
	mu.Lock()
	finished = true
	mu.Unlock()
	<-closed
	return st
}

// ringPolls returns the requests armed on a poll in this process's
// io_uring instances ("op=27" is IORING_OP_RECV), from their fdinfo.
func ringPolls(t *testing.T) []string {
	var out []string
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, fd := range fds {
		if l, _ := os.Readlink("/proc/self/fd/" + fd.Name()); !strings.Contains(l, "io_uring") {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + fd.Name())
		if err != nil {
			continue
		}
		_, polls, _ := strings.Cut(string(info), "PollList:")
		polls, _, _ = strings.Cut(polls, "CqOverflowList:")
		for _, f := range strings.Split(polls, "\n") {
			if f = strings.TrimSpace(f); f != "" {
				out = append(out, f)
			}
		}
	}
	return out
}

// resetStormScale is TALARIS_RESET_STORM (a factor on the streams and
// time budgets of the runs below, for a long hunt), else 1 (0.1 under
// -short).
func resetStormScale() float64 {
	if f, err := strconv.ParseFloat(os.Getenv("TALARIS_RESET_STORM"), 64); err == nil && f > 0 {
		return f
	}
	if testing.Short() {
		return 0.1
	}
	return 1
}

// TestPeerResetStorm: streams ended by the peer's TCP reset while data
// flows, 32 at a time, with a loop thread and inline, over ws and wss:
// every connection's final event comes (EventError ErrConnectionLost
// 1006) within the bound. Streams this short have not shown the kernel's
// lost completion (TestPeerResetLostRecv's longer ones have): this is the
// reset path end to end, with the probe on as users run it.
func TestPeerResetStorm(t *testing.T) {
	total := max(int(400*resetStormScale()), 1)
	for _, inline := range []bool{false, true} {
		for _, tg := range inlineTargets(t) {
			name := fmt.Sprintf("%s/inline=%v", tg.name, inline)
			t.Run(name, func(t *testing.T) {
				if tg.opts == nil {
					skipPlainInTLSOnly(t)
				}
				cfg := talaris.Config{MaxConns: 256, CloseTimeout: time.Second, Tuning: talaris.Tuning{InlineLoop: inline}}
				st := runResetStorm(t, cfg, tg.url, tg.opts, stormSpec{total: total, width: 32, msgs: 400, bound: 10 * time.Second})
				t.Logf("%d streams: %d ended, %d lost, %d recvs revived", st.started, st.ended, len(st.lost), st.stats.RecvRevived)
				checkStorm(t, st)
			})
		}
	}
}

// checkStorm fails t for a connection that never ended or ended otherwise
// than by the reset.
func checkStorm(t *testing.T, st resetStorm) {
	t.Helper()
	if len(st.lost) > 0 {
		t.Errorf("%d of %d connections never ended: %v; armed polls: %v", len(st.lost), st.started, st.lost, st.polls)
	}
	if st.wrongEnd > 0 {
		t.Errorf("%d final events other than EventError ErrConnectionLost 1006, first: %s", st.wrongEnd, st.firstWrong)
	}
}

// TestPeerResetLostRecv: the shape that loses the kernel's completion, one
// stream of a few thousand messages at a time on an inline loop, the
// reset arriving while the client still reads. With the probe (the
// default) every stream ends, and the probe revived at least one recv.
// Without it (testhook.Knobs.NoRecvProbe) a lost end shows as a
// connection still open after the bound (the pool is then closed and a
// new one goes on): the kernel still holds the recv on its poll list
// (logged) on a socket the reset closed. The kernel loses about one such
// stream in 500-2500, so one run of the budget sees none about half the
// time: each subtest runs the budget again until its scenario happened
// (a revived recv, a lost end), at most three budgets in all. A kernel
// that did not lose a completion in that time is a property of the
// machine (a kernel with the bug fixed loses none), not of this code: the
// subtest then skips, loudly, and ./build.sh test's skip table prints it;
// with the probe on, every stream must still have ended.
func TestPeerResetLostRecv(t *testing.T) {
	url := wstest.NewGorilla().Start(t).URL // ws: the fastest streams
	scale := resetStormScale()
	budget := time.Duration(float64(12*time.Second) * scale)
	const maxStreams = 15000
	limit := 3 * budget
	for _, probe := range []bool{true, false} {
		t.Run(fmt.Sprintf("probe=%v", probe), func(t *testing.T) {
			cfg := testhook.WithKnobs(talaris.Config{Tuning: talaris.Tuning{InlineLoop: true}}, testhook.Knobs{NoRecvProbe: !probe})
			var streams, revived int
			var lost []string
			happened := func() bool { return (probe && revived > 0) || (!probe && len(lost) > 0) }
			t0 := time.Now()
			runs := 1
			for end := t0.Add(budget); ; {
				if time.Now().After(end) {
					if happened() || streams >= maxStreams || time.Since(t0) >= limit {
						break
					}
					end = end.Add(budget) // not yet: one more budget
					runs++
				}
				st := runResetStorm(t, cfg, url, nil, stormSpec{total: 1 << 30, width: 1, msgs: 5000, budget: max(time.Until(end), 1), bound: 3 * time.Second})
				streams += st.started
				revived += int(st.stats.RecvRevived)
				if st.wrongEnd > 0 {
					t.Errorf("%d final events other than EventError ErrConnectionLost 1006, first: %s", st.wrongEnd, st.firstWrong)
				}
				if len(st.lost) == 0 {
					continue
				}
				lost = append(lost, st.lost...)
				t.Logf("lost end after %d streams: %v; armed polls: %v", st.started, st.lost, st.polls)
				for _, l := range st.lost {
					if !strings.HasPrefix(l, "state open") {
						t.Errorf("a lost end must leave the connection open (the loop never heard of the reset): %s", l)
					}
				}
			}
			t.Logf("probe %v: %d streams in %v (%d runs of %v): %d lost ends, %d recvs revived", probe, streams, time.Since(t0).Round(time.Millisecond), runs, budget, len(lost), revived)
			if probe && len(lost) > 0 {
				t.Errorf("%d connections never ended with the probe on", len(lost))
			}
			if !happened() && !t.Failed() {
				what := "the probe revived no recv"
				if !probe {
					what = "no stream lost its end"
				}
				t.Skipf("kernel lost no recv completion: %s in %d streams over %v (Linux 6.18 loses about one stream in 500-2500; a kernel without the bug loses none)", what, streams, time.Since(t0).Round(time.Second))
			}
		})
	}
}
