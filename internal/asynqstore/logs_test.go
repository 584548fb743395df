package asynqstore

import (
	"fmt"
	"testing"
)

// The message is read as asynq v0.26.0's processor writes it (markAsComplete,
// its format string copied here); its other "Could not" messages are not
// taken for it.
func TestCompletionNotRecorded(t *testing.T) {
	p := queuePrefix("default")
	complete := fmt.Sprintf("Could not move task id=%s type=%q from %q to %q:  %+v",
		"t-1", "demo:order.pay", p+"active", p+"completed", "INTERNAL_ERROR: redis eval error: LOADING")
	if id, ok := CompletionNotRecorded(complete + "; Will retry syncing"); !ok || id != "t-1" {
		t.Errorf("%q: %q %v, want t-1", complete, id, ok)
	}
	for _, msg := range []string{
		fmt.Sprintf("Could not remove task id=%s type=%q from %q err: %+v", "t-1", "x", p+"active", "err"),
		fmt.Sprintf("Could not move task id=%s from %q to %q", "t-1", p+"active", p+"retry"),
		fmt.Sprintf("Could not move task id=%s from %q to %q", "t-1", p+"active", p+"archived"),
		"Could not move task id= type=\"x\" from \"a\" to \"b:completed\"",
		"something else",
	} {
		if id, ok := CompletionNotRecorded(msg); ok {
			t.Errorf("%q taken for a completion not recorded, of %q", msg, id)
		}
	}
}
