//go:build linux && cgo

package talaris_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	. "github.com/talaris-go/talaris"
)

// blockingWarn holds every Warn record (a failed connection's) until
// release is closed, after telling entered.
type blockingWarn struct{ entered, release chan struct{} }

func (h blockingWarn) Enabled(context.Context, slog.Level) bool { return true }
func (h blockingWarn) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn && r.Message != "dial failed" {
		select {
		case h.entered <- struct{}{}:
		default:
		}
		<-h.release
	}
	return nil
}
func (h blockingWarn) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h blockingWarn) WithGroup(string) slog.Handler      { return h }

// TestFailedDialLogsOutsidePumpClaim: a failed Dial passes its quiet
// events itself (reapQuiet) under the pump claim; the Config.Logger
// records of them are written after it gave the claim back, so a user's
// slow handler never holds up a pump call. Here the handler blocks until
// PumpNowait has returned. Found by a review: the records were written
// under the claim and PumpNowait spun for as long as the handler ran.
func TestFailedDialLogsOutsidePumpClaim(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "ws://" + ln.Addr().String() + "/"
	ln.Close()
	h := blockingWarn{entered: make(chan struct{}, 1), release: make(chan struct{})}
	p := newTestPool(t, Config{Logger: slog.New(h)}, hangGuard)
	dialDone := make(chan error, 1)
	go func() {
		_, err := p.Dial(context.Background(), url, nil)
		dialDone <- err
	}()
	select {
	case <-h.entered: // the reaping Dial writes the failure record
	case <-time.After(hangGuard):
		t.Fatal("the failed connection's record was never written")
	}
	pumped := make(chan error, 1)
	go func() {
		_, err := p.PumpNowait(func(Conn, Opcode, []byte) {})
		pumped <- err
	}()
	select {
	case err := <-pumped:
		if err != nil {
			t.Errorf("PumpNowait: %v", err)
		}
	case <-time.After(hangGuard):
		t.Error("PumpNowait waits on the Logger of a failed Dial")
	}
	close(h.release)
	if err := <-dialDone; err == nil {
		t.Error("Dial to a closed port succeeded")
	}
}
