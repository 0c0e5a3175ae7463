//go:build linux && cgo

package talaris_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
)

// Minimum-wait batching (Config.Tuning.MinWait;
// docs/notes/2026-12-wait-strategies.md, "Minimum-wait batching"): while a flood streams in, the loop's wait asks
// the kernel to wait up to MinWait for more completions. Real servers on
// loopback: floods over ws and wss (the batched wait is taken, every
// message intact and in order), a feed paced like the bench's latency
// workload and ping-pongs (never taken: a lone message must not wait),
// Pool.Close and Conn.Close racing a flood, a flood cut by a reset, and
// the path with it off. Both TLS backends run them (-tags
// talaris_openssl). Timeouts are hang guards only.

const testMinWait = 50 * time.Microsecond

// mwFlood is a flood the server writes in 64 KiB chunks (fragmented
// messages take wstest's raw path), so the socket fills faster than one
// message per write and the loop's waits follow slots of data.
func mwFlood(n int) streamSpec { return streamSpec{n: n, size: 256, frag: 2} }

// mwServers returns a gorilla server's ws and wss base URLs.
func mwServers(t *testing.T) (plain, secure string) {
	return wstest.NewGorilla().Start(t).URL,
		wstest.NewGorilla().StartTLS(t, serverTLS(t, testCertFile, testKeyFile, 0, 0)).URL
}

// mwTransport is one transport a test runs over: ws:// or wss:// (with
// the options that trust the test CA).
type mwTransport struct {
	name string
	url  string
	opts *talaris.DialOptions
}

func mwTransports(plain, secure string) []mwTransport {
	return []mwTransport{{"ws", plain, nil}, {"wss", secure, tlsOpts}}
}

