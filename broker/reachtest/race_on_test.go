//go:build race

package reachtest

// raceEnabled shrinks the bulk transfers: the race detector slows the Go
// code on the data path (WebSocket masking, framing, hashing) about tenfold,
// and the package must stay well under a minute on two shared cores.
const raceEnabled = true
