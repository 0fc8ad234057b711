//go:build !race

package pgdurable_test

const raceEnabled = false
