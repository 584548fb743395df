package config

import (
	"strconv"
	"strings"
)

// Error is one problem at one place in the configuration. Its message is a
// single line: where the value came from (file and line, or env variable),
// the field path, and what is wrong with which value. Secret values are never
// quoted. Loading reports several problems joined with errors.Join; use
// errors.As to get the first *Error.
type Error struct {
	File  string // config file the value came from, if any
	Env   string // environment variable the value came from, if any
	Line  int    // 1-based line in File or in the env variable's YAML, 0 if unknown
	Field string // path such as "redis.dial_timeout" or "schedules[0] (settle-orders).timezone"; "" for syntax and unknown keys
	Msg   string // what is wrong
	Err   error  // underlying cause, if any
}

func (e *Error) Error() string {
	var parts []string
	switch {
	case e.Env != "":
		parts = append(parts, "env "+e.Env)
	case e.File != "":
		parts = append(parts, e.File)
	}
	if e.Line > 0 {
		parts = append(parts, "line "+strconv.Itoa(e.Line))
	}
	// An env variable already names its own field.
	if e.Field != "" && (e.Env == "" || envName(e.Field) != e.Env) {
		parts = append(parts, e.Field)
	}
	msg := e.Msg
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	parts = append(parts, msg)
	return strings.ReplaceAll(strings.Join(parts, ": "), "\n", " ")
}

func (e *Error) Unwrap() error { return e.Err }

// origin is where a value came from: a file or an env variable, and a line.
type origin struct {
	file, env string
	line      int
}

func (o origin) error(field, msg string, cause error) *Error {
	return &Error{File: o.file, Env: o.env, Line: o.line, Field: field, Msg: msg, Err: cause}
}

// origins maps field keys ("worker.queues.critical", "schedules[0].timezone")
// to where their values came from, so that validation can point at them.
type origins map[string]origin

// forget drops key and everything below it, before a value is replaced whole.
func (o origins) forget(key string) {
	for k := range o {
		if k == key || strings.HasPrefix(k, key+".") || strings.HasPrefix(k, key+"[") {
			delete(o, k)
		}
	}
}

// fieldPath is a field's lookup key and the form shown in errors, which
// also names list elements: schedules[0] and schedules[0] (settle-orders).
type fieldPath struct{ key, show string }

func (p fieldPath) field(name string) fieldPath {
	if p.key == "" {
		return fieldPath{name, name}
	}
	return fieldPath{p.key + "." + name, p.show + "." + name}
}

func (p fieldPath) index(i int, name string) fieldPath {
	s := "[" + strconv.Itoa(i) + "]"
	q := fieldPath{p.key + s, p.show + s}
	if name != "" {
		q.show += " (" + name + ")"
	}
	return q
}

// OneLine shows err on one line, as the binaries print it before exiting:
// its first line (errors.Join puts one problem on each), white space
// collapsed, and how many more problems there are.
func OneLine(err error) string {
	var lines []string
	for l := range strings.Lines(err.Error()) {
		if l = strings.Join(strings.Fields(l), " "); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		return ""
	}
	switch n := len(lines) - 1; {
	case n == 1:
		return lines[0] + " (and 1 more problem)"
	case n > 1:
		return lines[0] + " (and " + strconv.Itoa(n) + " more problems)"
	}
	return lines[0]
}
