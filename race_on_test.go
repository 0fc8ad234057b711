//go:build race

package pgdurable_test

// raceEnabled: the tests run with -race, so go list -race finds the
// packages this build compiled.
const raceEnabled = true
