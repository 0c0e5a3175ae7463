//go:build linux && cgo

package talaris_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

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

// Pump delivers every event of every connection of the pool, in order.
func ExamplePool_Pump() {
	srv := wstest.NewGorilla().Start(nil) // a local test server
	defer srv.Close()
	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	// /stream sends three text messages, then closes with 1000 "done".
	if _, err := p.Dial(context.Background(), srv.URL+"/stream?n=3&size=8&op=text", nil); err != nil {
		log.Fatal(err)
	}
	for done := false; !done; {
		if _, err := p.Pump(func(c talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventOpen:
				fmt.Println(ev.Kind)
			case talaris.EventClose, talaris.EventError:
				fmt.Printf("%v %d %s\n", ev.Kind, ev.Code, ev.Reason)
				done = true
			default:
				fmt.Printf("%v %s\n", ev.Kind, ev.Payload)
			}
		}); err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// open
	// text 00000000
	// text 00000001
	// text 00000002
	// close 1000 done
}

// SendText may be called from any goroutine; the loop frames, masks and
// sends. Close starts the close handshake.
func ExampleConn_SendText() {
	srv := wstest.NewGorilla().Start(nil)
	defer srv.Close()
	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	c, err := p.Dial(context.Background(), srv.URL+"/echo", nil)
	if err != nil {
		log.Fatal(err)
	}
	c.SendText([]byte("hello"))
	c.SendBinary([]byte{1, 2, 3})
	echoed := 0
	for done := false; !done; {
		p.Pump(func(c talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventText, talaris.EventBinary:
				fmt.Printf("echo %v %q\n", ev.Kind, ev.Payload)
				if echoed++; echoed == 2 {
					c.Close(talaris.CloseNormal, "bye")
				}
			case talaris.EventClose, talaris.EventError:
				fmt.Println("closed", ev.Code)
				done = true
			}
		})
	}
	// Output:
	// echo text "hello"
	// echo binary "\x01\x02\x03"
	// closed 1000
}

// Close sends a close frame with a code and reason; the server's answer
// ends the connection with EventClose.
func ExampleConn_Close() {
	srv := wstest.NewGorilla().Start(nil)
	defer srv.Close()
	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	c, err := p.Dial(context.Background(), srv.URL+"/echo", nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Close(4001, "bye"); err != nil {
		log.Fatal(err)
	}
	for done := false; !done; {
		p.Pump(func(c talaris.Conn, ev talaris.Event) {
			if ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError {
				fmt.Println("closed with", ev.Code) // the server echoes the code
				done = true
			}
		})
	}
	fmt.Println(c.SendText([]byte("late")))
	// Output:
	// closed with 4001
	// talaris: closed
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

// NewPool with a tuned configuration: the loop pinned to CPU 1, spinning
// waits, a bigger buffer ring. (Compiled, not run.)
func ExampleNewPool() {
	p, err := talaris.NewPool(talaris.Config{
		LoopCPU:      1,
		LoopCPUSet:   true,
		LoopWait:     talaris.WaitSpin,
		ConsumerWait: talaris.WaitSpin,
		BufSize:      64 << 10,
		BufCount:     256,
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
		if _, err := p.PumpSpin(1024, func(c talaris.Conn, op talaris.Opcode, payload []byte) {
			// hot path: decode payload in place
		}); err != nil {
			break
		}
		if c.State() == talaris.StateClosed {
			break
		}
	}
}
