package lock_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

func TestTokenCarriesHolder(t *testing.T) {
	t.Parallel()
	l, c, _ := newLocker(t)
	ctx := lock.WithJob(context.Background(), "task|1 x", "demo:order.pay")
	before := time.Now().Truncate(time.Millisecond)
	a := mustAcquire(t, ctx, l, "r", time.Minute)
	stored := c.Get(ctx, "lockstep:{r}").Val()
	info := lock.ParseToken(stored)
	host, _ := os.Hostname()
	want := host + ":" + strconv.Itoa(os.Getpid())
	if info.Holder != want || info.TaskID != "task|1 x" || info.Type != "demo:order.pay" {
		t.Fatalf("ParseToken(%q) = %+v, want holder %q, task %q, type demo:order.pay", stored, info, want, "task|1 x")
	}
	if info.Acquired.Before(before) || info.Acquired.After(time.Now()) {
		t.Fatalf("acquired %v, want between %v and now", info.Acquired, before)
	}
	// The suffix is part of the token: renew and release compare it whole.
	if err := a.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, "lockstep:{r}").Val(); n != 0 {
		t.Fatal("lock key still there after release")
	}

	if got := lock.ParseToken("0123abcd"); got != (lock.TokenInfo{}) {
		t.Fatalf("ParseToken of a bare token = %+v, want zero", got)
	}
	plain := mustAcquire(t, context.Background(), l, "p", time.Minute)
	if got := lock.ParseToken(plain.Token()); got.Holder != want || got.TaskID != "" || got.Type != "" {
		t.Fatalf("plain acquire: %+v, want holder only", got)
	}
}
