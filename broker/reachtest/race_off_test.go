//go:build !race

package reachtest

const raceEnabled = false
