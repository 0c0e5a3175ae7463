//go:build linux

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/ws"
)

// decodeStream returns n frames: message i is binary u64 i when i%3 == 0,
// else text {"id":i}.
func decodeStream(n int) []byte {
	var out []byte
	var num [8]byte
	for i := 0; i < n; i++ {
		if i%3 == 0 {
			binary.LittleEndian.PutUint64(num[:], uint64(i))
			out = ws.AppendFrame(out, true, ws.OpBinary, num[:])
		} else {
			out = ws.AppendFrame(out, true, ws.OpText, []byte(`{"id":`+strconv.Itoa(i)+`}`))
		}
	}
	return out
}

// parseID reads the number of {"id":N}.
func parseID(p []byte) uint64 {
	v := uint64(0)
	for _, c := range p[min(6, len(p)):] {
		if c < '0' || c > '9' {
			break
		}
		v = v*10 + uint64(c-'0')
	}
	return v
}

// sampleSuffix names a Config.SampleEvery row: "" when off, "+sample64"
// for one completion in 64.
func sampleSuffix(every uint32) string {
	if every == 0 {
		return ""
	}
	return "+sample" + strconv.FormatUint(uint64(every), 10)
}

// stageNote summarises a sampled run's stage histograms for the report.
func stageNote(p *talaris.Pool) string {
	m := p.Metrics()
	if m.Sampled == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d sampled; p50/p99:", m.Sampled)
	for s := talaris.Stage(0); s < talaris.StageWireToCallback; s++ {
		h := m.Stages[s]
		fmt.Fprintf(&b, " %s %s/%s", s, fmtNs(int64(h.P50)), fmtNs(int64(h.P99)))
	}
	return b.String()
}

