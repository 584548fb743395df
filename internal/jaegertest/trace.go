package jaegertest

import (
	"encoding/json"
	"fmt"
	"slices"
)

// Trace is one trace as the query API shows it: its spans, and the
// processes (services) that sent them.
type Trace struct {
	TraceID   string             `json:"traceID"`
	Spans     []Span             `json:"spans"`
	Processes map[string]Process `json:"processes"`
}

// Process is a service that sent spans of a trace.
type Process struct {
	ServiceName string     `json:"serviceName"`
	Tags        []KeyValue `json:"tags"`
}

// Span is one span. Its attributes are Tags (span.kind among them), its
// events are Logs, its parent is its CHILD_OF reference and its links are
// its FOLLOWS_FROM references.
type Span struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []Reference `json:"references"`
	StartTime     int64       `json:"startTime"` // Unix µs
	Duration      int64       `json:"duration"`  // µs
	Tags          []KeyValue  `json:"tags"`
	Logs          []Log       `json:"logs"`
	ProcessID     string      `json:"processID"`
}

// Reference names another span: the parent (RefType CHILD_OF) or a link
// (FOLLOWS_FROM).
type Reference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

// KeyValue is an attribute; Value is a string, a json.Number or a bool.
type KeyValue struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

// Log is a span event; its name is the field "event".
type Log struct {
	Timestamp int64      `json:"timestamp"` // Unix µs
	Fields    []KeyValue `json:"fields"`
}

func valueOf(kvs []KeyValue, key string) (string, bool) {
	for _, kv := range kvs {
		if kv.Key == key {
			switch v := kv.Value.(type) {
			case string:
				return v, true
			case json.Number:
				return v.String(), true
			default:
				return fmt.Sprint(v), true
			}
		}
	}
	return "", false
}

// Tag is the text of the span's attribute key ("" when it has none).
func (s Span) Tag(key string) string { v, _ := valueOf(s.Tags, key); return v }

// Parent is the span id of the span's parent ("" for a root).
func (s Span) Parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// Links are the span's links.
func (s Span) Links() []Reference {
	var out []Reference
	for _, r := range s.References {
		if r.RefType == "FOLLOWS_FROM" {
			out = append(out, r)
		}
	}
	return out
}

// Event returns the first event of the span named name.
func (s Span) Event(name string) (Log, bool) {
	i := slices.IndexFunc(s.Logs, func(l Log) bool { v, _ := valueOf(l.Fields, "event"); return v == name })
	if i < 0 {
		return Log{}, false
	}
	return s.Logs[i], true
}

// Field is the text of the event's attribute key ("" when it has none).
func (l Log) Field(key string) string { v, _ := valueOf(l.Fields, key); return v }

// Service is the name of the service that sent s.
func (t Trace) Service(s Span) string { return t.Processes[s.ProcessID].ServiceName }

// Find returns the spans of the trace named name for which every keep
// holds, in the answer's order.
func (t Trace) Find(name string, keep ...func(Span) bool) []Span {
	var out []Span
next:
	for _, s := range t.Spans {
		if s.OperationName != name {
			continue
		}
		for _, k := range keep {
			if !k(s) {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// Span returns the span of the trace with id.
func (t Trace) Span(id string) (Span, bool) {
	i := slices.IndexFunc(t.Spans, func(s Span) bool { return s.SpanID == id })
	if i < 0 {
		return Span{}, false
	}
	return t.Spans[i], true
}

// With keeps spans whose attribute key has the text value.
func With(key, value string) func(Span) bool {
	return func(s Span) bool { return s.Tag(key) == value }
}

// ChildOf keeps the children of parent.
func ChildOf(parent Span) func(Span) bool {
	return func(s Span) bool { return s.Parent() == parent.SpanID }
}
