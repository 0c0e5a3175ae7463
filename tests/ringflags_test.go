//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	"github.com/talaris-go/talaris"
	"testing"
	"time"

	"github.com/talaris-go/talaris/internal/wstest"
)

// TestRingFlagsAndWaits streams through pools built with each io_uring
// setup-flag set and each wait strategy: every configuration must deliver
// the whole stream intact. A flag set the kernel refuses must fail NewPool
// with ErrInvalidConfig (never later).
func TestRingFlagsAndWaits(t *testing.T) {
	srv := wstest.NewGorilla().Start(t)
	cases := []struct {
		name string
		cfg  talaris.Config
	}{
		{"default", talaris.Config{}},
		{"no-flags", talaris.Config{RingFlags: talaris.RingFlagsNone}},
		{"coop-taskrun", talaris.Config{RingFlags: talaris.RingCoopTaskrun | talaris.RingTaskrunFlag}},
		{"single-issuer", talaris.Config{RingFlags: talaris.RingSingleIssuer}},
		{"sqpoll", talaris.Config{RingFlags: talaris.RingSQPoll, SQPollIdle: 2 * time.Millisecond}},
		{"sqpoll-aff", talaris.Config{RingFlags: talaris.RingSQPoll | talaris.RingSQAff, SQPollCPU: 0}},
		{"wait-block", talaris.Config{LoopWait: talaris.WaitBlock, ConsumerWait: talaris.WaitBlock}},
		{"wait-spin", talaris.Config{LoopWait: talaris.WaitSpin, ConsumerWait: talaris.WaitSpin}},
		{"wait-spin-then-block", talaris.Config{LoopWait: talaris.WaitSpinThenBlock, ConsumerWait: talaris.WaitSpinThenBlock, SpinTime: 20 * time.Microsecond}},
		{"wait-adaptive", talaris.Config{LoopWait: talaris.WaitAdaptive, ConsumerWait: talaris.WaitAdaptive}},
		{"pinned-loop", talaris.Config{LoopCPU: 0, LoopCPUSet: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := talaris.NewPool(tc.cfg)
			if err != nil {
				if errors.Is(err, talaris.ErrInvalidConfig) {
					t.Skipf("kernel refused this setup: %v", err)
				}
				t.Fatal(err)
			}
			defer p.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const n = 20000
			c, err := p.Dial(ctx, srv.URL+"/stream?n=20000&size=40", nil)
			if err != nil {
				t.Fatal(err)
			}
			chk := wstest.NewChecker(40)
			var final *talaris.Event
			for final == nil {
				if _, err := p.Pump(func(cc talaris.Conn, ev talaris.Event) {
					switch ev.Kind {
					case talaris.EventBinary:
						if err := chk.Check(ev.Payload); err != nil {
							t.Fatal(err)
						}
					case talaris.EventClose, talaris.EventError:
						e := ev
						final = &e
					}
				}); err != nil {
					t.Fatal(err)
				}
			}
			if chk.Count() != n || final.Kind != talaris.EventClose || final.Code != 1000 {
				t.Fatalf("%d/%d messages, final %v %d %v", chk.Count(), n, final.Kind, final.Code, final.Err)
			}
			_ = c
		})
	}
}
