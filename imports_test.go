package lockstep_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// maxRootDeps bounds the non-standard packages a program links for the root
// package alone (a lock on Redis): go-redis, the OpenTelemetry API,
// Prometheus' client and Lockstep's own.
const maxRootDeps = 100

// heavy are packages a library package must not link: etcd's client and
// gRPC belong to package etcd, OpenTelemetry's SDK and exporters to cmd/.
var heavy = []string{"go.etcd.io/", "google.golang.org/grpc", "go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/otel/exporters/"}

// deps lists the non-standard packages pkg links (go list -deps), without
// the standard library's vendored ones.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	var ps []string
	for p := range strings.FieldsSeq(string(out)) {
		ps = append(ps, p)
	}
	return ps
}

// A user's import takes only what it uses: the library packages link no
// etcd, gRPC, OpenTelemetry SDK or exporter; the root package (a lock) no
// asynq either, and at most maxRootDeps non-standard packages; fence the
// standard library only.
func TestImportsStayLight(t *testing.T) {
	for _, pkg := range []string{".", "./worker", "./schedules"} {
		ps := deps(t, pkg)
		banned := heavy
		if pkg == "." {
			banned = append(banned[:len(banned):len(banned)], "github.com/hibiken/asynq")
			if len(ps) > maxRootDeps {
				t.Errorf("the root package links %d non-standard packages, want at most %d:\n%s", len(ps), maxRootDeps, strings.Join(ps, "\n"))
			}
		}
		for _, p := range ps {
			for _, b := range banned {
				if strings.HasPrefix(p, b) {
					t.Errorf("%s links %s", pkg, p)
				}
			}
		}
	}
	// fence checks in the caller's transaction with database/sql alone: a
	// user's driver is the user's.
	for _, p := range deps(t, "./fence") {
		if !strings.HasPrefix(p, "github.com/lockstep-dev/lockstep/fence") {
			t.Errorf("package fence links %s; want the standard library and its own packages only", p)
		}
	}
	// The etcd back end is in its own package, which links etcd's client.
	if !slicesHasPrefix(deps(t, "./etcd"), "go.etcd.io/etcd/client/v3") {
		t.Error("package etcd does not link etcd's client: this test's list of heavy packages is out of date")
	}
}

func slicesHasPrefix(ps []string, prefix string) bool {
	for _, p := range ps {
		if strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return false
}

// maxTrackedFile bounds every file the repository tracks: a built binary or
// a data dump makes every clone heavier.
const maxTrackedFile = 1 << 20

func TestNoLargeTrackedFiles(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for name := range strings.SplitSeq(strings.TrimRight(string(out), "\x00"), "\x00") {
		fi, err := os.Lstat(name)
		if err != nil {
			continue // deleted in the work tree, not yet committed
		}
		if fi.Size() > maxTrackedFile {
			t.Errorf("%s is tracked and has %d bytes (over %d): keep binaries and data out of git (.gitignore)", name, fi.Size(), maxTrackedFile)
		}
	}
}
