//go:build !race

package exampletest

var raceFlags []string