// chunkedFlood starts a gorilla server (TLS when secure) that writes the
// frames of spec's /stream (wstest.AppendStreamMessage) in chunks of
// about 32 KiB, gap apart, then closes with 1000 "done": a flood faster
// than one message per write but slower than the client, so the loop
// catches up, sleeps and is woken by a chunk - the case minimum-wait
// batching is for (a flood the client cannot keep up with stalls it on
// its ring, where the batched wait is not taken).
func chunkedFlood(t *testing.T, secure bool, spec streamSpec, gap time.Duration) string {
	up := websocket.Upgrader{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		var buf []byte
		for i := range spec.n {
			buf = wstest.AppendStreamMessage(buf, spec.op(), i, spec.size, spec.frag, spec.ping)
			if len(buf) >= 32<<10 || i == spec.n-1 {
				if _, err := c.UnderlyingConn().Write(buf); err != nil {
					return
				}
				buf = buf[:0]
				time.Sleep(gap)
			}
		}
		c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(1000, "done"))
		c.ReadMessage() // the close echo
	}))
	if secure {
		srv.TLS = serverTLS(t, testCertFile, testKeyFile, 0, 0)
		srv.StartTLS()
		t.Cleanup(srv.Close)
		return "wss" + strings.TrimPrefix(srv.URL, "https")
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// TestMinWaitFlood: floods in 32 KiB chunks (two connections) into a
// pool with MinWait on, over ws and wss: every message of every stream
// arrives in order with the right checksum and close, and the loop took
// the batched wait; with MinWait off (the fallback: the wait as before)
// the same floods arrive intact and it is never taken.
func TestMinWaitFlood(t *testing.T) {
	spec := mwFlood(scaled(100_000))
	plain, secure := chunkedFlood(t, false, spec, 50*time.Microsecond), chunkedFlood(t, true, spec, 50*time.Microsecond)
	for _, tc := range []struct {
		name string
		cfg  talaris.Config
		on   bool
	}{
		{"on", talaris.Config{Tuning: talaris.Tuning{MinWait: testMinWait}}, true},
		{"on-n64-200us", testhook.WithKnobs(talaris.Config{Tuning: talaris.Tuning{MinWait: 200 * time.Microsecond}}, testhook.Knobs{MinWaitCompletions: 64}), true},
		{"off", talaris.Config{Tuning: talaris.Tuning{MinWait: -1}}, false},
		{"default", talaris.Config{}, false},
	} {
		for _, tr := range mwTransports(plain, secure) {
			t.Run(tc.name+"/"+tr.name, func(t *testing.T) {
				p := newTestPool(t, tc.cfg, hangGuard)
				sts := map[talaris.Conn]*streamState{}
				for range 2 {
					c, err := p.DialAsync(tr.url, tr.opts)
					if err != nil {
						t.Fatal(err)
					}
					sts[c] = newStreamState(spec)
				}
				pumpStreams(t, p, sts, "", nil)
				st := testhook.Stats(p)
				t.Logf("%d batched waits, %d completions, %d pump sleeps, %d batches for %d messages",
					st.MinWaits, st.CQEs, st.PumpSleeps, st.Batches, 2*spec.n)
				if tc.on && st.MinWaits == 0 {
					t.Errorf("MinWaits 0 over two floods of %d messages with MinWait on", spec.n)
				}
				if !tc.on && st.MinWaits != 0 {
					t.Errorf("MinWaits %d with MinWait off", st.MinWaits)
				}
			})
		}
	}
}

// pacedFeed starts a gorilla server that writes n 64-byte binary messages
// (8-byte sequence numbers first), one write each, gap apart (measured
// from the previous write, never catching up in a burst), then closes
// with 1000 "done": the bench's latency workload (20k msg/s) in small.
func pacedFeed(t *testing.T, n int, gap time.Duration) string {
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		msg := make([]byte, 64)
		for i := range n {
			binary.LittleEndian.PutUint64(msg, uint64(i))
			if c.WriteMessage(websocket.BinaryMessage, msg) != nil {
				return
			}
			for t0 := time.Now(); time.Since(t0) < gap; {
				time.Sleep(gap / 4)
			}
		}
		c.WriteMessage(websocket.CloseMessage, websocket.FormatCloseMessage(1000, "done"))
		c.ReadMessage() // the close echo
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// TestMinWaitNotTakenAtLowRates: with MinWait on, a feed of one small
// message every 50 us and ping-pongs (small and 32 KiB messages, ws and
// wss) never take the batched wait, so their latency cannot grow by it:
// a paced message never finds a socket that filled a receive slot while
// the loop was busy, and every send ends a streak of heavy waits.
func TestMinWaitNotTakenAtLowRates(t *testing.T) {
	cfg := talaris.Config{Tuning: talaris.Tuning{MinWait: testMinWait}}
	t.Run("paced-20k", func(t *testing.T) {
		const n = 2000
		p, c := dialOpts(t, cfg, pacedFeed(t, n, 50*time.Microsecond), nil)
		seen := 0
		var bad error
		var final *finalEvent
		pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventBinary:
				if cc != c || len(ev.Payload) != 64 || binary.LittleEndian.Uint64(ev.Payload) != uint64(seen) {
					if bad == nil {
						bad = fmt.Errorf("message %d: len %d seq %d", seen, len(ev.Payload), binary.LittleEndian.Uint64(ev.Payload))
					}
				}
				seen++
			case talaris.EventClose, talaris.EventError:
				f := copyFinal(ev)
				final = &f
			}
		}, func() bool { return final != nil }, nil)
		if bad != nil || seen != n || final.Kind != talaris.EventClose || final.Code != talaris.CloseNormal {
			t.Fatalf("%d/%d messages, first error %v, final %+v", seen, n, bad, *final)
		}
		if st := testhook.Stats(p); st.MinWaits != 0 {
			t.Fatalf("MinWaits %d over a paced feed of %d messages 50 us apart", st.MinWaits, n)
		}
	})
	plain, secure := mwServers(t)
	for _, tr := range mwTransports(plain, secure) {
		t.Run("pingpong/"+tr.name, func(t *testing.T) {
			p, c := dialOpts(t, cfg, tr.url+"/echo", tr.opts)
			const n = 500
			if seen, err := pingPong(p, c, n); err != nil || seen != n {
				t.Fatalf("%d/%d echoes: %v", seen, n, err)
			}
			if st := testhook.Stats(p); st.MinWaits != 0 {
				t.Fatalf("MinWaits %d over %d round trips", st.MinWaits, n)
			}
		})
		t.Run("pingpong-32k/"+tr.name, func(t *testing.T) {
			p, c := dialOpts(t, cfg, tr.url+"/echo", tr.opts)
			const n = 300
			msg := make([]byte, 32<<10)
			seen := 0
			var bad error
			if err := c.SendBinary(msg); err != nil {
				t.Fatal(err)
			}
			for seen < n && bad == nil {
				if _, err := p.PumpData(func(cc talaris.Conn, op talaris.Opcode, pl []byte) {
					if len(pl) != len(msg) || binary.LittleEndian.Uint64(pl) != uint64(seen) {
						bad = fmt.Errorf("echo %d: len %d seq %d", seen, len(pl), binary.LittleEndian.Uint64(pl))
						return
					}
					seen++
					binary.LittleEndian.PutUint64(msg, uint64(seen))
					if seen < n {
						bad = c.SendBinary(msg)
					}
				}); err != nil {
					t.Fatal(err)
				}
			}
			if bad != nil {
				t.Fatal(bad)
			}
			if st := testhook.Stats(p); st.MinWaits != 0 {
				t.Fatalf("MinWaits %d over %d round trips of 32 KiB (every send ends the streak)", st.MinWaits, n)
			}
		})
	}
}

