package deploytest

import (
	"fmt"
	"strings"
	"unicode"
)

// selector is a vector selector in a PromQL expression: a metric name and
// its label matchers.
type selector struct {
	name     string
	matchers []matcher
}

type matcher struct {
	label, op, value string
}

// parsed is what the checks need from an expression: its selectors and the
// labels named in by/without/on/ignoring/group_left/group_right clauses.
type parsed struct {
	selectors []selector
	grouping  []string
}

// keywords are identifiers that are not metric names even when not followed
// by "(": operators, modifiers, and aggregations (sum by (x) (...)).
var keywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true, "start": true, "end": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

var groupingKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// parsePromQL finds the selectors and grouping labels of expr. It is a
// tokenizer, not a parser: Prometheus itself checks the syntax (promtool and
// the end-to-end test); this finds the names to compare with the code.
func parsePromQL(expr string) (parsed, error) {
	toks, err := tokenize(expr)
	if err != nil {
		return parsed{}, err
	}
	var p parsed
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		next := func(k int) token {
			if i+k < len(toks) {
				return toks[i+k]
			}
			return token{}
		}
		switch {
		case t.kind == tokIdent && groupingKeywords[t.text]:
			if next(1).text != "(" {
				continue // group_left without labels
			}
			j := i + 2
			for ; j < len(toks) && toks[j].text != ")"; j++ {
				if toks[j].kind == tokIdent {
					p.grouping = append(p.grouping, toks[j].text)
				}
			}
			i = j
		case t.kind == tokIdent && next(1).text == "(":
			// a function or aggregation
		case t.kind == tokIdent && keywords[t.text]:
		case t.kind == tokIdent || t.text == "{":
			s := selector{}
			if t.kind == tokIdent {
				s.name = t.text
				if next(1).text != "{" {
					p.selectors = append(p.selectors, s)
					continue
				}
				i++
			}
			j := i + 1
			for ; j < len(toks) && toks[j].text != "}"; j++ {
				if toks[j].text == "," {
					continue
				}
				if j+2 >= len(toks) || toks[j].kind != tokIdent || toks[j+1].kind != tokOp || toks[j+2].kind != tokString {
					return p, fmt.Errorf("cannot read label matcher at %q", toks[j].text)
				}
				m := matcher{label: toks[j].text, op: toks[j+1].text, value: toks[j+2].text}
				if m.label == "__name__" && m.op == "=" {
					s.name = m.value
				}
				s.matchers = append(s.matchers, m)
				j += 2
			}
			i = j
			p.selectors = append(p.selectors, s)
		case t.text == "[":
			for i < len(toks) && toks[i].text != "]" { // range or subquery
				i++
			}
		}
	}
	return p, nil
}

type tokenKind int

const (
	tokIdent tokenKind = iota + 1
	tokString
	tokNumber
	tokOp
	tokPunct
)

type token struct {
	kind tokenKind
	text string // a string token holds its unquoted value
}

func tokenize(s string) ([]token, error) {
	var toks []token
	r := []rune(s)
	for i := 0; i < len(r); {
		c := r[i]
		switch {
		case unicode.IsSpace(c):
			i++
		case c == '#': // comment to end of line
			for i < len(r) && r[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			var b strings.Builder
			for ; j < len(r) && r[j] != c; j++ {
				if r[j] == '\\' && c != '`' && j+1 < len(r) {
					j++
				}
				b.WriteRune(r[j])
			}
			if j >= len(r) {
				return nil, fmt.Errorf("unterminated string in %q", s)
			}
			toks = append(toks, token{tokString, b.String()})
			i = j + 1
		case c == '_' || c == ':' || unicode.IsLetter(c):
			j := i
			for j < len(r) && (r[j] == '_' || r[j] == ':' || unicode.IsLetter(r[j]) || unicode.IsDigit(r[j])) {
				j++
			}
			toks = append(toks, token{tokIdent, string(r[i:j])})
			i = j
		case unicode.IsDigit(c) || c == '.':
			j := i // numbers and durations (5m, 1h30m, 1e3, 0x1f)
			for j < len(r) && (unicode.IsDigit(r[j]) || unicode.IsLetter(r[j]) || r[j] == '.') {
				j++
			}
			toks = append(toks, token{tokNumber, string(r[i:j])})
			i = j
		case strings.ContainsRune("(){}[],", c):
			toks = append(toks, token{tokPunct, string(c)})
			i++
		default:
			j := i
			for j < len(r) && strings.ContainsRune("=!~<>+-*/%^@", r[j]) {
				j++
			}
			if j == i {
				return nil, fmt.Errorf("unexpected %q in %q", c, s)
			}
			toks = append(toks, token{tokOp, string(r[i:j])})
			i = j
		}
	}
	return toks, nil
}
