//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/ws"
)

// The examples that need a WebSocket server live in tests/example_test.go
// (their server comes from the test module's peers).

// A subscriber: dial, subscribe, pump until the connection ends. (Compiled,
// not run: it needs a real feed.)
func Example() {
	p, err := talaris.NewPool(talaris.Config{}) // zero value: defaults
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := p.Dial(ctx, "wss://feed.example.com/ws", &talaris.DialOptions{
		Header:       http.Header{"Authorization": {"Bearer token"}},
		Subprotocols: []string{"v1.feed"},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := c.SendText([]byte(`{"op":"subscribe","channel":"trades"}`)); err != nil {
		log.Fatal(err)
	}
	for done := false; !done; {
		_, err := p.Pump(func(c talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventText, talaris.EventBinary:
				// ev.Payload is valid until this function returns.
				fmt.Printf("%d bytes\n", len(ev.Payload))
			case talaris.EventClose, talaris.EventError:
				fmt.Println("ended:", ev.Code, ev.Err)
				done = true
			}
		})
		if err != nil {
			log.Fatal(err)
		}
	}
}

// DialMemory runs the C parser on bytes given with Inject: a benchmark or
// a replay of a captured feed, no socket involved.
func ExamplePool_DialMemory() {
	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	c, err := p.DialMemory()
	if err != nil {
		log.Fatal(err)
	}
	var frames []byte
	frames = ws.AppendFrame(frames, true, ws.OpText, []byte(`{"px":101.5}`))
	frames = ws.AppendFrame(frames, false, ws.OpBinary, []byte{0xca})
	frames = ws.AppendFrame(frames, true, ws.OpContinuation, []byte{0xfe})
	if err := c.Inject(frames); err != nil {
		log.Fatal(err)
	}
	for got := 0; got < 2; {
		n, err := p.PumpData(func(c talaris.Conn, op talaris.Opcode, payload []byte) {
			fmt.Printf("%v %x\n", op, payload)
		})
		if err != nil {
			log.Fatal(err)
		}
		got += n
	}
	// Output:
	// text 7b227078223a3130312e357d
	// binary cafe
}

// Config.OnEvent shows a PumpData consumer each connection's open and end,
// in order with the data; PumpData returns ErrNoConns once no connection
// is left.
func ExampleConfig_onEvent() {
	p, err := talaris.NewPool(talaris.Config{OnEvent: func(c talaris.Conn, ev talaris.Event) {
		fmt.Println("event:", ev.Kind, ev.Code)
	}})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	c, err := p.DialMemory()
	if err != nil {
		log.Fatal(err)
	}
	var frames []byte
	frames = ws.AppendFrame(frames, true, ws.OpText, []byte("tick"))
	frames = ws.AppendFrame(frames, true, ws.OpClose, []byte{0x03, 0xe8}) // 1000
	if err := c.Inject(frames); err != nil {
		log.Fatal(err)
	}
	for {
		_, err := p.PumpData(func(c talaris.Conn, op talaris.Opcode, payload []byte) {
			fmt.Printf("data: %s\n", payload)
		})
		if errors.Is(err, talaris.ErrNoConns) {
			fmt.Println("no connection left")
			break
		}
		if err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// event: open 0
	// data: tick
	// event: close 1000
	// no connection left
}

// Run is a service's pump: started before anything is dialed, it waits
// (asleep) for connections, delivers their events, and returns when its
// context ends (nil once the Pool is closed). Here the service stops once
// its one connection has closed.
func ExamplePool_Run() {
	venue := newExampleServer(func(c *exampleConn) {
		for {
			_, msg, ok := c.read() // answers the close frame too
			if !ok {
				return
			}
			c.write("echo: " + string(msg))
		}
	})
	defer venue.Close()

	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- p.Run(ctx, func(c talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventOpen:
				fmt.Println("open")
			case talaris.EventText:
				fmt.Printf("%s\n", ev.Payload) // valid until this function returns
				c.Close(talaris.CloseNormal, "done")
			case talaris.EventClose, talaris.EventError:
				fmt.Println("ended:", ev.Code)
				cancel() // the service stops
			}
		})
	}()

	c, err := p.Dial(ctx, venue.URL, nil) // Run is already waiting
	if err != nil {
		log.Fatal(err)
	}
	if err := c.SendText([]byte("hello")); err != nil {
		log.Fatal(err)
	}
	fmt.Println("Run:", <-done)
	// Output:
	// open
	// echo: hello
	// ended: 1000
	// Run: context canceled
}

// NewPool with a tuned configuration: the loop pinned to CPU 1, spinning
// waits, a bigger buffer ring. (Compiled, not run: it needs a feed on
// 127.0.0.1:9000, pins threads to CPUs 0 and 1 and spins.)
func ExampleNewPool() {
	p, err := talaris.NewPool(talaris.Config{
		LoopCPUs: []int{1},
		Wait:     talaris.WaitSpin,
		BufSize:  64 << 10,
		BufCount: 256,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	if err := talaris.PinCurrentThreadTo(0); err != nil { // the pumping goroutine's CPU
		log.Fatal(err)
	}
	c, err := p.DialAsync("ws://127.0.0.1:9000/feed", nil) // EventOpen or EventError follows
	if err != nil {
		log.Fatal(err)
	}
	for {
		if _, err := p.PumpDataNowait(func(c talaris.Conn, op talaris.Opcode, payload []byte) {
			// hot path: decode payload in place
		}); err != nil {
			break
		}
		if c.State() == talaris.StateClosed {
			break
		}
	}
}
