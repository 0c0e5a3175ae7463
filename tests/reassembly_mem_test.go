//go:build linux && cgo

package talaris_test

import (
	"bytes"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
	"github.com/talaris-go/talaris/internal/wstest"
	"github.com/talaris-go/talaris/ws"
)

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
