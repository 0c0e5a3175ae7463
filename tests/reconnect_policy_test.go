//go:build linux && cgo

package talaris_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
	"github.com/talaris-go/talaris/ws"
)

// ---- scripted raw servers ----

// acceptLog is a TCP server that records when each connection arrived and
// answers it with script(i, conn) (i counts from 0).
type acceptLog struct {
	ln    net.Listener
	tls   bool
	mu    sync.Mutex
	times []time.Time
	wg    sync.WaitGroup
}

func startAcceptLog(t *testing.T, script func(i int, nc net.Conn)) *acceptLog {
	return startAcceptLogTLS(t, nil, script)
}

// startAcceptLogTLS is startAcceptLog behind TLS when cfg is not nil (the
// script then reads and writes plaintext; the time is the TCP accept).
func startAcceptLogTLS(t *testing.T, cfg *tls.Config, script func(i int, nc net.Conn)) *acceptLog {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &acceptLog{ln: ln, tls: cfg != nil}
	if cfg != nil {
		ln = tls.NewListener(ln, cfg)
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			a.mu.Lock()
			i := len(a.times)
			a.times = append(a.times, time.Now())
			a.mu.Unlock()
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				defer nc.Close()
				script(i, nc)
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); a.wg.Wait() })
	return a
}

func (a *acceptLog) url() string {
	if a.tls {
		return "wss://" + a.ln.Addr().String() + "/"
	}
	return "ws://" + a.ln.Addr().String() + "/"
}

func (a *acceptLog) accepted() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.times...)
}

// answerClose waits for the client's first frame after the upgrade (its
// close: the only frame the scripts that call it receive) and answers
// with a close frame, so that the pool's Close at the end of the test
// takes a round trip instead of its CloseTimeout (5 s of a 7 s test).
func answerClose(nc net.Conn) {
	nc.SetReadDeadline(time.Now().Add(hangGuard))
	if _, err := nc.Read(make([]byte, 256)); err == nil {
		nc.Write(ws.AppendFrame(nil, true, ws.OpClose, ws.ClosePayload(talaris.CloseNormal, "")))
	}
}

// TestReconnectRetryAfter: 429 and 503 replies with Retry-After: 1 hold
// the next attempt back at least 1 s (measured at the server) although
// the policy's delays are 10-50 ms; the third attempt opens.
func TestReconnectRetryAfter(t *testing.T) {
	for _, status := range []string{"429 Too Many Requests", "503 Service Unavailable"} {
		t.Run(status[:3], func(t *testing.T) {
			srv := startAcceptLog(t, func(i int, nc net.Conn) {
				key, err := readRequest(nc)
				if err != nil {
					return
				}
				if i < 2 {
					io.WriteString(nc, "HTTP/1.1 "+status+"\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n")
					return
				}
				upgrade(nc, key)
				answerClose(nc)
			})
			p := newTestPool(t, talaris.Config{}, hangGuard)
			ctx, cancel := dialCtx(t)
			defer cancel()
			start := time.Now()
			c, err := p.Dial(ctx, srv.url(), &talaris.DialOptions{
				Reconnect: &talaris.ReconnectPolicy{MinDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond}})
			if err != nil {
				t.Fatalf("Dial: %v", err)
			}
			if el := time.Since(start); el < 2*time.Second {
				t.Errorf("Dial returned after %v, want >= 2s (two Retry-After: 1)", el)
			}
			at := srv.accepted()
			if len(at) != 3 {
				t.Fatalf("%d attempts, want 3", len(at))
			}
			for i := 1; i < 3; i++ {
				if d := at[i].Sub(at[i-1]); d < time.Second {
					t.Errorf("attempt %d came %v after the previous one, want >= 1s (Retry-After)", i+1, d)
				}
			}
			var log rcLog
			pumpUntil(t, p, log.fn(c), func() bool { return log.count(talaris.EventOpen) == 1 }, nil)
			if log.count(talaris.EventReconnecting) != 2 {
				t.Fatalf("events %v, want two EventReconnecting then EventOpen", log.kinds)
			}
			code, _ := strconv.Atoi(status[:3])
			for _, ev := range log.evs[:2] {
				if ev.Delay < time.Second || !errors.Is(ev.Err, talaris.ErrBadStatus) || ev.Code != code {
					t.Errorf("EventReconnecting %+v, want Delay >= 1s, ErrBadStatus, Code %d", ev, code)
				}
			}
			if ev := log.last(talaris.EventOpen); ev.Reconnects != 0 {
				t.Errorf("first open after failed attempts: Reconnects = %d, want 0 (it counts re-opens)", ev.Reconnects)
			}
		})
	}
}

