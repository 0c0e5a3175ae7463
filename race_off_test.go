//go:build !race

package talaris

const raceEnabled = false
