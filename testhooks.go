package talaris

// The one place the package registers what internal/testhook exposes to
// the benchmark and the black-box tests (which live in modules of their
// own): knobs on a Config, the decoder, a Metrics' loop counters, the
// Prometheus writer. The Linux-only views of a Pool are in
// testhooks_linux.go. Nothing here is on a user's path.

import (
	"io"

	"github.com/talaris-go/talaris/internal/testhook"
)

func init() {
	testhook.SetKnobs = func(cfg any, k *testhook.Knobs) {
		c := cfg.(*Config)
		if k == nil {
			c.knobs = nil
			return
		}
		kk := *k
		c.knobs = &kk
	}
	testhook.NewDecoder = func(maxMessage int) (testhook.Decoder, error) {
		if maxMessage <= 0 {
			maxMessage = int(defaults.MaxMessageSize)
		}
		d, err := newDecoder(uint64(maxMessage), decoderEventRing, arenaFor(decoderMinArenaSize, uint64(maxMessage)))
		if err != nil {
			return nil, err
		}
		return d, nil
	}
	testhook.SetLoopCounters = func(m any, c testhook.LoopCounters) { m.(*Metrics).loop = c }
	testhook.WritePrometheus = func(w io.Writer, pool string, m any) error {
		mm := m.(Metrics)
		return writePrometheus(w, pool, &mm)
	}
}
