//go:build linux && cgo

package talaris_test

import (
	"context"
	"fmt"
	"log"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
)

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
		if _, err := p.Pump(func(c talaris.Conn, ev talaris.Event) {
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
		}); err != nil {
			log.Fatal(err)
		}
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
		if _, err := p.Pump(func(c talaris.Conn, ev talaris.Event) {
			if ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError {
				fmt.Println("closed with", ev.Code) // the server echoes the code
				done = true
			}
		}); err != nil {
			log.Fatal(err)
		}
	}
	fmt.Println(c.SendText([]byte("late")))
	// Output:
	// closed with 4001
	// talaris: closed
}
