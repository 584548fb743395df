package fence_test

import (
	"database/sql"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/lockstep-dev/lockstep/fence"
)

// TestImportsStandardLibraryOnly: package fence (and the bridge under it)
// make their importers compile nothing but the standard library: no driver,
// no lockstep package.
func TestImportsStandardLibraryOnly(t *testing.T) {
	const bridge = "github.com/lockstep-dev/lockstep/fence/internal/bridge"
	files := 0
	for _, dir := range []string{".", "internal/bridge"} {
		paths, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range paths {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			files++
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				first, _, _ := strings.Cut(p, "/")
				if p != bridge && strings.Contains(first, ".") {
					t.Errorf("%s imports %s: package fence must import only the standard library", path, p)
				}
			}
		}
	}
	if files < 5 {
		t.Fatalf("checked %d files; the glob no longer finds the package", files)
	}
}

// The handles a check runs on.
var (
	_ fence.Querier = (*sql.Tx)(nil)
	_ fence.Querier = (*sql.Conn)(nil)
	_ fence.Querier = (*sql.DB)(nil)
)
