package jobs

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
)

// taskMsg holds the fields of asynq's TaskMessage (internal/proto in asynq
// v0.26) that a hand-off chain needs to run a task it claimed. asynq keeps
// the message protobuf-encoded in the task hash's "msg" field.
type taskMsg struct {
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
	Retention int64 // seconds
}

// decodeTaskMsg reads the fields above, skipping the rest.
func decodeTaskMsg(b []byte) (taskMsg, error) {
	var m taskMsg
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return m, fmt.Errorf("asynq task message: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var v uint64
		var bs []byte
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		case protowire.BytesType:
			bs, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return m, fmt.Errorf("asynq task message: field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
		if typ == protowire.VarintType {
			switch num {
			case 5:
				m.Retry = int(int32(v))
			case 6:
				m.Retried = int(int32(v))
			case 8:
				m.Timeout = int64(v)
			case 9:
				m.Deadline = int64(v)
			case 12:
				m.Retention = int64(v)
			}
		}
		if typ == protowire.BytesType {
			switch num {
			case 1:
				m.Type = string(bs)
			case 2:
				m.Payload = append([]byte(nil), bs...)
			case 3:
				m.ID = string(bs)
			case 4:
				m.Queue = string(bs)
			case 10:
				m.UniqueKey = string(bs)
			case 14:
				m.GroupKey = string(bs)
			}
		}
	}
	if m.ID == "" || m.Type == "" {
		return m, fmt.Errorf("asynq task message without id or type")
	}
	return m, nil
}
