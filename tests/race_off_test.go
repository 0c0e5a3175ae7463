//go:build !race

package talaris_test

// raceEnabled: the race detector slows everything ~10x; big transfers shrink.
const raceEnabled = false
