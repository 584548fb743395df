package lock

import (
	"context"
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
	var h [2 * tokenBytes]byte
	b.Write(appendRandomHex(h[:0]))
	b.WriteByte('|')
	var ms [20]byte
	b.Write(strconv.AppendInt(ms[:0], now.UnixMilli(), 10))
	b.WriteByte('|')
	b.WriteString(processID)
	b.WriteByte('|')
	if j != (jobInfo{}) {
		b.WriteString(url.QueryEscape(j.taskID))
		b.WriteByte('|')
		b.WriteString(url.QueryEscape(j.taskType))
	} else {
		b.WriteByte('|')
	}
	return b.String()
}

// TokenInfo is what a lock's stored value says about its holder.
type TokenInfo struct {
	Acquired time.Time // zero when the token does not say
	Holder   string    // host:pid of the holding process
	TaskID   string    // the asynq task id, when a job holds the lock
	Type     string    // the task type, when a job holds the lock
}

// ParseToken reads the holder information from a lock's stored value. A value
// without it (another writer, an older version) gives a zero TokenInfo.
func ParseToken(v string) TokenInfo {
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
