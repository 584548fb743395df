//go:build race

package main

// raceBuild makes the worker binary under test race-enabled when the tests are.
const raceBuild = true