// TestReconnectBackoff: a server that accepts and closes at once. The
// attempts follow the backoff (each interval within [MinDelay, the
// attempt's cap] with generous slack, and no shorter than the Delay the
// event announced), MaxAttempts ends the handle with the last error as a
// final EventError, and the pool stays idle while it waits: its loop
// thread and the pumping thread, whose CPU time is read (not the
// process's, with the in-process servers and the GC), use little CPU.
func TestReconnectBackoff(t *testing.T) {
	srv := startAcceptLog(t, func(int, net.Conn) {})
	before := loopTids(t)
	p := newTestPool(t, talaris.Config{}, hangGuard)
	tids := newLoopTids(t, before)
	const attempts = 6
	pol := &talaris.ReconnectPolicy{MinDelay: 50 * time.Millisecond, MaxDelay: 400 * time.Millisecond, MaxAttempts: attempts}
	fw := watchFreezes(t)
	c, err := p.DialAsync(srv.url(), &talaris.DialOptions{Reconnect: pol})
	if err != nil {
		t.Fatal(err)
	}
	var log rcLog
	pumpUntil(t, p, log.fn(c), func() bool { return log.final != nil }, nil)
	at := srv.accepted()
	if len(at) != attempts {
		t.Fatalf("%d attempts, want MaxAttempts = %d", len(at), attempts)
	}
	if n := log.count(talaris.EventReconnecting); n != attempts-1 || log.count(talaris.EventOpen) != 0 {
		t.Fatalf("events %v, want %d EventReconnecting then the final EventError", log.kinds, attempts-1)
	}
	if log.final.Kind != talaris.EventError || !errors.Is(log.final.Err, talaris.ErrConnectionLost) {
		t.Errorf("final event %+v, want EventError wrapping ErrConnectionLost (the last attempt's error)", *log.final)
	}
	if c.State() != talaris.StateClosed {
		t.Errorf("State after giving up = %v", c.State())
	}
	for i := 1; i < len(at); i++ {
		d := at[i].Sub(at[i-1])
		hi := min(pol.MinDelay<<i, pol.MaxDelay)
		announced := log.evs[i-1].Delay
		if announced < pol.MinDelay || announced > hi {
			t.Errorf("wait %d: Delay %v outside [%v, %v]", i, announced, pol.MinDelay, hi)
		}
		// Slack: 5 ms for clocks, 1 s for a loaded machine, and any
		// freeze of the test process (the server's clock stops with it).
		if d < announced-5*time.Millisecond || fw.Running(d) > hi+time.Second {
			t.Errorf("attempt %d came %v after the previous one; announced %v, cap %v", i+1, d, announced, hi)
		}
	}

	// Idle between attempts: two waits of 1 s cost the loop thread and
	// the pumping thread (this goroutine's, locked to it) far less than a
	// CPU-second (the loop sleeps until the deadline, the pump until an
	// event). A thread that sleeps uses no CPU however loaded the
	// machine is.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tids[syscall.Gettid()] = true
	srv2 := startAcceptLog(t, func(int, net.Conn) {})
	cpu0, err := tasksCPU(tids)
	if err != nil {
		t.Fatal(err)
	}
	w0 := time.Now()
	c2, err := p.DialAsync(srv2.url(), &talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MinDelay: time.Second, MaxDelay: time.Second, MaxAttempts: 3}})
	if err != nil {
		t.Fatal(err)
	}
	var log2 rcLog
	pumpUntil(t, p, log2.fn(c2), func() bool { return log2.final != nil }, nil)
	cpu1, err := tasksCPU(tids)
	if err != nil {
		t.Fatal(err)
	}
	wall, cpu := time.Since(w0), cpu1-cpu0
	if wall < 2*time.Second {
		t.Errorf("3 attempts 1 s apart took %v", wall)
	}
	if n := len(srv2.accepted()); n != 3 || log2.count(talaris.EventReconnecting) != 2 {
		t.Errorf("%d attempts, events %v: want 3 attempts, 2 EventReconnecting", n, log2.kinds)
	}
	if cpu > 300*time.Millisecond {
		t.Errorf("the loop's and the pump's threads used %v of CPU over %v of backoff waits", cpu, wall)
	}
	t.Logf("backoff waits: wall %v, CPU of the loop's and the pump's threads %v", wall, cpu)
}

