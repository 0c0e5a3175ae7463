//go:build linux && cgo

package talaris_test

import (
	"context"
	"fmt"
	"log"
	"strings"
	"sync/atomic"
	"time"

	"github.com/talaris-go/talaris"
)

// A market-data feed that survives a dropped connection: the policy
// re-dials by itself and sends the subscription again on every new
// connection, before anything else; the Conn handle stays the same.
func ExampleDialOptions_reconnect() {
	var conns atomic.Int32
	venue := newExampleServer(func(c *exampleConn) {
		n := conns.Add(1)
		_, sub, ok := c.read() // every connection starts with the subscription
		if !ok {
			return
		}
		c.write(fmt.Sprintf("connection %d: subscribed to %s", n, sub))
		if n == 1 {
			return // drop the first connection without a close frame
		}
		c.read() // until the client closes
	})
	defer venue.Close()

	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	feed, err := p.Dial(ctx, venue.URL+"/trades", &talaris.DialOptions{
		Reconnect: &talaris.ReconnectPolicy{MinDelay: 10 * time.Millisecond, MaxAttempts: 5},
		Subscribe: [][]byte{[]byte("trades.BTC-USD")},
	})
	if err != nil {
		log.Fatal(err)
	}
	for done := false; !done; {
		_, err := p.Pump(func(c talaris.Conn, ev talaris.Event) {
			switch ev.Kind {
			case talaris.EventOpen:
				fmt.Println("open, reconnects:", ev.Reconnects)
			case talaris.EventText:
				fmt.Println(string(ev.Payload)) // valid only inside the callback
				if strings.HasPrefix(string(ev.Payload), "connection 2") {
					feed.Close(1000, "done")
				}
			case talaris.EventReconnecting:
				fmt.Println("dropped; reconnecting")
			case talaris.EventClose, talaris.EventError:
				fmt.Println("ended:", ev.Kind, ev.Code)
				done = true
			}
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	// Output:
	// open, reconnects: 0
	// connection 1: subscribed to trades.BTC-USD
	// dropped; reconnecting
	// open, reconnects: 1
	// connection 2: subscribed to trades.BTC-USD
	// ended: close 1000
}

// An order sent with SendContext: it waits while the connection's send
// queue is full (or through a reconnect gap) until ctx ends, where
// SendText would return ErrWouldBlock at once. The venue's
// acknowledgement comes back through the pump.
func ExampleConn_SendContext() {
	venue := newExampleServer(func(c *exampleConn) {
		for {
			_, order, ok := c.read()
			if !ok {
				return
			}
			c.write(`{"ack":` + string(order) + `}`)
		}
	})
	defer venue.Close()

	p, err := talaris.NewPool(talaris.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	c, err := p.Dial(context.Background(), venue.URL+"/orders", nil)
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := c.SendContext(ctx, talaris.OpText, []byte(`{"id":7,"side":"buy","qty":1}`)); err != nil {
		log.Fatal(err) // ctx ended, or the connection did
	}
	for acked := false; !acked; {
		if _, err := p.PumpData(func(c talaris.Conn, op talaris.Opcode, payload []byte) {
			fmt.Printf("%s\n", payload)
			acked = true
		}); err != nil {
			log.Fatal(err)
		}
	}
	c.Close(1000, "")
	// Output:
	// {"ack":{"id":7,"side":"buy","qty":1}}
}

// Metrics are read at any time from any goroutine, without a cgo call
// per counter; WritePrometheus writes them in the text exposition format.
func ExamplePool_Metrics() {
	venue := newExampleServer(func(c *exampleConn) {
		for i := 0; i < 100; i++ {
			c.write(fmt.Sprintf("tick %08d", i)) // 13 bytes each
		}
		c.close(1000, "end of session")
	})
	defer venue.Close()

	p, err := talaris.NewPool(talaris.Config{Name: "md"})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Dial(context.Background(), venue.URL+"/ticks", nil); err != nil {
		log.Fatal(err)
	}
	for done := false; !done; {
		if _, err := p.Pump(func(c talaris.Conn, ev talaris.Event) {
			done = ev.Kind == talaris.EventClose || ev.Kind == talaris.EventError
		}); err != nil {
			log.Fatal(err)
		}
	}
	m := p.Metrics()
	fmt.Println("messages:", m.Messages, "payload bytes:", m.Bytes)
	// Output:
	// messages: 100 payload bytes: 1300
}
