package lock

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/lockstep-dev/lockstep/internal/procid"
)

// A lock's stored value is its token: 128 random bits in hex, then, after
// '|', what an operator needs to know about the hold without another round
// trip per acquire: the acquire time (Unix ms, the holder's clock), the
// holding process (host:pid), and the job's task id and type when a job holds
// it, each query-escaped:
//
//	<hex>|<acquired ms>|<holder>|<task id>|<type>
//
// The scripts compare the value as a whole, so the suffix changes nothing in
// how a lease is renewed or released; ParseToken reads it back.

type jobKey struct{}

type jobInfo struct{ taskID, taskType string }

// WithJob returns a context whose acquires record that the job with taskID
// and taskType holds the lock (see ParseToken).
func WithJob(ctx context.Context, taskID, taskType string) context.Context {
	return context.WithValue(ctx, jobKey{}, jobInfo{taskID, taskType})
}

// processID names this process in the tokens it writes (query-escaped once).
var processID = url.QueryEscape(procid.Self())

// tokenFor returns a fresh token for an acquire at now by ctx's job, if any.
// It is built in one buffer: one allocation for a lease without a job.
func tokenFor(ctx context.Context, now time.Time) string {
	j, _ := ctx.Value(jobKey{}).(jobInfo)
	var b strings.Builder
	b.Grow(2*tokenBytes + 2 + 13 + len(processID) + 2)
	writeTokenStart(&b, now)
	if j != (jobInfo{}) {
		b.WriteString(url.QueryEscape(j.taskID))
		b.WriteByte('|')
		b.WriteString(url.QueryEscape(j.taskType))
	} else {
		b.WriteByte('|')
	}
	return b.String()
}

// writeTokenStart writes a token up to its task's fields:
// "<hex>|<acquired ms>|<holder>|".
func writeTokenStart(b *strings.Builder, now time.Time) {
	var h [2 * tokenBytes]byte
	b.Write(appendRandomHex(h[:0]))
	b.WriteByte('|')
	var ms [20]byte
	b.Write(strconv.AppendInt(ms[:0], now.UnixMilli(), 10))
	b.WriteByte('|')
	b.WriteString(processID)
	b.WriteByte('|')
}

// chainStart returns the start of the token of a task that a release hands
// on to the caller (a chain, Locker.HandOn), up to the task's fields:
// handon.lua completes it for the task it picks (lua/lib.lua's chaintoken).
func chainStart(now time.Time) string {
	var b strings.Builder
	writeTokenStart(&b, now)
	return b.String()
}

// chainToken is the token handon.lua wrote for task id from start
// (chainStart): the id escaped byte by byte (every byte but A-Z a-z 0-9 -
// . _ ~ as %XX, which ParseToken's unescape reads back), and no type.
func chainToken(start, id string) string {
	var b strings.Builder
	b.Grow(len(start) + 3*len(id) + 1)
	b.WriteString(start)
	for i := 0; i < len(id); i++ {
		c := id[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	b.WriteByte('|')
	return b.String()
}

// TokenInfo is what a lock's stored value says about its holder.
type TokenInfo struct {
	Acquired time.Time // zero when the token does not say
	Holder   string    // host:pid of the holding process
	TaskID   string    // the asynq task id, when a job holds the lock
	Type     string    // the task type, when a job holds the lock
	Granted  bool      // granted to the parked task TaskID, on its way to a worker
}

// ParseToken reads the holder information from a lock's stored value. A value
// without it (another writer, an older version) gives a zero TokenInfo. A
// lock granted to a parked task ("g:<task waiter>:<fence>[/...]", lua/lib.lua)
// names that task, Granted, and no holder: no process holds it until the
// task's worker takes it over. The task that a chain runs has no type in
// its token (chainToken).
func ParseToken(v string) TokenInfo {
	if g, ok := strings.CutPrefix(v, "g:"); ok {
		if i := strings.LastIndexByte(g, ':'); i > 0 {
			if _, id, ok := ParseTaskWaiter(g[:i]); ok {
				return TokenInfo{TaskID: id, Granted: true}
			}
		}
		return TokenInfo{}
	}
	parts := strings.Split(v, "|")
	if len(parts) != 5 {
		return TokenInfo{}
	}
	var info TokenInfo
	if ms, err := strconv.ParseInt(parts[1], 10, 64); err == nil && ms > 0 {
		info.Acquired = time.UnixMilli(ms)
	}
	info.Holder, _ = url.QueryUnescape(parts[2])
	info.TaskID, _ = url.QueryUnescape(parts[3])
	info.Type, _ = url.QueryUnescape(parts[4])
	return info
}
