//go:build linux && cgo

package talaris_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/talaris-go/talaris"
)

// TestZeroPool: a Pool not made by NewPool (var p talaris.Pool) behaves
// as a closed one: every call returns at once, the ones that can fail
// with ErrPoolClosed, Close with nil, and nothing panics. Found by a
// hostile review: Close panicked (close of nil channel), Dial said
// ErrTooManyConns and PumpNowait nil.
func TestZeroPool(t *testing.T) {
	var p talaris.Pool
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	nop := func(talaris.Conn, talaris.Opcode, []byte) {}
	want := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, talaris.ErrPoolClosed) {
			t.Errorf("zero Pool: %s: %v, want ErrPoolClosed", what, err)
		}
	}
	_, err := p.Dial(ctx, "ws://127.0.0.1:1/", nil)
	want("Dial", err)
	_, err = p.DialAsync("ws://127.0.0.1:1/", nil)
	want("DialAsync", err)
	_, err = p.DialMemory()
	want("DialMemory", err)
	_, err = p.PumpNowait(nop)
	want("PumpNowait", err)
	_, err = p.PumpSpin(10, nop)
	want("PumpSpin", err)
	_, err = p.PumpData(nop)
	want("PumpData", err)
	_, err = p.Pump(func(talaris.Conn, talaris.Event) {})
	want("Pump", err)
	_, err = p.PumpEventsNowait(func(talaris.Conn, talaris.Event) {})
	want("PumpEventsNowait", err)
	_, err = p.PumpStamped(func(talaris.Conn, talaris.Opcode, []byte, talaris.Stamps) {})
	want("PumpStamped", err)
	if n := p.ConnCount(); n != 0 {
		t.Errorf("zero Pool: ConnCount %d", n)
	}
	_ = p.Stats()
	_ = p.Metrics()
	_ = p.MetricsInterval()
	if err := p.WritePrometheus(&bytes.Buffer{}); err != nil {
		t.Logf("zero Pool: WritePrometheus: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("zero Pool: Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("zero Pool: second Close: %v", err)
	}
}
