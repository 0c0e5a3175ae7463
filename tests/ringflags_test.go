//go:build linux && cgo

package talaris_test

import (
	"context"
	"errors"
	. "github.com/talaris-go/talaris"
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
		cfg  Config
	}{
		{"default", Config{}},
		{"no-flags", Config{RingFlags: RingFlagsNone}},
		{"coop-taskrun", Config{RingFlags: RingCoopTaskrun | RingTaskrunFlag}},
		{"single-issuer", Config{RingFlags: RingSingleIssuer}},
		{"sqpoll", Config{RingFlags: RingSQPoll, SQPollIdle: 2 * time.Millisecond}},
		{"sqpoll-aff", Config{RingFlags: RingSQPoll | RingSQAff, SQPollCPU: 0}},
		{"wait-block", Config{LoopWait: WaitBlock, ConsumerWait: WaitBlock}},
		{"wait-spin", Config{LoopWait: WaitSpin, ConsumerWait: WaitSpin}},
		{"wait-spin-then-block", Config{LoopWait: WaitSpinThenBlock, ConsumerWait: WaitSpinThenBlock, SpinTime: 20 * time.Microsecond}},
		{"wait-adaptive", Config{LoopWait: WaitAdaptive, ConsumerWait: WaitAdaptive}},
		{"pinned-loop", Config{LoopCPU: 0, LoopCPUSet: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewPool(tc.cfg)
			if err != nil {
				if errors.Is(err, ErrInvalidConfig) {
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
			var final *Event
			for final == nil {
				if _, err := p.Pump(func(cc Conn, ev Event) {
					switch ev.Kind {
					case EventBinary:
						if err := chk.Check(ev.Payload); err != nil {
							t.Fatal(err)
						}
					case EventClose, EventError:
						e := ev
						final = &e
					}
				}); err != nil {
					t.Fatal(err)
				}
			}
			if chk.Count() != n || final.Kind != EventClose || final.Code != 1000 {
				t.Fatalf("%d/%d messages, final %v %d %v", chk.Count(), n, final.Kind, final.Code, final.Err)
			}
			_ = c
		})
	}
}
