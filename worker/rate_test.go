package worker

import (
	"context"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep"
)

// Rate's limit is checked at registration; RateBy's comes with each payload.
func TestRateBuildsTheSpecsLimit(t *testing.T) {
	t.Parallel()
	noop := Handle("order:pay", func(context.Context, Job, pay) error { return nil })
	s, err := noop.Rate(func(p pay) string { return "rate:" + p.OrderID }, lockstep.RateLimit{N: 5, Per: time.Second}).spec()
	if err != nil {
		t.Fatal(err)
	}
	if key, r := s.Rate(pay{OrderID: "7"}); key != "rate:7" || r.N != 5 || r.Per != time.Second || r.Burst != 0 {
		t.Fatalf("Rate: key %q, limit %+v", key, r)
	}
	if _, err := noop.Rate(orderLock, lockstep.RateLimit{N: 0, Per: time.Second}).spec(); err == nil {
		t.Fatal("Rate with N 0 registered")
	}
	premium := noop.RateBy(func(p pay) (string, lockstep.RateLimit) {
		if p.Cents > 100 {
			return "rate:big", lockstep.RateLimit{N: 50, Per: time.Second, Burst: 10}
		}
		return "rate:small", lockstep.RateLimit{N: 5, Per: time.Second}
	})
	s, err = premium.spec()
	if err != nil {
		t.Fatal(err)
	}
	if key, r := s.Rate(pay{Cents: 500}); key != "rate:big" || r.N != 50 || r.Burst != 10 {
		t.Fatalf("RateBy: key %q, limit %+v", key, r)
	}
	if s, _ := noop.spec(); s.Rate != nil {
		t.Fatal("a handler without Rate has a rate")
	}
}
