package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	coder "github.com/coder/websocket"
	"github.com/gorilla/websocket"
)

// talarisAdapter and talarisTLSAdapter (the same client over wss://) are
// set on platforms where talaris runs (linux, cgo).
var talarisAdapter, talarisTLSAdapter Client

// wssSuffix ends the name of a client column that runs over wss://.
const wssSuffix = "-wss"

// The test PKI (see ../../testdata): the server certificate is valid for
// 127.0.0.1 and signed by the test CA.
const (
	testCAFile   = "../../testdata/ca.pem"
	testCertFile = "../../testdata/server.pem"
	testKeyFile  = "../../testdata/server-key.pem"
)

func isTLSClient(cl Client) bool { return strings.HasSuffix(cl.Name(), wssSuffix) }

// readLimit matches talaris' default MaxMessageSize so that the comparison
// clients are not failed by their smaller defaults (coder: 32 KiB).
const readLimit = 16 << 20

func firstSentinel(err error) error {
	for _, s := range sentinels {
		if errors.Is(err, s) {
			return s
		}
	}
	return nil
}

// gorillaClient echoes with github.com/gorilla/websocket's client.
type gorillaClient struct{}

func (gorillaClient) Name() string { return "gorilla" }

func (gorillaClient) Run(url string, o Opts) *Result {
	hs := o.HandshakeTimeout
	if hs == 0 {
		hs = 5 * time.Second
	}
	d := websocket.Dialer{HandshakeTimeout: hs, Subprotocols: o.Subprotocols}
	r := &Result{}
	c, resp, err := d.Dial(url, nil)
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		r.DialErr = err
		return r
	}
	defer c.Close()
	r.Opened = true
	r.Subprotocol = c.Subprotocol()
	c.SetReadLimit(readLimit)
	c.SetReadDeadline(time.Now().Add(2 * guardLong))
	for {
		mt, p, err := c.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if errors.As(err, &ce) {
				r.Code = ce.Code
				r.Final = fmt.Sprintf("close error %d", ce.Code)
			} else {
				r.Final = "read error: " + shorten(err.Error())
			}
			r.Err = err
			return r
		}
		if o.Slow {
			time.Sleep(time.Millisecond)
		}
		c.WriteMessage(mt, p)
		r.Echoed++
		if o.CloseAfter > 0 && r.Echoed == o.CloseAfter {
			time.Sleep(o.CloseDelay)
			c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(1000, "bye"), time.Now().Add(time.Second))
			c.SetReadDeadline(time.Now().Add(time.Second)) // the client's close timeout
		}
	}
}

// coderClient echoes with github.com/coder/websocket's client.
type coderClient struct{}

func (coderClient) Name() string { return "coder" }

func (coderClient) Run(url string, o Opts) *Result {
	hs := o.HandshakeTimeout
	if hs == 0 {
		hs = 5 * time.Second
	}
	r := &Result{}
	ctx, cancel := context.WithTimeout(context.Background(), hs)
	c, resp, err := coder.Dial(ctx, url, &coder.DialOptions{Subprotocols: o.Subprotocols})
	cancel()
	if resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
	if err != nil {
		r.DialErr = err
		return r
	}
	defer c.CloseNow()
	r.Opened = true
	r.Subprotocol = c.Subprotocol()
	c.SetReadLimit(readLimit)
	rctx, rcancel := context.WithTimeout(context.Background(), 2*guardLong)
	defer rcancel()
	for {
		typ, p, err := c.Read(rctx)
		if err != nil {
			if code := coder.CloseStatus(err); code != -1 {
				r.Code = int(code)
				r.Final = fmt.Sprintf("close error %d", code)
			} else {
				r.Final = "read error: " + shorten(err.Error())
			}
			r.Err = err
			return r
		}
		if o.Slow {
			time.Sleep(time.Millisecond)
		}
		c.Write(rctx, typ, p)
		r.Echoed++
		if o.CloseAfter > 0 && r.Echoed == o.CloseAfter {
			time.Sleep(o.CloseDelay)
			err := c.Close(coder.StatusNormalClosure, "bye")
			r.Final = "Close: " + fmt.Sprint(err)
			if err != nil {
				r.Final = "Close: " + shorten(err.Error())
			}
			r.Err = err
			return r
		}
	}
}

func shorten(s string) string {
	if len(s) > 70 {
		return s[:70] + "..."
	}
	return s
}
