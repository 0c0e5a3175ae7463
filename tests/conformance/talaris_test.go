//go:build linux && cgo

package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/testhook"
)

func init() {
	talarisAdapter = talarisClient{}
	talarisTLSAdapter = talarisClient{tls: true}
}

// talarisClient runs a case through a fresh talaris Pool: Dial, then Pump
// with an echo loop until the connection's final event. With tls set it
// dials the server's wss:// port and trusts the test CA.
type talarisClient struct{ tls bool }

func (c talarisClient) Name() string {
	if c.tls {
		return "talaris" + wssSuffix
	}
	return "talaris"
}

func (tc talarisClient) Run(url string, o Opts) *Result {
	cfg := talaris.Config{CloseTimeout: time.Second, HandshakeTimeout: 5 * time.Second}
	if o.Talaris != nil {
		o.Talaris(&cfg)
	}
	r := &Result{}
	p, err := talaris.NewPool(cfg)
	if err != nil {
		r.DialErr = err
		return r
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), guardLong)
	defer cancel()
	opts := &talaris.DialOptions{HandshakeTimeout: o.HandshakeTimeout, Subprotocols: o.Subprotocols}
	if tc.tls {
		opts.TLS.RootCAFile = testCAFile
	}
	c, err := p.Dial(ctx, url, opts)
	if err != nil {
		r.DialErr = err
		return r
	}
	r.Opened = true
	r.Subprotocol = c.Subprotocol()
	// Hang guard: closing the pool makes Pump return ErrPoolClosed.
	var hung atomic.Value
	guard := time.AfterFunc(2*guardLong, func() {
		hung.Store(fmt.Sprintf("hang guard fired: state %v, conn %+v, pool %+v", c.State(), c.Stats(), testhook.Stats(p)))
		p.Close()
	})
	defer guard.Stop()
	done, events := false, 0
	var sendErr error
	var foreign []string
	for !done {
		_, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
			if cc != c {
				foreign = append(foreign, fmt.Sprintf("%v id=%x want %x code %d", ev.Kind, cc.ID(), c.ID(), ev.Code))
				return
			}
			events++
			// A slow consumer sleeps long enough for a flood to fill the
			// event ring (X.4's is 256) but not once per event: the time
			// a flood takes must not scale with how far the kernel grew
			// the receive buffer (tcp_rmem's maximum is 32 MiB here, and
			// a run under load once absorbed 341k pings before the
			// server's write blocked, 11 s of 1 ms sleeps every 32).
			if o.Slow && events%256 == 0 {
				time.Sleep(time.Millisecond)
			}
			switch ev.Kind {
			case talaris.EventText, talaris.EventBinary:
				// An echo behind a full send queue (pongs fill it in X.4)
				// waits for room as a real echo server would; a send that
				// still fails is reported, not dropped in silence.
				op, send := talaris.OpBinary, c.SendBinary
				if ev.Kind == talaris.EventText {
					op, send = talaris.OpText, c.SendText
				}
				err := send(ev.Payload)
				if errors.Is(err, talaris.ErrWouldBlock) {
					err = c.SendContext(ctx, op, ev.Payload)
				}
				if err != nil && sendErr == nil {
					sendErr = err
				}
				r.Echoed++
				if o.CloseAfter > 0 && r.Echoed == o.CloseAfter {
					if o.CloseDelay > 0 {
						time.AfterFunc(o.CloseDelay, func() { c.Close(talaris.CloseNormal, "bye") })
					} else {
						c.Close(talaris.CloseNormal, "bye")
					}
				}
			case talaris.EventClose:
				r.Final = fmt.Sprintf("EventClose %d", ev.Code)
				r.Code = ev.Code
				done = true
			case talaris.EventError:
				r.Final = fmt.Sprintf("EventError %d %s", ev.Code, sentinelNames[firstSentinel(ev.Err)])
				r.Code, r.Err = ev.Code, ev.Err
				done = true
			}
		})
		if err != nil {
			r.Final, r.Err = "pump: "+err.Error(), err
			if h, ok := hung.Load().(string); ok {
				r.Final += "; " + h + fmt.Sprintf("; foreign events %q", foreign)
			}
			break
		}
	}
	if sendErr != nil {
		r.Final += fmt.Sprintf(" (echo %d failed: %v)", r.Echoed, sendErr)
	}
	if o.Slow {
		r.Notes = append(r.Notes, fmt.Sprintf("pool stats %+v", testhook.Stats(p)))
	}
	return r
}