func (b *bench) talDecode(sampleEvery uint32, rounds int) (res Result, rerr error) {
	stream := decodeStream(b.decodeN)
	want := uint64(b.decodeN) * uint64(b.decodeN-1) / 2
	// Prefault: the rounds pass the arena once, so a lazily mapped one
	// would measure its first-touch page faults, which a service pays once
	// per process, not the steady per-message cost.
	p, err := talaris.NewPool(talaris.Config{SampleEvery: sampleEvery, Tuning: talaris.Tuning{Prefault: true}})
	if err != nil {
		return Result{}, err
	}
	defer p.Close()
	c, err := p.DialMemory()
	if err != nil {
		return Result{}, err
	}
	var sum uint64
	var count int
	fn := func(_ talaris.Conn, op talaris.Opcode, pl []byte) {
		count++
		if op == talaris.OpBinary {
			sum += binary.LittleEndian.Uint64(pl)
		} else {
			sum += parseID(pl)
		}
	}
	best := time.Duration(1 << 62)
	for range rounds {
		sum, count = 0, 0
		errc := make(chan error, 1)
		t0 := time.Now()
		go func() {
			for off := 0; off < len(stream); off += 4096 {
				if err := c.Inject(stream[off:min(off+4096, len(stream))]); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		for count < b.decodeN {
			if _, err := p.PumpData(fn); err != nil {
				return Result{}, err
			}
		}
		el := time.Since(t0)
		if err := <-errc; err != nil {
			return Result{}, err
		}
		if sum != want {
			return Result{}, fmt.Errorf("sum of ids %d, want %d", sum, want)
		}
		best = min(best, el)
	}
	return Result{Frames: uint64(b.decodeN), Bytes: uint64(len(stream)), Secs: best.Seconds(),
		NsPerMsg: float64(best.Nanoseconds()) / float64(b.decodeN), Note: stageNote(p)}, nil
}

// decodeRound is one round of one client's decode workload.
type decodeRound struct {
	client string
	run    func() (Result, error)
}

// decodeRounds runs n rounds of every client in turn (round-robin) the
// first time a result is asked for, and keeps each client's fastest. On a
// shared machine whose speed moves between phases of seconds (the decode
// rows of one client read 10 and 22 ns in runs a minute apart), rounds of
// one client after another put whole clients in one phase; interleaved,
// each client's best is taken over the same stretch of time.
type decodeRounds struct {
	rounds []decodeRound
	n      int
	once   sync.Once
	res    map[string]Result
	err    map[string]error
}

func (d *decodeRounds) best(client string) (Result, error) {
	d.once.Do(func() {
		d.res = map[string]Result{}
		d.err = roundRobin(d.n, len(d.rounds), func(i int) (string, error) {
			r := d.rounds[i]
			res, err := r.run()
			if err == nil {
				if old, ok := d.res[r.client]; !ok || res.NsPerMsg < old.NsPerMsg {
					d.res[r.client] = res
				}
			}
			return r.client, err
		})
	})
	if err := d.err[client]; err != nil {
		return Result{}, err
	}
	return d.res[client], nil
}

// roundRobin runs max(n, 1) rounds of round(0..k-1), one after another,
// and returns the error of each client (named by round's result) whose
// round failed; a failed client gets no more rounds.
func roundRobin(n, k int, round func(i int) (string, error)) map[string]error {
	errs := map[string]error{}
	failed := make([]bool, k)
	for range max(n, 1) {
		for i := range k {
			if failed[i] {
				continue
			}
			if c, err := round(i); err != nil {
				errs[c], failed[i] = err, true
			}
		}
	}
	return errs
}

// talDecoder is the decode workload through testhook.Decoder: the same C
// parser, event ring and callback on the calling thread, one cgo call per
// 4096-byte read (no loop thread, so no cross-core handoff).
func (b *bench) talDecoder(rounds int) (Result, error) {
	stream := decodeStream(b.decodeN)
	want := uint64(b.decodeN) * uint64(b.decodeN-1) / 2
	d, err := testhook.NewDecoder(1 << 20)
	if err != nil {
		return Result{}, err
	}
	defer d.Close()
	var sum uint64
	var count int
	fn := func(_ talaris.Conn, op talaris.Opcode, pl []byte) {
		count++
		if op == talaris.OpBinary {
			sum += binary.LittleEndian.Uint64(pl)
		} else {
			sum += parseID(pl)
		}
	}
	best := time.Duration(1 << 62)
	for range rounds {
		sum, count = 0, 0
		t0 := time.Now()
		for off := 0; off < len(stream); off += 4096 {
			if _, err := d.Decode(stream[off:min(off+4096, len(stream))], fn); err != nil {
				return Result{}, err
			}
		}
		el := time.Since(t0)
		if sum != want || count != b.decodeN {
			return Result{}, fmt.Errorf("sum of ids %d over %d messages, want %d over %d", sum, count, want, b.decodeN)
		}
		best = min(best, el)
	}
	return Result{Frames: uint64(b.decodeN), Bytes: uint64(len(stream)), Secs: best.Seconds(), NsPerMsg: float64(best.Nanoseconds()) / float64(b.decodeN)}, nil
}

func (b *bench) peerDecode(p goPeer, rounds int) (Result, error) {
	stream := decodeStream(b.decodeN)
	want := uint64(b.decodeN) * uint64(b.decodeN-1) / 2
	best := time.Duration(1 << 62)
	for range rounds {
		mc := newMemConn(stream, 4096)
		nd := func(context.Context, string, string) (net.Conn, error) { return mc, nil }
		pc, err := p.dial(context.Background(), "ws://127.0.0.1:1/", nil, nd)
		if err != nil {
			return Result{}, err
		}
		var sum uint64
		count := 0
		t0 := time.Now()
		err = pc.run(func(text bool, pl []byte) {
			count++
			if text {
				sum += parseID(pl)
			} else {
				sum += binary.LittleEndian.Uint64(pl)
			}
		})
		el := time.Since(t0)
		if err != nil && count != b.decodeN && !errors.Is(err, io.EOF) {
			return Result{}, err
		}
		if count != b.decodeN || sum != want {
			return Result{}, fmt.Errorf("%d messages, sum %d; want %d, %d", count, sum, b.decodeN, want)
		}
		best = min(best, el)
	}
	return Result{Frames: uint64(b.decodeN), Bytes: uint64(len(stream)), Secs: best.Seconds(), NsPerMsg: float64(best.Nanoseconds()) / float64(b.decodeN)}, nil
}