// TestReconnectDialGivesUp: a synchronous Dial under a policy makes
// MaxAttempts attempts and returns the last error; without a policy it
// makes exactly one.
func TestReconnectDialGivesUp(t *testing.T) {
	p := newTestPool(t, talaris.Config{}, hangGuard)
	for _, tc := range []struct {
		pol  *talaris.ReconnectPolicy
		want int
	}{{nil, 1}, {&talaris.ReconnectPolicy{MinDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond, MaxAttempts: 3}, 3}} {
		srv := startAcceptLog(t, func(int, net.Conn) {})
		ctx, cancel := dialCtx(t)
		_, err := p.Dial(ctx, srv.url(), &talaris.DialOptions{Reconnect: tc.pol})
		cancel()
		if !errors.Is(err, talaris.ErrConnectionLost) {
			t.Errorf("policy %+v: Dial err %v, want ErrConnectionLost", tc.pol, err)
		}
		if n := len(srv.accepted()); n != tc.want {
			t.Errorf("policy %+v: %d attempts, want %d", tc.pol, n, tc.want)
		}
	}
	// The context bounds the whole wait: a policy that would retry forever
	// stops when it expires.
	addr := freePort(t) // nobody listens: every attempt is refused
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := p.Dial(ctx, "ws://"+addr+"/", &talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MinDelay: 20 * time.Millisecond}})
	if !errors.Is(err, talaris.ErrTimeout) {
		t.Errorf("Dial with an expiring context: %v, want ErrTimeout", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Errorf("Dial took %v after its context expired", el)
	}
}

// TestReconnectCloseDuringBackoff: Conn.Close during a 30 s backoff wait
// ends the handle at once with a final EventError wrapping ErrClosed;
// Pool.Close does the same for every waiting handle and the pump returns
// ErrPoolClosed.
func TestReconnectCloseDuringBackoff(t *testing.T) {
	addr := freePort(t)
	pol := &talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MinDelay: 30 * time.Second}}
	p := newTestPool(t, talaris.Config{}, hangGuard)
	c, err := p.DialAsync("ws://"+addr+"/", pol)
	if err != nil {
		t.Fatal(err)
	}
	var log rcLog
	pumpUntil(t, p, log.fn(c), func() bool { return log.count(talaris.EventReconnecting) == 1 }, nil)
	if d := log.evs[0].Delay; d != 30*time.Second {
		t.Errorf("Delay %v, want 30s (MinDelay, first wait)", d)
	}
	if !errors.Is(log.evs[0].Err, talaris.ErrDial) || !errors.Is(log.evs[0].Err, syscall.ECONNREFUSED) && !errors.Is(log.evs[0].Err, talaris.ErrDial) {
		t.Errorf("EventReconnecting Err = %v, want ErrDial", log.evs[0].Err)
	}
	start := time.Now()
	if err := c.Close(talaris.CloseNormal, ""); err != nil {
		t.Fatal(err)
	}
	pumpUntil(t, p, log.fn(c), func() bool { return log.final != nil }, nil)
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("Close during the backoff took %v", el)
	}
	if log.final.Kind != talaris.EventError || !errors.Is(log.final.Err, talaris.ErrClosed) {
		t.Errorf("final event %+v, want EventError wrapping ErrClosed", *log.final)
	}
	if err := c.SendText([]byte("x")); !errors.Is(err, talaris.ErrClosed) {
		t.Errorf("SendText after the end: %v, want ErrClosed", err)
	}
	if p.ConnCount() != 0 {
		t.Errorf("ConnCount %d after the final event", p.ConnCount())
	}

	// Pool.Close while two handles wait: the pump returns promptly.
	c1, err := p.DialAsync("ws://"+addr+"/", pol)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := p.DialAsync("ws://"+addr+"/", pol)
	if err != nil {
		t.Fatal(err)
	}
	var l1, l2 rcLog
	pumpUntil(t, p, func(c talaris.Conn, ev talaris.Event) {
		if c == c1 {
			l1.fn(c1)(c, ev)
		} else {
			l2.fn(c2)(c, ev)
		}
	}, func() bool {
		return l1.count(talaris.EventReconnecting) == 1 && l2.count(talaris.EventReconnecting) == 1
	}, nil)
	start = time.Now()
	go func() {
		time.Sleep(50 * time.Millisecond)
		p.Close()
	}()
	for {
		_, err := p.Pump(func(talaris.Conn, talaris.Event) {})
		if err != nil {
			if !errors.Is(err, talaris.ErrPoolClosed) {
				t.Errorf("Pump: %v, want ErrPoolClosed", err)
			}
			break
		}
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("Pool.Close with handles in a backoff wait took %v", el)
	}
	if c1.State() != talaris.StateClosed && c1.State() != talaris.StateIdle {
		t.Errorf("handle state after Pool.Close: %v", c1.State())
	}
}

