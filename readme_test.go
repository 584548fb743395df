package lockstep_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The snippets of the README and of every page in docs/ are copied from
// files that the build checks: every Go block from an example test (which
// compiles), every YAML block from a config in configs/ (which the config
// tests load), and every make target they name exists. Each paragraph of a
// block (lines between blank lines) must appear in its source as it is, up to
// indentation.
func TestREADMESnippetsComeFromCheckedFiles(t *testing.T) {
	t.Parallel()
	for _, f := range docFiles(t) {
		counted := snippets(t, f)
		if f == "README.md" && (counted["go"] < 2 || counted["yaml"] < 1) {
			t.Fatalf("found %v snippets in README.md; the pattern no longer matches them", counted)
		}
	}
}

// The README's handler is a whole file of the example service, so that it
// compiles as shown, imports included.
func TestREADMEHandlerIsAWholeFile(t *testing.T) {
	t.Parallel()
	want := normalize(read(t, "examples/orders/pay.go"))
	for _, b := range regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(read(t, "README.md"), -1) {
		if normalize(b[1]) == want {
			return
		}
	}
	t.Fatal("README.md has no Go block that is examples/orders/pay.go as a whole")
}

func snippets(t *testing.T, file string) map[string]int {
	t.Helper()
	blocks := regexp.MustCompile("(?s)```(go|yaml|sh)\n(.*?)```").FindAllStringSubmatch(read(t, file), -1)
	sources := map[string][]string{
		"go":   glob(t, "example_test.go", "*/example_test.go", "*/*/example_test.go", "examples/*/*.go", "examples/*/cmd/*/*.go"),
		"yaml": glob(t, "configs/*.yaml", "examples/*/configs/*.yaml"),
	}
	counted := map[string]int{}
	for _, b := range blocks {
		lang, body := b[1], b[2]
		counted[lang]++
		if lang == "sh" {
			for _, target := range regexp.MustCompile(`(?m)^make (\w+)`).FindAllStringSubmatch(body, -1) {
				if !regexp.MustCompile(`(?m)^` + target[1] + `:`).MatchString(read(t, "Makefile")) {
					t.Errorf("%s runs `make %s`, which the Makefile does not define", file, target[1])
				}
			}
			continue
		}
		for _, para := range strings.Split(normalize(body), "\n\n") {
			if strings.TrimSpace(para) == "" {
				continue
			}
			found := false
			for _, src := range sources[lang] {
				if strings.Contains(normalize(read(t, src)), para) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s: %s snippet is in none of %v:\n%s", file, lang, sources[lang], para)
			}
		}
	}
	return counted
}

// normalize drops indentation and trailing spaces.
func normalize(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return strings.Join(lines, "\n")
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func glob(t *testing.T, patterns ...string) []string {
	t.Helper()
	var out []string
	for _, p := range patterns {
		m, err := filepath.Glob(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	return out
}
