package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"

	"golang.org/x/term"

	"github.com/lockstep-dev/lockstep/internal/lock"
)

const unlockAbout = `Breaks the lock on RESOURCE: ends its hold as a release would and hands it to the first
waiter, a WithLock caller or a parked task, in the same step (without one the key goes;
on every Redlock node that holds it; on etcd, the key and its lease's hold count go and
the first waiter takes it). The holder's watchdog notices (at once on Redis and etcd, at
its next renewal on Redlock) and cancels its handler; the next holder gets a higher fence,
so a store that checks fences refuses the old holder's late writes. Asks for confirmation
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
	resource := pos[0]
	if *permit < 0 {
		return usageError(a, fs, "--permit %d is out of range: permits are numbered from 0", *permit)
	}
	what, key := resource, a.locker.Key(resource)
	if *permit > 0 {
		limit, err := a.locker.Limit(ctx, resource)
		switch {
		case err != nil:
			fmt.Fprintln(a.stderr, "lockstep unlock:", err)
			return exitUsage
		case *permit >= limit:
			return usageError(a, fs, "--permit %d is out of range: %s has permits 0 to %d", *permit, resource, limit-1)
		}
		what, key = fmt.Sprintf("permit %d of %s", *permit, resource), a.locker.PermitKey(resource, *permit)
	}
	h, err := a.locker.HeldPermit(ctx, resource, *permit)
	switch {
	case err != nil:
		fmt.Fprintln(a.stderr, "lockstep unlock:", err)
		return exitUsage
	case h == nil:
		fmt.Fprintf(a.stderr, "lockstep unlock: %s is not locked (no key %s)\n", what, key)
		return exitNotFound
	}
	who := describeHolder(*h)
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
	broken, err := a.locker.Break(ctx, *h)
	switch {
	case err != nil:
		fmt.Fprintln(a.stderr, "lockstep unlock:", err)
		return exitUsage
	case !broken:
		fmt.Fprintf(a.stderr, "lockstep unlock: %s changed hands meanwhile; nothing deleted (run lockstep locks)\n", what)
		return exitNotFound
	}
	fmt.Fprintf(a.stdout, "unlocked %s: ended the hold of %s (%s); its watchdog cancels the holder, the next holder (the first waiter, if any) gets a fence above %d\n",
		what, key, who, h.Fence)
	return exitOK
}

// describeHolder says who holds a lock, from its token, and where.
func describeHolder(h lock.Held) string {
	info := lock.ParseToken(h.Token)
	parts := []string{"holder " + orDash(info.Holder)}
	if info.TaskID != "" {
		parts = append(parts, "task "+info.TaskID, "type "+info.Type)
	}
	parts = append(parts, fmt.Sprintf("fence %d", h.Fence))
	if len(h.Nodes) > 0 {
		parts = append(parts, "on "+strings.Join(h.Nodes, " "))
	}
	return strings.Join(parts, ", ")
}

func isTerminal(r any) bool {
	f, ok := r.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
