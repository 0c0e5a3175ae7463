//go:build race

package talaris

// raceEnabled: the race detector's instrumentation changes escape
// analysis, so allocation counts are checked only without it.
const raceEnabled = true
