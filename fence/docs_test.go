package fence_test

import (
	"os"
	"strings"
	"testing"

	"github.com/lockstep-dev/lockstep/fence"
)

// TestDocsShowDDL: the tables that docs/workers.md shows for those who
// migrate with their own tool are the ones Create makes.
func TestDocsShowDDL(t *testing.T) {
	b, err := os.ReadFile("../docs/workers.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, tbl := range []*fence.Table{fence.Postgres("lockstep_fences"), fence.MySQL("lockstep_fences")} {
		if !strings.Contains(string(b), tbl.DDL()) {
			t.Errorf("docs/workers.md does not show the table Create makes:\n%s", tbl.DDL())
		}
	}
}
