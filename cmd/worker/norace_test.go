//go:build !race

package main

var raceFlags []string
