package deploytest

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// redisDirectives turns redis-server's command-line flags ("--name value")
// into redistest's "name", "value" pairs, and returns the data directory
// (--dir) apart: the test's server keeps its data in a directory of its own,
// which stands for the volume.
func redisDirectives(t *testing.T, where string, args []string) (directives []string, dir string) {
	t.Helper()
	if len(args) > 0 && args[0] == "redis-server" {
		args = args[1:]
	}
	for i := 0; i < len(args); i += 2 {
		name, ok := strings.CutPrefix(args[i], "--")
		if !ok || i+1 == len(args) || strings.HasPrefix(args[i+1], "--") {
			t.Fatalf("%s: redis-server arguments %q: the test reads --name value pairs only", where, args)
		}
		if name == "dir" {
			dir = args[i+1]
			continue
		}
		directives = append(directives, name, args[i+1])
	}
	return directives, dir
}

// checkKeepsData starts a redis-server with directives (a manifest's own
// arguments) on a private directory, writes what Lockstep keeps (a lock, a
// fence counter, a queue, a stream), kills the server (SIGKILL, as a node
// failure or an OOM kill would) and starts it again on the same directory:
// every write must be back. It reports what was lost.
func checkKeepsData(t *testing.T, directives []string) []string {
	t.Helper()
	srv := redistest.Start(t, directives...)
	ctx := context.Background()
	c := srv.Client()
	want := map[string]string{}
	for i := range 50 {
		k := fmt.Sprintf("lockstep:{lock:order:%d}", i)
		if err := c.Set(ctx, k, fmt.Sprintf("holder-%d", i), 0).Err(); err != nil {
			t.Fatal(err)
		}
		want[k] = fmt.Sprintf("holder-%d", i)
	}
	if err := c.Incr(ctx, "lockstep:{lock:order:1}:fence").Err(); err != nil {
		t.Fatal(err)
	}
	enq := asynq.NewClientFromRedisClient(c)
	if _, err := enq.Enqueue(asynq.NewTask("t:persist", nil)); err != nil {
		t.Fatal(err)
	}
	_ = enq.Close()
	if err := c.XAdd(ctx, &redis.XAddArgs{Stream: "lockstep:losses", Values: []string{"resource", "lock:order:1"}}).Err(); err != nil {
		t.Fatal(err)
	}

	srv.Restart() // SIGKILL, then the same arguments on the same directory
	var lost []string
	c = srv.Client()
	locks := 0
	for k, v := range want {
		if got, _ := c.Get(ctx, k).Result(); got != v {
			locks++
		}
	}
	if locks > 0 {
		lost = append(lost, fmt.Sprintf("%d of %d locks", locks, len(want)))
	}
	if n, _ := c.Get(ctx, "lockstep:{lock:order:1}:fence").Int(); n != 1 {
		lost = append(lost, "the fence counter")
	}
	if q, err := asynq.NewInspectorFromRedisClient(c).GetQueueInfo("default"); err != nil || q.Pending != 1 {
		lost = append(lost, "the queue")
	}
	if n, _ := c.XLen(ctx, "lockstep:losses").Result(); n != 1 {
		lost = append(lost, "the stream")
	}
	slices.Sort(lost)
	return lost
}

// TestRedisKeepsItsData: the Redis of deploy/compose.yaml and of
// deploy/k8s keeps its data in a directory on a volume that outlives the
// container (a named volume; a PersistentVolumeClaim), and a redis-server
// started with the file's own arguments keeps every write across a kill and
// a restart. The same check on a server without persistence finds the data
// gone, so the check can fail.
func TestRedisKeepsItsData(t *testing.T) {
	t.Parallel()
	root := Root(t)

	t.Run("compose", func(t *testing.T) {
		t.Parallel()
		var c composeFile
		readYAML(t, filepath.Join(root, "deploy", "compose.yaml"), &c)
		s, ok := c.Services["redis"]
		if !ok {
			t.Fatal("compose.yaml: no service redis")
		}
		directives, dir := redisDirectives(t, "compose.yaml: service redis", s.Command)
		var volume string
		for _, v := range s.Volumes {
			if src, target, ok := strings.Cut(v, ":"); ok && strings.TrimSuffix(target, ":rw") == dir {
				volume = src
			}
		}
		if _, named := c.Volumes[volume]; dir == "" || !named {
			t.Errorf("compose.yaml: service redis keeps its data in %q (--dir), which is no named volume of the file (volumes %v)", dir, s.Volumes)
		}
		if lost := checkKeepsData(t, directives); len(lost) > 0 {
			t.Errorf("compose.yaml: a redis-server with %q lost %v across a restart", s.Command, lost)
		}
	})

	t.Run("k8s", func(t *testing.T) {
		t.Parallel()
		objs := readK8s(t, filepath.Join(root, "deploy", "k8s"))
		claims := map[string]bool{}
		for _, o := range objs {
			if o.Kind == "PersistentVolumeClaim" {
				claims[o.Metadata.Name] = true
			}
		}
		found := false
		for _, o := range objs {
			if o.Kind != "Deployment" {
				continue
			}
			d := decodeSpec[deploymentSpec](t, o)
			for _, ctr := range d.Template.Spec.Containers {
				if !strings.HasPrefix(ctr.Image, "redis:") {
					continue
				}
				found = true
				where := fmt.Sprintf("%s container %s", o.where(), ctr.Name)
				directives, dir := redisDirectives(t, where, append(slices.Clone(ctr.Command), ctr.Args...))
				var claim string
				for _, m := range ctr.VolumeMounts {
					if m.MountPath != dir {
						continue
					}
					for _, v := range d.Template.Spec.Volumes {
						if v.Name == m.Name && v.PersistentVolumeClaim != nil {
							claim = v.PersistentVolumeClaim.ClaimName
						}
					}
				}
				if dir == "" || !claims[claim] {
					t.Errorf("%s: keeps its data in %q (--dir), which is not a mounted PersistentVolumeClaim of the manifests", where, dir)
				}
				if d.Replicas != nil && *d.Replicas > 1 {
					t.Errorf("%s: %d replicas on one ReadWriteOnce claim", where, *d.Replicas)
				}
				if lost := checkKeepsData(t, directives); len(lost) > 0 {
					t.Errorf("%s: a redis-server with %q lost %v across a restart", where, ctr.Args, lost)
				}
			}
		}
		if !found {
			t.Fatal("k8s: no Deployment runs a redis: image")
		}
	})

	t.Run("without persistence", func(t *testing.T) {
		t.Parallel()
		if lost := checkKeepsData(t, []string{"save", "", "appendonly", "no"}); len(lost) == 0 {
			t.Error("a redis-server without persistence kept its data across a restart: the check cannot fail")
		}
	})
}
