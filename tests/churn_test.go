//go:build linux && cgo

package talaris_test

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

// A Pool runs all day: every connection that ends, however it ends, must
// give back its slot, its socket and its memory, and a Pool that closes
// must give back its threads and mappings. These tests count what the
// process holds (open descriptors, talaris-loop threads, resident and
// mapped memory from /proc/self) across many lives, against a baseline
// taken after a warm-up.

// churnEndings are the ways a connection of TestChurnConnections ends;
// the client's first message names one and the peer (churnPeer) acts it.
var churnEndings = []string{"client-close", "server-close", "abort", "reset", "mid-frame", "fin", "stuck-close"}

// churnPeer echoes the client's first message, which names the ending,
// then ends the connection that way.
func churnPeer(rc *wstest.RawConn) {
	rc.SetDeadline(30 * time.Second)
	op, msg, err := rc.ReadMessage()
	if err != nil {
		return
	}
	if rc.WriteFrame(true, op, msg) != nil {
		return
	}
	end, _, _ := strings.Cut(string(msg), ":")
	switch end {
	case "client-close":
		if code, reason, err := rc.ExpectClose(); err == nil {
			rc.WriteClose(code, reason)
		}
	case "server-close":
		rc.WriteClose(4000, "churn")
		rc.ExpectClose()
	case "abort":
		for {
			if _, _, err := rc.ReadFrame(); err != nil {
				break
			}
		}
	case "reset":
		rc.Reset()
		return
	case "mid-frame":
		rc.WriteFrameLen(ws.Header{Fin: true, Op: ws.OpBinary, Length: 1000}, 2, make([]byte, 10))
	case "fin":
	case "stuck-close":
		// Never read again: the client's close frame sits in the kernel
		// and its CloseTimeout ends the connection. Then leave.
		time.Sleep(600 * time.Millisecond)
	}
	rc.Close()
}

// loopMode names a subtest by Config.Tuning.InlineLoop.
func loopMode(inline bool) string {
	if inline {
		return "inline"
	}
	return "threaded"
}

// TestChurnConnections: one Pool of MaxConns 4 lives through hundreds of
// connections, four at a time, each ending one of churnEndings (the
// client's Close, the server's close, Abort, a reset, a FIN in the middle
// of a frame, a FIN without a close, a close the peer never reads). Every
// round needs all four slots again, so one slot kept by an ended
// connection fails the next round's Dial (ErrTooManyConns). After the
// churn ConnCount is 0, and the process holds no more descriptors than
// after the first round. Threaded and inline loops, ws and wss.
func TestChurnConnections(t *testing.T) {
	rounds := 35 // (every ending 20 times)
	if testing.Short() {
		rounds = 14
	}
	for _, inline := range []bool{false, true} {
		t.Run(loopMode(inline), func(t *testing.T) {
			forEachTransport(t, func(t *testing.T, useTLS bool) {
				srv := wstest.NewRaw(churnPeer)
				opts := startWS(t, useTLS, srv.Start, srv.StartTLS)
				p := newTestPool(t, talaris.Config{MaxConns: 4, CloseTimeout: 200 * time.Millisecond, Tuning: talaris.Tuning{InlineLoop: inline}}, hangGuard)
				base := -1
				next := 0
				for r := range rounds {
					churnRound(t, p, srv.URL, opts, &next, r)
					if n := p.ConnCount(); n != 0 {
						t.Fatalf("round %d: ConnCount %d after every final event, want 0", r, n)
					}
					if r == 0 {
						waitFDs(t, 1<<30)
						time.Sleep(100 * time.Millisecond) // (the peers' ends of round 0)
						base = procFDs(t)
					}
				}
				waitFDs(t, base)
				st := testhook.Stats(p)
				t.Logf("%d connections over 4 slots; %d descriptors at the end (baseline %d); stats %+v", next, procFDs(t), base, st)
			})
		})
	}
}

