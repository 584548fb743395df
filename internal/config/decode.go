package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

var (
	durationType = reflect.TypeFor[time.Duration]()
	rawJSONType  = reflect.TypeFor[json.RawMessage]()
)

// decodeDoc decodes one YAML document into v. Config files and the env
// variables that hold lists both go through it.
func decodeDoc(data []byte, src origin, v reflect.Value, p fieldPath, o origins) []error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
		return nil // empty: keep what is there
	} else if err != nil {
		return []error{syntaxError(src, err)}
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		src.line = next.Line
		return []error{src.error("", "only one YAML document is allowed", nil)}
	case !errors.Is(err, io.EOF):
		return []error{syntaxError(src, err)}
	}
	d := decoder{src: src, origins: o}
	if len(doc.Content) > 0 {
		d.value(doc.Content[0], v, p, doc.Content[0].Line)
	}
	return d.errs
}

// syntaxError turns "yaml: line 3: did not find expected key" into an *Error.
func syntaxError(src origin, err error) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, tail, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				src.line, msg = n, tail
			}
		}
	}
	return src.error("", "invalid YAML: "+msg, nil)
}

// decoder sets Go values from YAML nodes, strictly: unknown and duplicate
// keys and values of the wrong shape are errors; null keeps the value there.
// Every value it sets is recorded in origins with its line.
type decoder struct {
	src     origin
	origins origins
	errs    []error
}

func (d *decoder) fail(n *yaml.Node, field, msg string) {
	o := d.src
	o.line = n.Line
	d.errs = append(d.errs, o.error(field, msg, nil))
}

// value decodes n into v. line is where the value is said to come from: the
// line of its key, so that a section is located at "redis:", not below it.
func (d *decoder) value(n *yaml.Node, v reflect.Value, p fieldPath, line int) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return
	}
	if k := v.Kind(); k == reflect.Map || k == reflect.Slice {
		d.origins.forget(p.key) // replaced whole, not merged
	}
	if p.key != "" {
		o := d.src
		o.line = line
		d.origins[p.key] = o
	}

	switch {
	case v.Type() == rawJSONType:
		d.object(n, v, p)
	case v.Kind() == reflect.Struct:
		d.structure(n, v, p)
	case v.Kind() == reflect.Map:
		d.mapping(n, v, p)
	case v.Kind() == reflect.Slice:
		d.sequence(n, v, p)
	case n.Kind != yaml.ScalarNode:
		d.fail(n, p.show, "expected a single value, got "+describe(n))
	default:
		if err := setScalar(v, n.Value); err != nil {
			d.fail(n, p.show, err.Error())
		}
	}
}

func (d *decoder) structure(n *yaml.Node, v reflect.Value, p fieldPath) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, p.show, "expected a mapping, got "+describe(n))
		return
	}
	byName := make(map[string]reflect.Value)
	for _, f := range fields(v) {
		byName[f.name] = f.v
	}
	// Merged mappings (<<: *defaults) first, so that the mapping's own keys win.
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].ShortTag() == "!!merge" {
			d.merge(n.Content[i+1], v, p)
		}
	}
	seen := make(map[string]bool)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		f, ok := byName[k.Value]
		switch {
		case k.ShortTag() == "!!merge":
		case !ok:
			d.fail(k, "", fmt.Sprintf("unknown field %q%s", k.Value, in(p)))
		case seen[k.Value]:
			d.fail(k, "", fmt.Sprintf("duplicate field %q%s", k.Value, in(p)))
		default:
			seen[k.Value] = true
			d.value(val, f, p.field(k.Value), k.Line)
		}
	}
}

func (d *decoder) merge(n *yaml.Node, v reflect.Value, p fieldPath) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.SequenceNode {
		d.structure(n, v, p)
		return
	}
	for _, m := range n.Content {
		d.merge(m, v, p)
	}
}

func in(p fieldPath) string {
	if p.show == "" {
		return ""
	}
	return " in " + p.show
}

