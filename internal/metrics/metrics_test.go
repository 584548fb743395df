package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestFixedLabelSeriesExistAtZero(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	New(reg)
	for name, want := range map[string]int{
		"lockstep_lock_acquire_total":  len(AcquireResults),
		"lockstep_lock_renewals_total": len(RenewalResults),
		"lockstep_lock_lost_total":     len(LostReasons),
	} {
		if got, err := testutil.GatherAndCount(reg, name); err != nil || got != want {
			t.Errorf("%s: %d series (%v), want %d at zero", name, got, err, want)
		}
	}
}
