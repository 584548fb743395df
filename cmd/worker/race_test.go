//go:build race

package main

// raceFlags make the binaries under test race-enabled when the tests are.
var raceFlags = []string{"-race"}
