//go:build race

package exampletest

// raceFlags build the example's binaries race-enabled when the tests are,
// so that they share the tests' compile of every package they link.
var raceFlags = []string{"-race"}
