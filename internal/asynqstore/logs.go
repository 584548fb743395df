package asynqstore

import "strings"

// CompletionNotRecorded returns the task id of a log message of asynq's
// server that says it could not record a task's completion (Redis down or
// loading when the handler returned; asynq then delivers the task again),
// and whether msg is one. asynq v0.26.0's processor writes it for a task
// with a retention as
//
//	Could not move task id=<id> type="<type>" from "asynq:{<queue>}:active" to "asynq:{<queue>}:completed":  <error>
func CompletionNotRecorded(msg string) (id string, ok bool) {
	const lead = "Could not move task id="
	rest, ok := strings.CutPrefix(msg, lead)
	if !ok || !strings.Contains(rest, `:completed"`) {
		return "", false
	}
	id, _, ok = strings.Cut(rest, " ")
	return id, ok && id != ""
}
