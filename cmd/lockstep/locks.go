package main

import (
	"context"
	"fmt"
	"time"
)

const locksAbout = `Lists every held lock, longest held first: the resource, the holding process (host:pid),
the job's task id and type when a job holds it, the fence, the TTL left, how long it
has been held, how many tasks wait for it and, for a hold with StallAfter, how long ago
its holder last reported progress. A resource with a limit (Limit(n)) has
one line per held permit, shown as RESOURCE[k/n]. Exit 1 when no lock is held.

Reads the locks where lock.backend keeps them: Redis, every Redlock node (a lock shows
where a majority holds one token) or etcd.

JSON: an array of objects with resource, limit (1 for a lock), permit (0 to
limit-1; one object per held permit), holder, task_id, type, fence (the
permit's), ttl_ms, held_ms (null when the lock's value does not say), progress_ms
(since the holder's last progress as of its last renewal; null without StallAfter), waiters
(the resource's), backend (redis, redlock or etcd) and, on redlock, nodes (those
that hold it).`

func cmdLocks(ctx context.Context, a *app, args []string) int {
	fs := a.flags("locks", "locks [--prefix P] [--json]", locksAbout)
	asJSON := fs.Bool("json", false, "print JSON for scripts")
	if _, code, done := parseN(a, fs, args, 0, ""); done {
		return code
	}
	locks, err := listLocks(ctx, a)
	if err != nil {
		fmt.Fprintln(a.stderr, "lockstep locks:", err)
		return exitUsage
	}
	return printList(a, *asJSON, locks, "no lock is held", "RESOURCE\tHOLDER\tTASK\tTYPE\tFENCE\tTTL\tHELD\tWAITERS\tPROGRESS",
		func(l lockView) string {
			held, progress := "-", "-"
			if l.HeldMs != nil {
				held = ms(*l.HeldMs)
			}
			if l.ProgressMs != nil {
				progress = ms(*l.ProgressMs) + " ago"
			}
			ttl := "none"
			if l.TTLMs >= 0 {
				ttl = ms(l.TTLMs)
			}
			name := l.Resource
			if l.Limit > 1 {
				name = fmt.Sprintf("%s[%d/%d]", l.Resource, l.Permit, l.Limit)
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s", name, orDash(l.Holder), orDash(l.TaskID),
				orDash(l.Type), l.Fence, ttl, held, l.Waiters, progress)
		})
}

// ms shows milliseconds as a short duration: 850ms, 12.3s, 4m10s.
func ms(n int64) string {
	d := time.Duration(n) * time.Millisecond
	switch {
	case d < time.Second:
		return d.String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

const ratesAbout = `Lists every live rate key (HandlerOf.Rate, RateBy, Locker.Allow), the soonest to
allow one first: its interval (Per/N of the limit it was last counted under), the burst
it allows at once now out of its burst, and when it allows the next one (on Redis's
clock). Exit 1 when no rate key is live.

Rate keys live in the queue's Redis whatever lock.backend says.

JSON: an array of objects with key, interval_us, burst, burst_left, next_ms (Unix ms),
wait_ms (0: it allows one now) and backend.`

func cmdRates(ctx context.Context, a *app, args []string) int {
	fs := a.flags("rates", "rates [--prefix P] [--json]", ratesAbout)
	asJSON := fs.Bool("json", false, "print JSON for scripts")
	if _, code, done := parseN(a, fs, args, 0, ""); done {
		return code
	}
	rates, err := listRates(ctx, a)
	if err != nil {
		fmt.Fprintln(a.stderr, "lockstep rates:", err)
		return exitUsage
	}
	return printList(a, *asJSON, rates, "no rate key is live", "RATE KEY\tINTERVAL\tBURST LEFT\tNEXT", func(r rateView) string {
		next := "now"
		if r.WaitMs > 0 {
			next = "in " + ms(r.WaitMs)
		}
		return fmt.Sprintf("%s\t%v\t%d/%d\t%s", r.Key, time.Duration(r.IntervalUs)*time.Microsecond, r.BurstLeft, r.Burst, next)
	})
}

const fairAbout = `Lists each tenant that has tasks waiting for their turn in a fair share
(HandlerOf.FairBy, FairByWeighted), by queue, task type and tenant: its weight, its
backlog (tasks waiting for their turn) and its share of the starts while these wait
(its weight over the weights of the tenants waiting). Exit 1 when no tenant waits.

Fair shares live in the queue's Redis whatever lock.backend says.

JSON: an array of objects with queue, type, tenant, weight, backlog, share (0 to 1),
started (the type's tasks started and not yet ended in that queue) and backend.`

func cmdFair(ctx context.Context, a *app, args []string) int {
	fs := a.flags("fair", "fair [--prefix P] [--json]", fairAbout)
	asJSON := fs.Bool("json", false, "print JSON for scripts")
	if _, code, done := parseN(a, fs, args, 0, ""); done {
		return code
	}
	tenants, err := listFair(ctx, a)
	if err != nil {
		fmt.Fprintln(a.stderr, "lockstep fair:", err)
		return exitUsage
	}
	return printList(a, *asJSON, tenants, "no tenant waits for a fair share", "QUEUE\tTYPE\tTENANT\tWEIGHT\tBACKLOG\tSHARE", func(f fairView) string {
		return fmt.Sprintf("%s\t%s\t%s\t%d\t%d\t%.1f%%", f.Queue, f.Type, f.Tenant, f.Weight, f.Backlog, 100*f.Share)
	})
}