// TestMinWaitCloseRace: Conn.Close and Pool.Close race the pump from
// other goroutines while three floods stream into a pool with MinWait on
// (ws and wss, the close landing at different points of the batched
// waits): every message read is right and in order, the pump ends with
// ErrPoolClosed, and Stats still answers after the close with counters
// that did not go back.
func TestMinWaitCloseRace(t *testing.T) {
	plain, secure := mwServers(t)
	spec := mwFlood(scaled(200_000))
	for _, tr := range mwTransports(plain, secure) {
		for it := range 6 {
			t.Run(fmt.Sprint(tr.name, "/", it), func(t *testing.T) {
				p := newTestPool(t, talaris.Config{Tuning: talaris.Tuning{MinWait: 200 * time.Microsecond}}, hangGuard)
				var conns []talaris.Conn
				sts := map[talaris.Conn]*streamState{}
				for range 3 {
					c, err := p.DialAsync(tr.url+spec.path(), tr.opts)
					if err != nil {
						t.Fatal(err)
					}
					conns = append(conns, c)
					sts[c] = newStreamState(spec)
				}
				var before testhook.PoolStats
				floodCloseRace(t, p, conns, it, func(c talaris.Conn, ev talaris.Event) int {
					st := sts[c]
					st.on(ev)
					if st.chk.Count() == 1000 {
						before = testhook.Stats(p)
					}
					return st.chk.Count()
				})
				for i, c := range conns {
					if st := sts[c]; st.err != nil {
						t.Errorf("conn %d: %v", i, st.err)
					}
				}
				after := testhook.Stats(p)
				if after.MinWaits < before.MinWaits || after.Events < before.Events {
					t.Errorf("stats went back after Close: %+v, before %+v", after, before)
				}
				if err := conns[0].SendBinary([]byte("x")); !errors.Is(err, talaris.ErrPoolClosed) && !errors.Is(err, talaris.ErrClosed) {
					t.Errorf("send after close: %v", err)
				}
			})
		}
	}
}

// TestMinWaitFloodReset: a flood cut by a TCP reset (and one ended by a
// FIN without a close frame) in a pool with MinWait on: what arrives is
// in order and intact, the connection ends with ErrConnectionLost, and
// nothing hangs (the reset comes while the loop may be in a batched wait).
func TestMinWaitFloodReset(t *testing.T) {
	plain, secure := mwServers(t)
	spec := mwFlood(scaled(100_000))
	for _, tr := range mwTransports(plain, secure) {
		for _, rst := range []bool{false, true} {
			t.Run(fmt.Sprint(tr.name, "/rst=", rst), func(t *testing.T) {
				p := newTestPool(t, talaris.Config{Tuning: talaris.Tuning{MinWait: testMinWait}}, hangGuard)
				path := "/drop" + strings.TrimPrefix(spec.path(), "/stream")
				if rst && tr.opts != nil {
					path += "&trunc=1&rst=1" // the TCP reset under the TLS session
				} else if rst {
					path += "&rst=1"
				}
				c, err := p.DialAsync(tr.url+path, tr.opts)
				if err != nil {
					t.Fatal(err)
				}
				st := newStreamState(spec)
				f := pumpOne(t, p, c, st.on)
				if st.err != nil {
					t.Fatal(st.err)
				}
				if !rst && st.chk.Count() != spec.n {
					t.Errorf("got %d messages before the FIN, want %d", st.chk.Count(), spec.n)
				}
				if f.Kind != talaris.EventError || !errors.Is(f.Err, talaris.ErrConnectionLost) {
					t.Errorf("final %+v, want EventError ErrConnectionLost", f)
				}
			})
		}
	}
}

// TestMinWaitConfig: out-of-range values are refused with
// ErrInvalidConfig.
func TestMinWaitConfig(t *testing.T) {
	for _, cfg := range []talaris.Config{
		{Tuning: talaris.Tuning{MinWait: 500 * time.Nanosecond}},
		{Tuning: talaris.Tuning{MinWait: 2 * time.Second}},
		testhook.WithKnobs(talaris.Config{Tuning: talaris.Tuning{MinWait: testMinWait}}, testhook.Knobs{MinWaitCompletions: 1}),
		testhook.WithKnobs(talaris.Config{}, testhook.Knobs{MinWaitCompletions: -3}),
	} {
		if p, err := talaris.NewPool(cfg); !errors.Is(err, talaris.ErrInvalidConfig) {
			if p != nil {
				p.Close()
			}
			t.Errorf("NewPool(%+v): %v, want ErrInvalidConfig", cfg, err)
		}
	}
}