// churnRound dials four connections, each with the next ending, sends
// each its ending's name, and pumps until all four have had their final
// event, checking the echo and that the final event matches the ending.
func churnRound(t *testing.T, p *talaris.Pool, url string, opts *talaris.DialOptions, next *int, round int) {
	t.Helper()
	type live struct {
		c      talaris.Conn
		end    string
		msg    []byte
		echoed bool
		final  *finalEvent
	}
	conns := make([]*live, 4)
	for i := range conns {
		ctx, cancel := dialCtx(t)
		c, err := p.Dial(ctx, url, opts)
		cancel()
		if err != nil {
			t.Fatalf("round %d: Dial %d: %v (a slot not given back?)", round, i, err)
		}
		end := churnEndings[*next%len(churnEndings)]
		l := &live{c: c, end: end, msg: []byte(end + ":" + strconv.Itoa(*next))}
		*next++
		if err := c.SendText(l.msg); err != nil {
			t.Fatalf("round %d: SendText: %v", round, err)
		}
		conns[i] = l
	}
	left := len(conns)
	pumpUntil(t, p, func(c talaris.Conn, ev talaris.Event) {
		var l *live
		for _, x := range conns {
			if x.c == c {
				l = x
			}
		}
		if l == nil {
			t.Errorf("event %v for an unknown connection", ev.Kind)
			return
		}
		switch ev.Kind {
		case talaris.EventText:
			if !bytes.Equal(ev.Payload, l.msg) || l.echoed {
				t.Errorf("%s: echo %q, want %q once", l.end, ev.Payload, l.msg)
			}
			l.echoed = true
			switch l.end {
			case "client-close", "stuck-close":
				if err := c.Close(talaris.CloseNormal, "churn"); err != nil {
					t.Errorf("%s: Close: %v", l.end, err)
				}
			case "abort":
				if err := c.Abort(); err != nil {
					t.Errorf("Abort: %v", err)
				}
			}
		case talaris.EventClose, talaris.EventError:
			if l.final != nil {
				t.Errorf("%s: second final event %v", l.end, ev.Kind)
			}
			f := copyFinal(ev)
			l.final = &f
			left--
		}
	}, func() bool { return left == 0 }, nil)
	for _, l := range conns {
		f := l.final
		if !l.echoed && l.end != "abort" {
			t.Errorf("%s: no echo before the end (final %+v)", l.end, *f)
		}
		switch l.end {
		case "client-close":
			if f.Kind != talaris.EventClose || f.Code != talaris.CloseNormal {
				t.Errorf("%s: final %+v, want EventClose 1000", l.end, *f)
			}
		case "server-close":
			if f.Kind != talaris.EventClose || f.Code != 4000 {
				t.Errorf("%s: final %+v, want EventClose 4000", l.end, *f)
			}
		case "reset", "mid-frame", "fin":
			if f.Kind != talaris.EventError {
				t.Errorf("%s: final %+v, want EventError", l.end, *f)
			}
		}
		if s := l.c.State(); s != talaris.StateClosed {
			t.Errorf("%s: state %v after the final event, want StateClosed", l.end, s)
		}
	}
}

// TestChurnPools: Pools made, used and closed one after another give
// back what they took. After a warm-up, each cycle (NewPool, a ws and a
// wss echo, Pool.Close with both still open) must leave no descriptor,
// no talaris-loop thread, and no growth of mapped memory beyond a
// fraction of one Pool's own mappings; resident memory is logged.
func TestChurnPools(t *testing.T) {
	cycles := 30
	if testing.Short() {
		cycles = 10
	}
	plain := wstest.NewGorilla().Start(t)
	secure := wstest.NewGorilla()
	sopts := startWS(t, true, secure.Start, secure.StartTLS)
	for _, inline := range []bool{false, true} {
		t.Run(loopMode(inline), func(t *testing.T) {
			var baseFDs int
			var baseVM, baseRSS, poolVM int64
			for i := range cycles {
				vm0 := procStatusKB(t, "VmSize")
				p, err := talaris.NewPool(talaris.Config{MaxConns: 4, Tuning: talaris.Tuning{InlineLoop: inline}})
				if err != nil {
					t.Fatal(err)
				}
				if d := procStatusKB(t, "VmSize") - vm0; i == 0 || d > poolVM {
					poolVM = d
				}
				if !inline && len(loopTids(t)) != 1 {
					t.Errorf("cycle %d: %d talaris-loop threads with one Pool open", i, len(loopTids(t)))
				}
				for _, u := range []struct {
					url  string
					opts *talaris.DialOptions
				}{{plain.URL + "/echo", nil}, {secure.URL + "/echo", sopts}} {
					ctx, cancel := dialCtx(t)
					c, err := p.Dial(ctx, u.url, u.opts)
					cancel()
					if err != nil {
						t.Fatalf("cycle %d: Dial %s: %v", i, u.url, err)
					}
					if err := c.SendText([]byte("ping")); err != nil {
						t.Fatal(err)
					}
					got := false
					pumpUntil(t, p, func(cc talaris.Conn, ev talaris.Event) {
						if cc == c && ev.Kind == talaris.EventText && string(ev.Payload) == "ping" {
							got = true
						}
					}, func() bool { return got }, nil)
				}
				if err := p.Close(); err != nil {
					t.Fatalf("cycle %d: Close: %v", i, err)
				}
				if n := len(loopTids(t)); n != 0 {
					t.Fatalf("cycle %d: %d talaris-loop threads after Close", i, n)
				}
				if i == 2 {
					waitFDs(t, 1<<30)
					time.Sleep(100 * time.Millisecond)
					baseFDs = procFDs(t)
					baseVM, baseRSS = procStatusKB(t, "VmSize"), procStatusKB(t, "VmRSS")
				}
			}
			waitFDs(t, baseFDs)
			vm, rss := procStatusKB(t, "VmSize"), procStatusKB(t, "VmRSS")
			t.Logf("after %d Pools: VmSize %+d kB, VmRSS %+d kB since cycle 2; one Pool maps %d kB", cycles, vm-baseVM, rss-baseRSS, poolVM)
			// A Pool that left its mappings behind would add poolVM per
			// cycle: (cycles-3) of them. Allow the Go heap a little room.
			if grow := vm - baseVM; grow > poolVM {
				t.Errorf("VmSize grew %d kB over %d cycles; one Pool maps %d kB: Close leaves mappings behind", grow, cycles-3, poolVM)
			}
		})
	}
}
