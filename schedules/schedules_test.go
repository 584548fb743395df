package schedules_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/redistest"
	"github.com/lockstep-dev/lockstep/schedules"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, redistest.LeakOptions()...) }

func TestClient(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := t.Context()
	c := schedules.New(srv.Client())
	s := schedules.Schedule{Name: "acme", Cron: "@hourly", Task: "report:build", Payload: json.RawMessage(`{"c":1}`), NoRetry: true}
	if err := c.Add(ctx, s); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if got.Source != "runtime" || got.Queue != "default" || got.Timezone != "UTC" || got.CatchUp != "skip" || got.MaxRetry != 0 || got.Paused || got.NextTick.IsZero() {
		t.Errorf("Get = %+v", got)
	}
	bad := s
	bad.Name, bad.Payload = "bad name", json.RawMessage(`"x"`)
	err = c.Add(ctx, bad)
	var fe *schedules.FieldError
	if !errors.As(err, &fe) || !strings.Contains(err.Error(), `schedule (bad name).name: invalid name "bad name"`) ||
		!strings.Contains(err.Error(), `schedule (bad name).payload: must be a mapping (JSON object), got a string`) {
		t.Errorf("bad Add = %v", err)
	}
	if all, err := c.List(ctx); err != nil || len(all) != 1 {
		t.Errorf("List = %v, %v", all, err)
	}
	if err := c.Add(ctx, s); !errors.Is(err, schedules.ErrExists) {
		t.Errorf("second Add = %v", err)
	}
	if ok, err := c.Pause(ctx, "acme"); !ok || err != nil {
		t.Errorf("Pause = %v, %v", ok, err)
	}
	if _, err := c.Resume(ctx, "nope"); !errors.Is(err, schedules.ErrNotFound) {
		t.Errorf("Resume of nothing = %v", err)
	}
	if id, err := c.Trigger(ctx, "acme"); err != nil || !strings.HasPrefix(id, "acme:trigger:") {
		t.Errorf("Trigger = %q, %v", id, err)
	}
	if err := c.Remove(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "acme"); !errors.Is(err, schedules.ErrNotFound) {
		t.Errorf("Get after Remove = %v", err)
	}
}
