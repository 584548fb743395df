package lockstep_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockstep-dev/lockstep"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

func attrOf(s tracetest.SpanStub, k string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == k {
			return a.Value.Emit()
		}
	}
	return ""
}

// WithLock, given a tracer provider, puts a wait and a hold span in the
// caller's trace (children of its span), fn running in the hold's; a lost
// lock is the hold's event and outcome; a wait that ends busy is a wait span
// with outcome not_acquired, and no hold.
func TestWithLockTracesInTheCallersTrace(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	l := lockstep.NewLocker(srv.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true }), lockstep.WithTracerProvider(tp))
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	admin := srv.Client()

	ctx, caller := tp.Tracer("test").Start(context.Background(), "caller")
	var inFn trace.SpanContext
	err := l.WithLock(ctx, "report", func(ctx context.Context, lease *lockstep.Lease) error {
		inFn = trace.SpanContextFromContext(ctx)
		if err := admin.Del(ctx, "lockstep:{report}").Err(); err != nil {
			return err
		}
		<-ctx.Done() // the watchdog's next renewal finds the key gone
		return errors.New("interrupted")
	}, lockstep.TTL(300*time.Millisecond))
	if !errors.Is(err, lockstep.ErrLockLost) {
		t.Fatalf("WithLock = %v, want the loss", err)
	}
	// A busy lock: held outside, WithLock waits briefly and gives up.
	other := lockstep.NewLocker(srv.Client())
	t.Cleanup(func() { _ = other.Close(context.Background()) })
	inside, done := make(chan struct{}), make(chan struct{})
	go func() {
		_ = other.WithLock(context.Background(), "busy", func(context.Context, *lockstep.Lease) error {
			close(inside)
			<-done
			return nil
		})
	}()
	<-inside
	busy := l.WithLock(ctx, "busy", func(context.Context, *lockstep.Lease) error { return nil }, lockstep.Wait(50*time.Millisecond))
	close(done)
	if !errors.Is(busy, lockstep.ErrNotAcquired) {
		t.Fatalf("busy WithLock = %v, want ErrNotAcquired", busy)
	}
	caller.End()

	byName := map[string][]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		if s.Parent.SpanID() == caller.SpanContext().SpanID() {
			byName[s.Name] = append(byName[s.Name], s)
		}
	}
	waits, holds := byName["lockstep.lock.wait"], byName["lockstep.lock.hold"]
	if len(waits) != 2 || len(holds) != 1 {
		t.Fatalf("caller's children: %d waits and %d holds, want 2 and 1", len(waits), len(holds))
	}
	hold := holds[0]
	if inFn.SpanID() != hold.SpanContext.SpanID() {
		t.Errorf("fn's context carries span %v, want the hold %v", inFn.SpanID(), hold.SpanContext.SpanID())
	}
	for k, v := range map[string]string{"lockstep.resource": "report", "lockstep.outcome": "lost", "lockstep.reason": "expired"} {
		if got := attrOf(hold, k); got != v {
			t.Errorf("hold %s = %q, want %q", k, got, v)
		}
	}
	if attrOf(hold, "lockstep.fence") == "" {
		t.Error("hold has no fence")
	}
	if !slices.ContainsFunc(hold.Events, func(e sdktrace.Event) bool {
		return e.Name == "lockstep.lock.lost" && slices.Contains(e.Attributes, attribute.String("lockstep.reason", "expired"))
	}) {
		t.Errorf("hold events %v, want lockstep.lock.lost with reason expired", hold.Events)
	}
	outcomes := map[string]string{}
	for _, w := range waits {
		outcomes[attrOf(w, "lockstep.resource")] = attrOf(w, "lockstep.outcome")
	}
	if outcomes["report"] != "acquired" || outcomes["busy"] != "not_acquired" {
		t.Errorf("wait outcomes by resource %v, want report acquired and busy not_acquired", outcomes)
	}
}

// Without a tracer provider WithLock leaves fn's context without a span.
func TestWithLockUntracedAddsNoSpan(t *testing.T) {
	t.Parallel()
	l, _ := newLocker(t)
	err := l.WithLock(context.Background(), "plain", func(ctx context.Context, _ *lockstep.Lease) error {
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			t.Errorf("untraced WithLock gave fn span %v", sc.SpanID())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A hold of a permit names it (lockstep.permit); a lock's hold has none.
func TestWithLockTracesThePermit(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	l := lockstep.NewLocker(srv.Client(), lockstep.WithTracerProvider(tp))
	defer l.Close(context.Background())
	ctx := context.Background()
	held := make(chan struct{})
	release, first := make(chan struct{}), make(chan error, 1)
	go func() {
		first <- l.WithLock(ctx, "tenant", func(context.Context, *lockstep.Lease) error {
			close(held)
			<-release
			return nil
		}, lockstep.Permits(2))
	}()
	<-held
	if err := l.WithLock(ctx, "tenant", func(context.Context, *lockstep.Lease) error { return nil }, lockstep.Permits(2)); err != nil {
		t.Fatal(err)
	}
	if err := l.WithLock(ctx, "plain", func(context.Context, *lockstep.Lease) error { return nil }); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	var permits []string
	for _, s := range exp.GetSpans() {
		if s.Name != "lockstep.lock.hold" {
			continue
		}
		if r := attrOf(s, "lockstep.resource"); r == "plain" && attrOf(s, "lockstep.permit") != "" {
			t.Errorf("a lock's hold has lockstep.permit %q", attrOf(s, "lockstep.permit"))
		} else if r == "tenant" {
			permits = append(permits, attrOf(s, "lockstep.permit"))
		}
	}
	slices.Sort(permits)
	if !slices.Equal(permits, []string{"0", "1"}) {
		t.Errorf("tenant holds' permits %v, want 0 and 1", permits)
	}
}
