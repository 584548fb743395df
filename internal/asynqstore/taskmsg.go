package asynqstore

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// TaskMsg holds the fields of asynq's TaskMessage (internal/proto in asynq
// v0.26) that a hand-off chain needs to run a task it claimed. asynq keeps
// the message protobuf-encoded in the task hash's "msg" field.
type TaskMsg struct {
	Type      string
	Payload   []byte
	ID        string
	Queue     string
	Retry     int   // max retries
	Retried   int   // failed runs so far
	Timeout   int64 // seconds, 0 none
	Deadline  int64 // Unix seconds, 0 none
	UniqueKey string
	GroupKey  string
	Retention int64             // seconds
	Headers   map[string]string // the trace context, when its enqueue was traced
}

// DecodeTaskMsg reads the fields above, skipping the rest. It collects the
// values by field number (the last one wins, as in protobuf) and builds the
// message from them at the end.
func DecodeTaskMsg(b []byte) (TaskMsg, error) {
	const fields = 15 // the highest field number read, and one
	var vs [fields]uint64
	var bs [fields][]byte
	var headers map[string]string
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return TaskMsg{}, fmt.Errorf("asynq task message: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var v uint64
		var s []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			s, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return TaskMsg{}, fmt.Errorf("asynq task message: field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
		switch {
		case num == headersField && typ == protowire.BytesType:
			k, v, err := decodeHeader(s)
			if err != nil {
				return TaskMsg{}, err
			}
			if headers == nil {
				headers = map[string]string{}
			}
			headers[k] = v
		case num >= fields:
		case typ == protowire.VarintType:
			vs[num] = v
		case typ == protowire.BytesType:
			bs[num] = s
		}
	}
	m := TaskMsg{
		Type: string(bs[1]), Payload: append([]byte(nil), bs[2]...), ID: string(bs[3]), Queue: string(bs[4]),
		UniqueKey: string(bs[10]), GroupKey: string(bs[14]),
		Retry: int(int32(vs[5])), Retried: int(int32(vs[6])),
		Timeout: int64(vs[8]), Deadline: int64(vs[9]), Retention: int64(vs[12]),
		Headers: headers,
	}
	if m.ID == "" || m.Type == "" {
		return m, fmt.Errorf("asynq task message without id or type")
	}
	return m, nil
}

// headersField is the field number of TaskMessage's map<string, string>
// headers: each entry is a message of key (1) and value (2).
const headersField = 15

func decodeHeader(b []byte) (k, v string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", "", fmt.Errorf("asynq task message: header: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
		} else {
			var s []byte
			s, n = protowire.ConsumeBytes(b)
			switch num {
			case 1:
				k = string(s)
			case 2:
				v = string(s)
			}
		}
		if n < 0 {
			return "", "", fmt.Errorf("asynq task message: header: %w", protowire.ParseError(n))
		}
		b = b[n:]
	}
	return k, v, nil
}
