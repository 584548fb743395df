package main

// Stub, replaced at merge by the CLI helper's main_test.go (which must keep a
// goleak TestMain).

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.LeakOptions()...) }
