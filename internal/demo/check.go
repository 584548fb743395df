package demo

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
)

// The history checks below are the one definition of what the demo's
// records must show, used by the tests, `make run`'s summary and the chaos
// checker alike.

// Overlaps checks, per order, that no two executions overlap in time and that
// fences strictly increase in start order (G3, G5). Only executions that
// worked under a healthy lock should be passed when faults were injected
// (e.g. those with outcome ok); it returns one error per violation.
func Overlaps(execs []Execution) []error {
	var errs []error
	for order, xs := range ByOrder(execs) {
		var last Execution // the execution that finished last so far
		for i, cur := range xs {
			if i > 0 {
				if cur.StartedMS < last.FinishedMS {
					errs = append(errs, fmt.Errorf("order %s: execution fence %d (%s, task %s, %d..%d) overlaps fence %d (%s, task %s, %d..%d)",
						order, cur.Fence, cur.Worker, cur.TaskID, cur.StartedMS, cur.FinishedMS,
						last.Fence, last.Worker, last.TaskID, last.StartedMS, last.FinishedMS))
				}
				if prev := xs[i-1]; cur.Fence <= prev.Fence {
					errs = append(errs, fmt.Errorf("order %s: fence %d started after fence %d", order, cur.Fence, prev.Fence))
				}
			}
			if i == 0 || cur.FinishedMS > last.FinishedMS {
				last = cur
			}
		}
	}
	return errs
}

// ByOrder groups executions by order, each group in start order (then fence).
// A tenant's executions (no order; see PermitOverlaps) are left out.
func ByOrder(execs []Execution) map[string][]Execution {
	by := map[string][]Execution{}
	for _, x := range execs {
		if x.OrderID != "" {
			by[x.OrderID] = append(by[x.OrderID], x)
		}
	}
	for _, xs := range by {
		slices.SortFunc(xs, func(a, b Execution) int {
			return cmp.Or(cmp.Compare(a.StartedMS, b.StartedMS), cmp.Compare(a.Fence, b.Fence))
		})
	}
	return by
}

// StaleWrites replays the accepted-writes log, in the store's own order, and
// returns one error per commit accepted with a fence below one that had
// already begun on the same order: a stale holder's write that the store
// should have refused.
func StaleWrites(writes []Write) []error {
	var errs []error
	highest := map[string]Write{} // order -> highest begin so far
	for _, w := range writes {
		h, seen := highest[w.OrderID]
		switch w.Op {
		case "begin":
			if !seen || w.Fence > h.Fence {
				highest[w.OrderID] = w
			}
		case "commit":
			if seen && w.Fence < h.Fence {
				errs = append(errs, fmt.Errorf("order %s: commit with fence %d (task %s, %s) accepted after fence %d began (task %s, %s)",
					w.OrderID, w.Fence, w.TaskID, w.Worker, h.Fence, h.TaskID, h.Worker))
			}
		}
	}
	return errs
}

// CompletedTwice returns the task ids with more than one ok run, and how
// many each had. A run is one acquire, one fence: records of a task that
// repeat a fence are one run recorded twice (a retried XADD), not two.
func CompletedTwice(execs []Execution) map[string]int {
	n := map[string]int{}
	seen := map[string]bool{}
	for _, x := range execs {
		if k := x.TaskID + "\x00" + strconv.FormatInt(x.Fence, 10); x.Outcome == OutcomeOK && !seen[k] {
			seen[k] = true
			n[x.TaskID]++
		}
	}
	for id, c := range n {
		if c < 2 {
			delete(n, id)
		}
	}
	return n
}

// PermitOverlaps checks demo:tenant.sync's executions: per tenant, at most
// limit at any instant; per (tenant, permit), no two at once and fences
// strictly increasing in start order. As for Overlaps, pass only the
// executions that worked under a healthy lock when faults were injected.
func PermitOverlaps(execs []Execution, limit int) []error {
	bySlot := map[string][]Execution{}
	byTenant := map[string][]Execution{}
	for _, x := range execs {
		if x.TenantID == "" {
			continue // an order's
		}
		s := x
		s.OrderID = TenantSlot(x.TenantID, x.Permit) // Overlaps' key: the (tenant, permit)
		bySlot[x.TenantID] = append(bySlot[x.TenantID], s)
		byTenant[x.TenantID] = append(byTenant[x.TenantID], x)
	}
	var errs []error
	for _, xs := range bySlot {
		errs = append(errs, Overlaps(xs)...)
	}
	for tenant, xs := range byTenant {
		type edge struct {
			at    int64
			delta int
		}
		var edges []edge
		for _, x := range xs {
			edges = append(edges, edge{x.StartedMS, 1}, edge{x.FinishedMS, -1})
		}
		// Ends before starts at one instant: a hand-off's next run may start
		// in the millisecond its predecessor ended.
		slices.SortFunc(edges, func(a, b edge) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta)) })
		n := 0
		for _, e := range edges {
			if n += e.delta; n > limit {
				errs = append(errs, fmt.Errorf("tenant %s: %d executions at once at %d, above the limit %d", tenant, n, e.at, limit))
				break
			}
		}
	}
	return errs
}
