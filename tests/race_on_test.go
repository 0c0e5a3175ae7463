//go:build race

package talaris_test

// raceEnabled: the race detector slows the hammering tests down; they run
// fewer rounds under it.
const raceEnabled = true