func (d *decoder) mapping(n *yaml.Node, v reflect.Value, p fieldPath) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, p.show, "expected a mapping, got "+describe(n))
		return
	}
	m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		key := reflect.ValueOf(k.Value).Convert(v.Type().Key())
		if m.MapIndex(key).IsValid() {
			d.fail(k, p.show, fmt.Sprintf("duplicate key %q", k.Value))
			continue
		}
		e := reflect.New(v.Type().Elem()).Elem()
		d.value(val, e, p.field(k.Value), k.Line)
		m.SetMapIndex(key, e)
	}
	v.Set(m)
}

// sequence replaces a list. Elements whose type has a setDefaults method
// start from their defaults.
func (d *decoder) sequence(n *yaml.Node, v reflect.Value, p fieldPath) {
	if n.Kind != yaml.SequenceNode {
		d.fail(n, p.show, "expected a list, got "+describe(n))
		return
	}
	s := reflect.MakeSlice(v.Type(), 0, len(n.Content))
	for i, item := range n.Content {
		e := reflect.New(v.Type().Elem())
		if def, ok := e.Interface().(interface{ setDefaults() }); ok {
			def.setDefaults()
		}
		d.value(item, e.Elem(), p.index(i, nameOf(item)), item.Line)
		s = reflect.Append(s, e.Elem())
	}
	v.Set(s)
}

// nameOf returns the scalar under the key "name" of a mapping, to label list
// elements in errors.
func nameOf(n *yaml.Node) string {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	for i := 0; n.Kind == yaml.MappingNode && i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "name" && n.Content[i+1].Kind == yaml.ScalarNode {
			return n.Content[i+1].Value
		}
	}
	return ""
}

// object stores a YAML mapping as a JSON object.
func (d *decoder) object(n *yaml.Node, v reflect.Value, p fieldPath) {
	if n.Kind != yaml.MappingNode {
		d.fail(n, p.show, "must be a mapping (JSON object), got "+describe(n))
		return
	}
	x, err := plain(n)
	if err == nil {
		var b []byte
		if b, err = json.Marshal(x); err == nil {
			v.SetBytes(b)
			return
		}
	}
	d.fail(n, p.show, "cannot convert to JSON: "+err.Error())
}

// plain converts a node to the values json.Marshal takes; mapping keys
// become strings, as JSON requires.
func plain(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.AliasNode:
		return plain(n.Alias)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			v, err := plain(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			m[n.Content[i].Value] = v
		}
		return m, nil
	case yaml.SequenceNode:
		s := make([]any, len(n.Content))
		for i, item := range n.Content {
			v, err := plain(item)
			if err != nil {
				return nil, err
			}
			s[i] = v
		}
		return s, nil
	}
	var v any
	err := n.Decode(&v)
	return v, err
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

// setScalar parses s into v. File values and env variables share it, so
// both give the same errors. Strings never fail, so secrets are never quoted.
func setScalar(v reflect.Value, s string) error {
	if v.Kind() != reflect.String {
		s = strings.TrimSpace(s)
	}
	switch {
	case v.Type() == durationType:
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("invalid duration %q", s)
		}
		v.SetInt(int64(d))
	case v.Kind() == reflect.String:
		v.SetString(s)
	case v.Kind() == reflect.Int:
		n, err := strconv.ParseInt(s, 10, v.Type().Bits())
		if err != nil {
			return fmt.Errorf("invalid integer %q", s)
		}
		v.SetInt(n)
	case v.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("invalid boolean %q (want true or false)", s)
		}
		v.SetBool(b)
	default:
		panic("config: unsupported field type " + v.Type().String())
	}
	return nil
}

type field struct {
	name string
	v    reflect.Value
}

// fields lists the fields of struct v under their YAML keys, flattening
// ",inline" embeds and skipping "-".
func fields(v reflect.Value) []field {
	var out []field
	for i := range v.NumField() {
		sf := v.Type().Field(i)
		name, opts, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		switch {
		case !sf.IsExported() || name == "-":
		case opts == "inline":
			out = append(out, fields(v.Field(i))...)
		case name == "":
			out = append(out, field{strings.ToLower(sf.Name), v.Field(i)})
		default:
			out = append(out, field{name, v.Field(i)})
		}
	}
	return out
}
