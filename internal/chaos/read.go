package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/asynqstore"
)

// readStream reads a whole stream in pages, and reports whether it is
// complete: nothing was ever trimmed from it.
func readStream(ctx context.Context, c redis.UniversalClient, key string) (out []map[string]string, complete bool, err error) {
	info, err := c.XInfoStream(ctx, key).Result()
	if err != nil {
		if err == redis.Nil || isNoSuchKey(err) {
			return nil, true, nil
		}
		return nil, false, err
	}
	start := "-"
	for range 10_000 { // pages of 1000: bounded well above any run
		msgs, err := c.XRangeN(ctx, key, start, "+", 1000).Result()
		if err != nil {
			return out, false, err
		}
		for _, m := range msgs {
			fields := make(map[string]string, len(m.Values))
			for k, v := range m.Values {
				fields[k], _ = v.(string)
			}
			out = append(out, fields)
		}
		if len(msgs) < 1000 {
			break
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
	return out, info.EntriesAdded == int64(len(out)), nil
}

func isNoSuchKey(err error) bool { return err != nil && err.Error() == "ERR no such key" }

// readReplicaLog adds the tick lines of a scheduler replica's log file to h.
func readReplicaLog(path string, h *History) error { return readLog(path, h, ReadReplicaLog) }

// readLog reads the log file at path into h with read.
func readLog(path string, h *History, read func(io.Reader, *History) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return read(f, h)
}

// ReadReplicaLog adds a scheduler replica's "tick claimed", "tick
// enqueued" and "tick skipped" log lines (JSON, at level debug) to h's
// Claims, Enqueues and Skips.
func ReadReplicaLog(r io.Reader, h *History) error {
	return eachLine(r, func(line []byte) {
		var rec struct {
			Time     time.Time `json:"time"`
			Msg      string    `json:"msg"`
			Replica  string    `json:"replica"`
			Schedule string    `json:"schedule"`
			Tick     int64     `json:"tick"`
			Kind     string    `json:"kind"`
			Result   string    `json:"result"`
		}
		if json.Unmarshal(line, &rec) != nil {
			return // a line cut by SIGKILL, or not JSON
		}
		e := TickEvent{Replica: rec.Replica, Schedule: rec.Schedule, Tick: rec.Tick, Kind: rec.Kind, Result: rec.Result, At: rec.Time}
		switch rec.Msg {
		case "tick claimed":
			h.Claims = append(h.Claims, e)
		case "tick enqueued":
			h.Enqueues = append(h.Enqueues, e)
		case "tick skipped":
			h.Skips = append(h.Skips, e)
		}
	})
}

// ReadWorkerLog adds to h.CompletionsNotRecorded the tasks whose completion
// asynq logged it could not record, from a worker's log (JSON lines; the
// message as asynqstore.CompletionNotRecorded reads it), and to
// h.Recoveries the tasks it brought back from a worker it judged dead.
func ReadWorkerLog(r io.Reader, h *History) error {
	return eachLine(r, func(line []byte) {
		var rec struct {
			Time   time.Time `json:"time"`
			Msg    string    `json:"msg"`
			ID     string    `json:"id"`
			Worker string    `json:"worker"`
		}
		if json.Unmarshal(line, &rec) != nil {
			return
		}
		if strings.HasPrefix(rec.Msg, "dead worker's task recovered") {
			h.Recoveries = append(h.Recoveries, Recovery{At: rec.Time, TaskID: rec.ID, Dead: rec.Worker})
			return
		}
		id, ok := asynqstore.CompletionNotRecorded(rec.Msg)
		if !ok {
			return
		}
		if h.CompletionsNotRecorded == nil {
			h.CompletionsNotRecorded = map[string][]time.Time{}
		}
		h.CompletionsNotRecorded[id] = append(h.CompletionsNotRecorded[id], rec.Time)
	})
}

// eachLine calls f with each line of r (log lines of up to 1 MiB).
func eachLine(r io.Reader, f func(line []byte)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f(sc.Bytes())
	}
	return sc.Err()
}

func atoi(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

func msTime(s string) time.Time { return time.UnixMilli(atoi(s)) }
