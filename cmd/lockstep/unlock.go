package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
	"golang.org/x/term"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

const unlockAbout = `Breaks the lock on RESOURCE by deleting its key. The holder's watchdog notices at once
and cancels its handler (reason expired); the next holder gets a higher fence, so a
store that checks fences refuses the old holder's late writes. Asks for confirmation
on a terminal; elsewhere --yes is required. Exit 1 when the lock is not held.
For a resource with a limit, --permit K breaks permit K alone (0 to limit-1, as
lockstep locks shows them; default 0). A permit out of range exits 2.`

func cmdUnlock(ctx context.Context, a *app, args []string) int {
	fs := a.flags("unlock", "unlock RESOURCE [--permit K] --force [--yes]", unlockAbout)
	force := fs.Bool("force", false, "required: breaking a lock is never the default")
	permit := fs.Int("permit", 0, "the permit to break, of a resource with a limit (0 to limit-1)")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	pos, code, done := parseN(a, fs, args, 1, "one RESOURCE")
	if done {
		return code
	}
	if !*force {
		return usageError(a, fs, "refusing to break a lock without --force")
	}
	if redlock(a) {
		fmt.Fprintln(a.stderr, "lockstep unlock:", errRedlock)
		return exitUsage
	}
	resource := pos[0]
	if *permit < 0 {
		return usageError(a, fs, "--permit %d is out of range: permits are numbered from 0", *permit)
	}
	what, key, fenceKey := resource, a.keys().Key(resource), a.keys().FenceKey(resource)
	if *permit > 0 {
		h, err := a.client.HGet(ctx, a.keys().LimitKey(resource), "h").Int()
		switch {
		case err != nil && !errors.Is(err, redis.Nil):
			fmt.Fprintln(a.stderr, "lockstep unlock: redis:", err)
			return exitUsage
		case *permit >= max(h, 1):
			return usageError(a, fs, "--permit %d is out of range: %s has permits 0 to %d", *permit, resource, max(h, 1)-1)
		}
		what = fmt.Sprintf("permit %d of %s", *permit, resource)
		key, fenceKey = a.keys().PermitKey(resource, *permit), a.keys().PermitFenceKey(resource, *permit)
	}
	val, err := a.client.Get(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil):
		fmt.Fprintf(a.stderr, "lockstep unlock: %s is not locked (no key %s)\n", what, key)
		return exitNotFound
	case err != nil:
		fmt.Fprintln(a.stderr, "lockstep unlock: redis:", err)
		return exitUsage
	}
	fence, _ := a.client.Get(ctx, fenceKey).Int64()
	who := describeHolder(val, fence)
	if !*yes {
		if !isTerminal(a.stdin) {
			return usageError(a, fs, "not a terminal: pass --yes to break the lock on %s (%s)", what, who)
		}
		fmt.Fprintf(a.stderr, "Break the lock on %s (%s)? The holder's handler is cancelled. [y/N] ", what, who)
		answer, _ := bufio.NewReader(a.stdin).ReadString('\n')
		if s := strings.ToLower(strings.TrimSpace(answer)); s != "y" && s != "yes" {
			fmt.Fprintln(a.stderr, "not unlocked")
			return exitNotFound
		}
	}
	deleted, err := deleteIfHeldBy(ctx, a.client, key, val)
	switch {
	case err != nil:
		fmt.Fprintln(a.stderr, "lockstep unlock: redis:", err)
		return exitUsage
	case !deleted:
		fmt.Fprintf(a.stderr, "lockstep unlock: %s changed hands meanwhile; nothing deleted (run lockstep locks)\n", what)
		return exitNotFound
	}
	fmt.Fprintf(a.stdout, "unlocked %s: deleted %s (%s); its watchdog cancels the holder, the next holder gets a fence above %d\n",
		what, key, who, fence)
	return exitOK
}

// describeHolder says who holds a lock, from its value.
func describeHolder(val string, fence int64) string {
	info := lock.ParseToken(val)
	parts := []string{"holder " + orDash(info.Holder)}
	if info.TaskID != "" {
		parts = append(parts, "task "+info.TaskID, "type "+info.Type)
	}
	return strings.Join(append(parts, fmt.Sprintf("fence %d", fence)), ", ")
}

// deleteIfHeldBy deletes key if it still holds val, so that a lock that
// passed to another holder since it was shown is left alone.
func deleteIfHeldBy(ctx context.Context, c redis.UniversalClient, key, val string) (bool, error) {
	deleted := false
	err := c.Watch(ctx, func(tx *redis.Tx) error {
		cur, err := tx.Get(ctx, key).Result()
		if errors.Is(err, redis.Nil) || (err == nil && cur != val) {
			return nil
		}
		if err != nil {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, key)
			return nil
		})
		deleted = err == nil
		return err
	}, key)
	if errors.Is(err, redis.TxFailedErr) { // changed between GET and EXEC
		return false, nil
	}
	return deleted, err
}

func isTerminal(r any) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
