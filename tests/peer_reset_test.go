//go:build linux && cgo

package talaris_test

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
)

// resetStorm is the outcome of a storm of streams that the peer ends
// with a TCP reset.
type resetStorm struct {
	started, ended int
	wrongEnd       int    // final events other than EventError ErrConnectionLost 1006
	firstWrong     string // the first of them
	lost           int    // connections whose final event never came within the bound
	revived        uint64 // PoolStats.RecvRevived at the end
	took           time.Duration
}

// runResetStorm dials total streams (width at a time, DialAsync from the
// pumping goroutine) of url's /drop with rst=1: the server writes 1 to
// msgs messages of 100 bytes and closes with SO_LINGER 0, so the reset
// meets the client's multishot recv while data still flows. Each
// connection's final event must come; one that has not come bound after
// the last final event of any connection is lost: the pool is then closed
// (so the test cannot hang) and what is still open is counted.
func runResetStorm(t *testing.T, cfg talaris.Config, url string, opts *talaris.DialOptions, total, width, msgs int, bound time.Duration) resetStorm {
	t.Helper()
	p, err := talaris.NewPool(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var (
		mu       sync.Mutex
		lastEnd  = time.Now()
		finished bool
		closed   = make(chan struct{})
	)
	go func() { // the bound: no final event for that long closes the pool
		defer close(closed)
		for {
			time.Sleep(min(bound/20, 20*time.Millisecond))
			mu.Lock()
			stop := finished || time.Since(lastEnd) > bound
			mu.Unlock()
			if stop {
				p.Close()
				return
			}
		}
	}()
	var st resetStorm
	open := map[talaris.Conn]bool{}
	t0 := time.Now()
	for st.ended+st.lost < total {
		for len(open) < width && st.started < total {
			n := 1 + st.started%msgs
			c, err := p.DialAsync(fmt.Sprintf("%s/drop?n=%d&size=100&rst=1", url, n), opts)
			if err != nil {
				t.Fatalf("DialAsync: %v", err)
			}
			open[c] = true
			st.started++
		}
		_, err := p.Pump(func(c talaris.Conn, ev talaris.Event) {
			if ev.Kind != talaris.EventClose && ev.Kind != talaris.EventError || !open[c] {
				return
			}
			delete(open, c)
			st.ended++
			mu.Lock()
			lastEnd = time.Now()
			mu.Unlock()
			if ev.Kind != talaris.EventError || !errors.Is(ev.Err, talaris.ErrConnectionLost) || ev.Code != talaris.CloseAbnormal {
				if st.wrongEnd == 0 {
					st.firstWrong = fmt.Sprintf("%v %d %v", ev.Kind, ev.Code, ev.Err)
				}
				st.wrongEnd++
			}
		})
		if err != nil { // closed by the bound
			st.lost = len(open)
			break
		}
	}
	st.took = time.Since(t0)
	st.revived = testhook.Stats(p).RecvRevived
	mu.Lock()
	finished = true
	mu.Unlock()
	<-closed
	return st
}

// resetStormStreams is TALARIS_RESET_STORM (streams per configuration),
// else def (def/10 under -short).
func resetStormStreams(def int) int {
	if n, err := strconv.Atoi(os.Getenv("TALARIS_RESET_STORM")); err == nil && n > 0 {
		return n
	}
	return scaled(def)
}

// TestPeerResetStorm: streams ended by the peer's TCP reset while data
// flows, thousands of them, 32 at a time, with a loop thread and inline,
// over ws and wss: every connection's final event comes (EventError
// ErrConnectionLost 1006), none waits for a recv completion that the
// reset would have left unposted.
func TestPeerResetStorm(t *testing.T) {
	total := resetStormStreams(400)
	noProbe := os.Getenv("TALARIS_RESET_STORM_NOPROBE") == "1"
	for _, inline := range []bool{false, true} {
		for _, tg := range inlineTargets(t) {
			name := fmt.Sprintf("%s/inline=%v", tg.name, inline)
			t.Run(name, func(t *testing.T) {
				cfg := testhook.WithKnobs(talaris.Config{MaxConns: 256, CloseTimeout: time.Second, Tuning: talaris.Tuning{InlineLoop: inline}},
					testhook.Knobs{NoRecvProbe: noProbe})
				st := runResetStorm(t, cfg, tg.url, tg.opts, total, 32, 400, 10*time.Second)
				t.Logf("%s: %d streams in %v: %d ended, %d lost, %d other ends, %d revived (probe off: %v)",
					name, st.started, st.took.Round(time.Millisecond), st.ended, st.lost, st.wrongEnd, st.revived, noProbe)
				if st.lost > 0 {
					t.Errorf("%d of %d connections never ended", st.lost, st.started)
				}
				if st.wrongEnd > 0 {
					t.Errorf("%d final events other than EventError ErrConnectionLost 1006, first: %s", st.wrongEnd, st.firstWrong)
				}
			})
		}
	}
}
