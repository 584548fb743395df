package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocumentedCommandsHaveHelp: every lockstep command that the README and
// the pages in docs/ show (in a shell block or in running text) exists and
// answers --help with its usage, exit 0.
func TestDocumentedCommandsHaveHelp(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md", "../../CONTRIBUTING.md", "../../CHANGELOG.md")
	inline := regexp.MustCompile("`lockstep ([a-z][^`]*)`")
	shell := regexp.MustCompile("(?m)^\\s*(?:bin/)?lockstep ([a-z].*)$")
	block := regexp.MustCompile("(?s)```sh\n.*?```")
	commands := map[string]string{} // "schedules add" -> the file that shows it
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for _, m := range inline.FindAllStringSubmatch(string(b), -1) {
			lines = append(lines, m[1])
		}
		for _, sh := range block.FindAllString(string(b), -1) {
			for _, m := range shell.FindAllStringSubmatch(sh, -1) {
				lines = append(lines, m[1])
			}
		}
		for _, l := range lines {
			words := strings.Fields(l)
			name := words[0]
			if name == "schedules" && len(words) > 1 && regexp.MustCompile(`^[a-z]+$`).MatchString(words[1]) {
				name += " " + words[1]
			}
			commands[name] = filepath.Base(f)
		}
	}
	for name, file := range commands {
		var stdout, stderr bytes.Buffer
		args := append(strings.Fields(name), "--help")
		code := run(context.Background(), args, strings.NewReader(""), &stdout, &stderr,
			func(string) (string, bool) { return "", false })
		usage := regexp.MustCompile(`lockstep ` + strings.Fields(name)[0] + `\b`)
		if len(args) == 3 { // a subcommand: its own usage line
			usage = regexp.MustCompile(`(lockstep schedules |\| )` + args[1] + ` `)
		}
		if code != exitOK || !usage.MatchString(stdout.String()) {
			t.Errorf("%s shows `lockstep %s`, whose --help exits %d with:\n%s%s", file, name, code, stdout.String(), stderr.String())
		}
	}
	if len(commands) < 8 {
		t.Fatalf("found %d commands in the docs (%v); the patterns no longer match them", len(commands), commands)
	}
}
