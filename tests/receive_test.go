//go:build linux && cgo

package talaris_test

import (
	"bytes"
	"fmt"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// Integration tests against real peers (gorilla/websocket and
// coder/websocket servers on loopback). Nothing here is timed: timeouts are
// hang guards only, generous because the machine is small and shared.

// Recv bundles (on by default; testhook.Knobs.NoRecvBundle turns them off): one multishot recv completion hands
// over several receive slots, taken from the buffer ring in its order
// (csrc/base/bufring.h). The integrity, in-place, cgo-call and kill-restart
// tests have bundle rows (TestIntegrity/bundle*, TestTLSInPlace*/bundle*,
// TestHandoffCgoCalls/bundle, TestReconnectKillRestart/*/bundle,
// TestTLSInPlaceCloseRace/bundle); these race closes against ws:// floods.

// TestRecvBundleCloseRace: three ws:// connections flood 300-byte frames
// (straddling 4 KiB slots) into a pool receiving with bundles from a
// 16-slot ring, so completions carry several slots and the ring runs dry;
// Conn.Close and Pool.Close race the pump from other goroutines while the
// callback checks every payload byte in order. The pump ends with
// ErrPoolClosed, nothing read is wrong, and no slot is lost or handed out
// twice (a lost one would starve the recvs: the hang guard; a doubled one
// would corrupt a payload).
func TestRecvBundleCloseRace(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	spec := streamSpec{n: scaled(200_000), size: 300}
	for it := range 6 {
		t.Run(fmt.Sprint(it), func(t *testing.T) {
			p := newTestPool(t, talaris.Config{BufSize: 4096, BufCount: 16}, hangGuard)
			var conns []talaris.Conn
			sts := map[talaris.Conn]*streamState{}
			for range 3 {
				c, err := p.DialAsync(srv.URL+spec.path(), nil)
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
				sts[c] = newStreamState(spec)
			}
			floodCloseRace(t, p, conns, it, func(c talaris.Conn, ev talaris.Event) int {
				st := sts[c]
				st.on(ev)
				return st.chk.Count()
			})
			for i, c := range conns {
				if st := sts[c]; st.err != nil {
					t.Errorf("conn %d: %v", i, st.err)
				}
			}
		})
	}
}

// TestRecvBundleFloodSlowPump: four ws:// floods into 16 slots of 4 KiB
// with bundles, pumped by a consumer that sleeps after every batch: slots
// stay held by payloads delivered in place, bundles empty the ring and
// end, recvs wait for slots and are re-armed, connections stall. Every
// message of every stream arrives, in order, with the right checksum,
// and the pool's slots all come back (the next stream on the same pool
// runs through them again).
func TestRecvBundleFloodSlowPump(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	p := newTestPool(t, testhook.WithKnobs(talaris.Config{BufSize: 4096, BufCount: 16, Loops: 1}, testhook.Knobs{EventRingSize: 1024}), 3*hangGuard)
	for round, spec := range []streamSpec{{n: scaled(50_000), size: 300}, {n: scaled(5_000), size: 9000}} {
		sts := map[talaris.Conn]*streamState{}
		for range 4 {
			sts[dial(t, p, srv.URL+spec.path())] = newStreamState(spec)
		}
		pumpStreams(t, p, sts, fmt.Sprintf("round %d ", round), func() { time.Sleep(200 * time.Microsecond) })
	}
	st := testhook.Stats(p)
	t.Logf("stats %+v", st)
	if st.Rearms == 0 || st.Stalls == 0 {
		t.Errorf("Rearms=%d Stalls=%d, want both > 0 (bundles emptying 16 slots, a slow pump)", st.Rearms, st.Stalls)
	}
}

// TestIntegrity streams sequence-numbered, checksummed messages from real
// servers through several pool configurations and checks that every
// message arrives complete and in order (zero loss).
func TestIntegrity(t *testing.T) {
	type poolCase struct {
		name  string
		cfg   talaris.Config
		specs []streamSpec
		slow  time.Duration // consumer sleep per batch
		check func(t *testing.T, s testhook.PoolStats)
	}
	cases := []poolCase{
		{name: "default", cfg: talaris.Config{}, specs: allSpecs(true)},
		{
			// 4 slots of 4 KiB: a bundle empties the ring and ends, and
			// the recv must be re-armed.
			name: "tinybufs", cfg: talaris.Config{BufSize: 4096, BufCount: 4}, specs: allSpecs(true),
			check: func(t *testing.T, s testhook.PoolStats) {
				if s.Rearms == 0 {
					t.Errorf("tiny buffer ring with bundles: Rearms=0, want > 0")
				}
			},
		},
		{
			// A CQ of 8 entries overflows as soon as the kernel has more
			// than 8 completions for the loop.
			name: "tinycq", cfg: testhook.WithKnobs(talaris.Config{}, testhook.Knobs{SQEntries: 4, CQEntries: 8}), specs: allSpecs(true),
			check: func(t *testing.T, s testhook.PoolStats) {
				// With plenty of buffers, a multishot recv ends with data
				// and without -ENOBUFS only when the CQ overflowed.
				if s.Rearms <= s.NoBufs {
					t.Errorf("tiny CQ: Rearms=%d NoBufs=%d, want re-arms after CQ overflow", s.Rearms, s.NoBufs)
				}
			},
		},
		{
			name: "tinyall", cfg: testhook.WithKnobs(talaris.Config{BufSize: 4096, BufCount: 4, ArenaSize: 4 << 20, MaxMessageSize: 2 << 20}, testhook.Knobs{SQEntries: 4, CQEntries: 8, EventRingSize: 64}),
			specs: allSpecs(false),
			check: func(t *testing.T, s testhook.PoolStats) {
				if s.Stalls == 0 {
					t.Errorf("Stalls=0, want > 0")
				}
			},
		},
		// Recv bundles are the default (one completion over several
		// slots, unpacked in ring order); these rows receive without them
		// (testhook.Knobs.NoRecvBundle): one completion per slot, with 4 slots the
		// ring empties and the recv is re-armed, with a CQ of 8 completions
		// overflow.
		{name: "nobundle", cfg: testhook.WithKnobs(talaris.Config{}, testhook.Knobs{NoRecvBundle: true}), specs: allSpecs(true)},
		{
			name: "nobundle-tinybufs", cfg: testhook.WithKnobs(talaris.Config{BufSize: 4096, BufCount: 4}, testhook.Knobs{NoRecvBundle: true}), specs: allSpecs(true),
			check: func(t *testing.T, s testhook.PoolStats) {
				if s.NoBufs == 0 || s.Rearms == 0 {
					t.Errorf("tiny buffer ring without bundles: NoBufs=%d Rearms=%d, want both > 0", s.NoBufs, s.Rearms)
				}
			},
		},
		{
			name: "nobundle-tinyall", cfg: testhook.WithKnobs(talaris.Config{BufSize: 4096, BufCount: 4, ArenaSize: 4 << 20, MaxMessageSize: 2 << 20}, testhook.Knobs{NoRecvBundle: true, SQEntries: 4, CQEntries: 8, EventRingSize: 64}),
			specs: allSpecs(false),
			check: func(t *testing.T, s testhook.PoolStats) {
				if s.NoBufs == 0 || s.Stalls == 0 {
					t.Errorf("NoBufs=%d Stalls=%d, want both > 0", s.NoBufs, s.Stalls)
				}
			},
		},
		{
			// A consumer that sleeps 1 ms per batch, with a 64-event ring
			// and a 4 MiB arena: the loop must hold input back (stall),
			// not drop it.
			name: "slowconsumer",
			cfg:  testhook.WithKnobs(talaris.Config{ArenaSize: 4 << 20, MaxMessageSize: 2 << 20}, testhook.Knobs{EventRingSize: 64}),
			specs: []streamSpec{
				{n: scaled(20000), size: 16},
				{n: 20, size: 1 << 20},
				{n: scaled(500), size: 65536, text: true},
				{n: scaled(2000), size: 100, frag: 3, ping: true},
			},
			slow: time.Millisecond,
			check: func(t *testing.T, s testhook.PoolStats) {
				if s.Stalls == 0 {
					t.Errorf("slow consumer: Stalls=0, want > 0")
				}
			},
		},
	}
	for _, pc := range cases {
		t.Run(pc.name, func(t *testing.T) {
			forEachServer(t, func(t *testing.T, srv *wstest.Server) {
				p := newTestPool(t, pc.cfg, 3*hangGuard)
				var after func()
				if pc.slow > 0 {
					after = func() { time.Sleep(pc.slow) }
				}
				for _, spec := range pc.specs {
					runStream(t, p, srv, spec, after)
					if t.Failed() {
						t.Logf("stats %+v", testhook.Stats(p))
						return
					}
				}
				s := testhook.Stats(p)
				t.Logf("stats %+v", s)
				if pc.check != nil {
					pc.check(t, s)
				}
			})
		})
	}
}

// TestManyConnections runs 64 streams at once through one pool: every
// connection gets its own payload size and kind, so anything crossing
// between connections fails a Checker.
func TestManyConnections(t *testing.T) {
	const conns = 64
	forEachServer(t, func(t *testing.T, srv *wstest.Server) {
		p := newTestPool(t, talaris.Config{}, hangGuard)
		specs := make([]streamSpec, conns)
		byConn := map[talaris.Conn]*streamState{}
		bySlot := make([]*streamState, 1024)
		for i := range conns {
			// (Volume kept modest: the test servers give up on the close
			// handshake after 5 s and then reset connections with unread
			// pongs, which -race on 2 cores could otherwise run into.)
			spec := streamSpec{n: scaled(2000), size: 8 + 3*i, text: i%2 == 1}
			if i%8 == 3 {
				spec.frag, spec.ping = 3, true
			}
			specs[i] = spec
			c, err := p.DialAsync(srv.URL+spec.path(), nil)
			if err != nil {
				t.Fatalf("DialAsync %d: %v", i, err)
			}
			st := newStreamState(spec)
			if bySlot[c.Slot()] != nil {
				t.Fatalf("slot %d used twice", c.Slot())
			}
			byConn[c] = st
			bySlot[c.Slot()] = st
		}
		finals := 0
		pumpUntil(t, p, func(c talaris.Conn, ev talaris.Event) {
			st := bySlot[c.Slot()]
			if st == nil || byConn[c] != st {
				t.Errorf("event %v for unknown connection slot %d id %#x", ev.Kind, c.Slot(), c.ID())
				return
			}
			st.on(ev)
			if st.final != nil && (ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError) {
				finals++
			}
		}, func() bool { return finals == conns }, nil)
		for c, st := range byConn {
			st.verify(t, fmt.Sprintf("conn slot %d %v", c.Slot(), st.spec))
		}
		if n := p.ConnCount(); n != 0 {
			t.Errorf("ConnCount = %d after all finals", n)
		}
	})
}

// TestReassemblyBufferGivenBack: 8 connections each receive one fragmented
// 16 MiB message (the default MaxMessageSize) and close. Once every
// connection has ended the Pool keeps none of the 8 x 16 MiB reassembly
// buffers (tl_conn_trim: a buffer over 1 MiB goes at the connection's
// end). Found by a hostile review:
// they were kept for the slot's next connection, RSS 126 -> 236 MiB until
// Pool.Close.
func TestReassemblyBufferGivenBack(t *testing.T) {
	if raceEnabled {
		t.Skip("RSS under the race detector's shadow memory says nothing about the Pool's")
	}
	const conns, size = 8, 16 << 20
	payload := bytes.Repeat([]byte{'r'}, size)
	var stream []byte
	for i := 0; i < 16; i++ {
		op := ws.OpContinuation
		if i == 0 {
			op = ws.OpBinary
		}
		stream = ws.AppendFrame(stream, i == 15, op, payload[i*(1<<20):(i+1)*(1<<20)])
	}
	srv := wstest.NewRaw(func(rc *wstest.RawConn) {
		rc.SetDeadline(10 * time.Second)
		rc.ReadMessage() // go
		rc.Write(stream)
		rc.WriteClose(1000, "")
		rc.ExpectClose()
	}).Start(t)
	p := newTestPool(t, talaris.Config{}, hangGuard)
	runtime.GC()
	debug.FreeOSMemory()
	rss0 := int64(procStatusKB(t, "VmRSS")) << 10
	var cs []talaris.Conn
	for range conns {
		cs = append(cs, dial(t, p, srv.URL))
	}
	for _, c := range cs {
		c.SendText([]byte("go"))
	}
	done, got := 0, 0
	pumpUntil(t, p, func(c talaris.Conn, ev talaris.Event) {
		switch ev.Kind {
		case talaris.EventBinary:
			if len(ev.Payload) == size {
				got++
			}
		case talaris.EventClose, talaris.EventError:
			done++
		}
	}, func() bool { return done == conns }, nil)
	time.Sleep(200 * time.Millisecond)
	runtime.GC()
	debug.FreeOSMemory()
	rss1 := int64(procStatusKB(t, "VmRSS")) << 10
	t.Logf("got %d messages; RSS %d MiB before, %d MiB after every connection ended (ConnCount %d)", got, rss0>>20, rss1>>20, p.ConnCount())
	if got != conns {
		t.Fatalf("%d of %d 16 MiB messages arrived", got, conns)
	}
	if rss1-rss0 > 64<<20 {
		t.Errorf("pool keeps %d MiB after all %d connections ended", (rss1-rss0)>>20, conns)
	}
	p.Close()
	runtime.GC()
	debug.FreeOSMemory()
	t.Logf("RSS after Pool.Close: %d MiB", int64(procStatusKB(t, "VmRSS"))<<10>>20)
}
