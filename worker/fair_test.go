package worker

import (
	"context"
	"testing"
)

// FairBy gives every tenant weight 1; FairByWeighted takes it from the
// payload; without either a spec has no fair share.
func TestFairBuildsTheSpecsTenant(t *testing.T) {
	t.Parallel()
	noop := Handle("order:pay", func(context.Context, Job, pay) error { return nil })
	s, err := noop.FairBy(func(p pay) string { return "shop:" + p.OrderID }).spec()
	if err != nil {
		t.Fatal(err)
	}
	if tenant, w := s.Fair(pay{OrderID: "7"}); tenant != "shop:7" || w != 1 {
		t.Fatalf("FairBy: tenant %q, weight %d", tenant, w)
	}
	s, err = noop.FairByWeighted(func(p pay) (string, int) {
		if p.Cents > 100 {
			return "big", 3
		}
		return "small", 1
	}).spec()
	if err != nil {
		t.Fatal(err)
	}
	if tenant, w := s.Fair(pay{Cents: 500}); tenant != "big" || w != 3 {
		t.Fatalf("FairByWeighted: tenant %q, weight %d", tenant, w)
	}
	if s, _ := noop.spec(); s.Fair != nil {
		t.Fatal("a handler without FairBy has a fair share")
	}
}
