//go:build !race

package talaris_test

const raceEnabled = false
