package etcdtest_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/etcdtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, etcdtest.LeakOptions()...) }
