package chaos

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/internal/sqltest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(sqltest.Main(m), redistest.LeakOptions()...)
}