// TestReconnectRaceClose: handles that reconnect continuously (a server
// that accepts, upgrades and drops at once) while other goroutines call
// Close, Send, State and Stats on them and Pool.Close ends it all. No
// panic, every call returns one of the documented errors, the pump ends
// with ErrPoolClosed. ws:// and wss:// (both TLS backends: run with and
// without -tags talaris_openssl). Run it under -race too.
func TestReconnectRaceClose(t *testing.T) {
	t.Run("ws", func(t *testing.T) { testReconnectRaceClose(t, nil) })
	t.Run("wss-"+talaris.TLSBackend(), func(t *testing.T) {
		testReconnectRaceClose(t, serverTLS(t, testCertFile, testKeyFile, 0, 0))
	})
}

func testReconnectRaceClose(t *testing.T, cfg *tls.Config) {
	srv := startAcceptLogTLS(t, cfg, func(_ int, nc net.Conn) {
		if key, err := readRequest(nc); err == nil {
			upgrade(nc, key)
		}
	})
	rounds := scaled(20)
	reopens := 0 // EventOpen with Reconnects > 0, all rounds: the race ran against live reconnects
	for r := 0; r < rounds; r++ {
		p, err := talaris.NewPool(talaris.Config{})
		if err != nil {
			t.Fatal(err)
		}
		var conns []talaris.Conn
		for i := 0; i < 4; i++ {
			c, err := p.DialAsync(srv.url(), &talaris.DialOptions{
				Reconnect: &talaris.ReconnectPolicy{MinDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond},
				Subscribe: [][]byte{[]byte("sub")}, TLS: talaris.TLSOptions{RootCAFile: testCAFile}})
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		var wg sync.WaitGroup
		for i, c := range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := 0; k < 200; k++ {
					err := c.SendText([]byte("hello"))
					if err != nil && !errors.Is(err, talaris.ErrWouldBlock) && !errors.Is(err, talaris.ErrReconnecting) && !errors.Is(err, talaris.ErrClosed) && !errors.Is(err, talaris.ErrPoolClosed) {
						t.Errorf("SendText: %v", err)
						return
					}
					c.State()
					c.Stats()
					testhook.Stats(p)
					if k == 50+i*30 && i%2 == 0 {
						if err := c.Close(talaris.CloseNormal, ""); err != nil && !errors.Is(err, talaris.ErrClosed) && !errors.Is(err, talaris.ErrPoolClosed) {
							t.Errorf("Close: %v", err)
						}
					}
					runtime.Gosched()
				}
			}()
		}
		// Round 0 closes the pool only after a re-open (30 s at most), so
		// the race surely overlaps live reconnects; the others at once.
		reopened := make(chan struct{})
		var once sync.Once
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r == 0 {
				select {
				case <-reopened:
				case <-time.After(30 * time.Second):
				}
			}
			time.Sleep(time.Duration(5+r%10) * time.Millisecond)
			p.Close()
		}()
		for {
			if _, err := p.Pump(func(_ talaris.Conn, ev talaris.Event) {
				if ev.Kind == talaris.EventOpen && ev.Reconnects > 0 {
					reopens++
					once.Do(func() { close(reopened) })
				}
			}); err != nil {
				if !errors.Is(err, talaris.ErrPoolClosed) {
					t.Errorf("Pump: %v", err)
				}
				break
			}
		}
		wg.Wait()
		p.Close()
	}
	if reopens == 0 {
		t.Errorf("no reconnect completed in %d rounds: the race did not exercise reconnects", rounds)
	}
	t.Logf("%d re-opens over %d rounds", reopens, rounds)
}

// TestReconnectOptions: bad policies and Subscribe messages are refused
// with clear errors before anything is dialed.
func TestReconnectOptions(t *testing.T) {
	p := newTestPool(t, talaris.Config{}, hangGuard)
	url := "ws://" + freePort(t) + "/"
	for _, tc := range []struct {
		opts *talaris.DialOptions
		want error
	}{
		{&talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MinDelay: -1}}, talaris.ErrInvalidConfig},
		{&talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MaxAttempts: -1}}, talaris.ErrInvalidConfig},
		{&talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MinDelay: time.Second, MaxDelay: time.Millisecond}}, talaris.ErrInvalidConfig},
		{&talaris.DialOptions{Reconnect: &talaris.ReconnectPolicy{MaxDelay: 25 * time.Hour}}, talaris.ErrInvalidConfig},
		{&talaris.DialOptions{Subscribe: [][]byte{{0xff, 0xfe}}}, talaris.ErrInvalidUTF8},
		{&talaris.DialOptions{Subscribe: [][]byte{make([]byte, 2<<20)}}, talaris.ErrInvalidConfig},
	} {
		if _, err := p.DialAsync(url, tc.opts); !errors.Is(err, tc.want) {
			t.Errorf("DialAsync(%+v): %v, want %v", tc.opts.Reconnect, err, tc.want)
		}
	}
	if p.ConnCount() != 0 {
		t.Errorf("ConnCount %d after refused dials", p.ConnCount())
	}
}
