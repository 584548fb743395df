package asynqstore

import (
	"reflect"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// DecodeTaskMsg reads asynq's fields by number and wire type, skips the
// others (whatever their type), and names the field a truncated message
// breaks in.
func TestDecodeTaskMsg(t *testing.T) {
	var b []byte
	str := func(num protowire.Number, s string) {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	varint := func(num protowire.Number, v uint64) {
		b = protowire.AppendTag(b, num, protowire.VarintType)
		b = protowire.AppendVarint(b, v)
	}
	str(1, "t:type")
	str(2, `{"a":1}`)
	str(3, "id-1")
	str(4, "q")
	varint(5, 3)
	varint(6, 1)
	str(7, "last error") // not read
	varint(8, 30)
	varint(9, 1700000000)
	str(10, "uniq")
	varint(11, 1699999999) // not read
	varint(12, 3600)
	str(14, "group")
	b = protowire.AppendTag(b, 20, protowire.Fixed32Type) // unknown, skipped
	b = protowire.AppendFixed32(b, 7)
	varint(1, 9) // a known number with another wire type: ignored

	m, err := DecodeTaskMsg(b)
	if err != nil {
		t.Fatal(err)
	}
	want := TaskMsg{Type: "t:type", Payload: []byte(`{"a":1}`), ID: "id-1", Queue: "q", Retry: 3, Retried: 1,
		Timeout: 30, Deadline: 1700000000, UniqueKey: "uniq", GroupKey: "group", Retention: 3600}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("decoded %+v, want %+v", m, want)
	}

	for _, c := range []struct {
		name string
		msg  []byte
		want string
	}{
		{"truncated varint", append(protowire.AppendTag(nil, 5, protowire.VarintType), 0x80), "field 5"},
		{"truncated bytes", append(protowire.AppendTag(nil, 3, protowire.BytesType), 9, 'x'), "field 3"},
		{"truncated unknown", append(protowire.AppendTag(nil, 20, protowire.Fixed32Type), 1), "field 20"},
		{"bad tag", []byte{0x80}, "asynq task message"},
		{"no id", protowire.AppendVarint(protowire.AppendTag(nil, 5, protowire.VarintType), 1), "without id or type"},
	} {
		if _, err := DecodeTaskMsg(c.msg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one naming %q", c.name, err, c.want)
		}
	}
}

// The headers of a task (its trace context) are read from the message as
// asynq v0.26 stores it, so that a handed-on run joins its task's trace.
func TestDecodeTaskMsgHeadersAsAsynqStoresThem(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	enq := asynq.NewClientFromRedisClient(srv.Client())
	t.Cleanup(func() { _ = enq.Close() })
	want := map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "k=v"}
	if _, err := enq.Enqueue(asynq.NewTaskWithHeaders("t:h", []byte("p"), want), asynq.TaskID("h1")); err != nil {
		t.Fatal(err)
	}
	raw, err := srv.Client().HGet(t.Context(), queuePrefix("default")+"t:h1", "msg").Bytes()
	if err != nil {
		t.Fatal(err)
	}
	m, err := DecodeTaskMsg(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m.Headers, want) || m.ID != "h1" || m.Type != "t:h" {
		t.Errorf("decoded id %q type %q headers %v, want h1, t:h and %v", m.ID, m.Type, m.Headers, want)
	}
}
