package acltest

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/demo"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// aclFile is the file docs/operations.md quotes and operators include.
var aclFile = repoFile("deploy", "redis-acl.conf")

// aclUsers returns the `user` lines of deploy/redis-acl.conf by user name.
func aclUsers(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(aclFile)
	if err != nil {
		t.Fatal(err)
	}
	users := map[string]string{}
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == "user" {
			users[f[1]] = line
		}
	}
	for _, role := range []string{"lockstep-worker", "lockstep-scheduler", "lockstep-cli"} {
		if users[role] == "" {
			t.Fatalf("%s: no user %s", aclFile, role)
		}
	}
	return users
}

// password is the test's password of an ACL user.
func password(user string) string { return "pw-" + user }

// startWithUsers starts a redis-server that includes a redis.conf fragment
// of the given user lines, each with its password appended as the file's
// comment tells operators to. The default user stays open for the test's
// own reads.
func startWithUsers(t *testing.T, lines ...string) *redistest.Server {
	t.Helper()
	var b strings.Builder
	for _, l := range lines {
		name := strings.Fields(l)[1]
		fmt.Fprintf(&b, "%s >%s\n", l, password(name))
	}
	return redistest.Start(t, "include", proctest.WriteFile(t, "acl.conf", b.String()))
}

// asUser is the environment of a binary that connects to srv as user.
func asUser(srv *redistest.Server, user string) []string {
	return []string{"LOCKSTEP_REDIS_ADDR=" + srv.Addr, "LOCKSTEP_REDIS_USERNAME=" + user, "LOCKSTEP_REDIS_PASSWORD=" + password(user)}
}

// denied matches what a refused command looks like in a binary's output.
var denied = regexp.MustCompile(`NOPERM|no permissions|can't run this command`)

// TestDocsQuoteTheACLFile: the security section shows deploy/redis-acl.conf
// verbatim, so the rules an operator reads are the rules the test runs.
func TestDocsQuoteTheACLFile(t *testing.T) {
	t.Parallel()
	file, err := os.ReadFile(aclFile)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := os.ReadFile(repoFile("docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(docs), "```text\n"+string(file)+"```\n") {
		t.Errorf("docs/operations.md does not quote deploy/redis-acl.conf verbatim in a text block; the file is:\n%s", file)
	}
}

// TestRolesRunUnderTheirACLUsers runs a scheduler and two workers, each
// under its user of deploy/redis-acl.conf, kills one worker (its jobs are
// recovered), and runs the CLI's commands under the CLI's user: the demo
// jobs complete, the queue metrics are read, every command answers, and
// Redis logs no denial for any of the file's users. The CLI under its rules
// less one (+scan) fails with NOPERM: the rules are needed, not just enough.
func TestRolesRunUnderTheirACLUsers(t *testing.T) {
	t.Parallel()
	users := aclUsers(t)
	less := strings.Replace(strings.Replace(users["lockstep-cli"], " +scan", "", 1), "user lockstep-cli ", "user lockstep-cli-less ", 1)
	srv := startWithUsers(t, users["lockstep-worker"], users["lockstep-scheduler"], users["lockstep-cli"], less)
	c := srv.Client()
	ctx := context.Background()

	sched := startBinary(t, "scheduler", asUser(srv, "lockstep-scheduler"), "--config", proctest.WriteFile(t, "scheduler.yaml", schedulerConfig))
	wcfg := proctest.WriteFile(t, "worker.yaml", workerConfig)
	w1 := startBinary(t, "worker", asUser(srv, "lockstep-worker"), "--config", wcfg)
	w2 := startBinary(t, "worker", asUser(srv, "lockstep-worker"), "--config", wcfg)
	sched.metricsAddr(t)
	metrics := w1.metricsAddr(t)
	w2.metricsAddr(t)

	waitDemoOK(t, c, 5, 60*time.Second)

	// A worker killed mid-job: the other brings its jobs back.
	w2.Kill()
	before := waitDemoOK(t, c, 0, time.Second)[demo.OutcomeOK]
	waitDemoOK(t, c, before+5, 60*time.Second)

	// asynq's queue figures (its scripts call MEMORY USAGE) reach /metrics.
	redistest.WaitFor(t, 20*time.Second, "asynq's queue figures on the worker's /metrics", func() bool {
		text, err := scrape(metrics)
		return err == nil && strings.Contains(text, `asynq_queue_memory_usage_approx_bytes{queue="default"}`)
	})

	// The CLI's commands, as an operator runs them.
	cli := asUser(srv, "lockstep-cli")
	redistest.WaitFor(t, 20*time.Second, "lockstep locks to list a held lock", func() bool {
		code, out := runCLI(t, cli, "locks", "--json")
		if denied.MatchString(out) {
			t.Fatalf("lockstep locks under lockstep-cli: %s", out)
		}
		return code == 0 && strings.Contains(out, `"resource"`)
	})
	for _, args := range [][]string{
		{"locks"},
		{"waiters", "lock:order:acl-1", "--json"},
		{"schedules", "--json"},
		{"ticks", "acl-pay-1", "--json"},
		{"schedules", "add", "acl-runtime", "--cron", "* * * * * *", "--task", "demo:order.pay", "--payload", `{"order_id":"acl-3","work_ms":10}`},
		{"schedules", "pause", "acl-runtime"},
		{"schedules", "resume", "acl-runtime"},
		{"schedules", "trigger", "acl-pay-1"},
		{"schedules", "rm", "acl-runtime"},
		{"unlock", "lock:order:acl-2", "--force", "--yes"}, // 1 when it was free just then
		{"unlock", "lock:tenant:acl-t", "--permit", "0", "--force", "--yes"},
	} {
		code, out := runCLI(t, cli, args...)
		if (code != 0 && code != 1) || denied.MatchString(out) {
			t.Errorf("lockstep %s under lockstep-cli: exit %d:\n%s", strings.Join(args, " "), code, out)
		}
	}
	waitDemoOK(t, c, before+8, 30*time.Second)

	// Lock-loss notices are on (CLIENT TRACKING was allowed).
	for _, w := range []*binProc{w1, w2} {
		if rec := w.log.Find(noticesOff); rec != nil {
			t.Errorf("a worker under lockstep-worker: %v", rec)
		}
	}

	// Nothing any of the three did was refused.
	entries, err := c.ACLLog(ctx, 1000).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Username, "lockstep-") && e.Username != "lockstep-cli-less" {
			t.Errorf("Redis refused user %s: %s %q (context %s, %d times)", e.Username, e.Reason, e.Object, e.Context, e.Count)
		}
	}

	// One rule less is a failure, with NOPERM.
	code, out := runCLI(t, asUser(srv, "lockstep-cli-less"), "locks")
	if code == 0 || !denied.MatchString(out) {
		t.Errorf("lockstep locks under the CLI's rules less +scan: exit %d, want a refusal (NOPERM):\n%s", code, out)
	}
}

// noticesOff matches the worker's record that CLIENT TRACKING was refused.
func noticesOff(rec map[string]any) bool {
	msg, _ := rec["msg"].(string)
	return strings.HasPrefix(msg, "watchdog: lock-loss notices off")
}

// TestWorkerWithoutClientTracking: a worker whose user lacks
// +client|tracking still runs its jobs, and says that lock-loss notices are
// off (a lost lock is then found at the next renewal), as the docs tell.
func TestWorkerWithoutClientTracking(t *testing.T) {
	t.Parallel()
	users := aclUsers(t)
	line := strings.Replace(users["lockstep-worker"], " +client|tracking", "", 1)
	if line == users["lockstep-worker"] {
		t.Fatal("the worker's rules have no +client|tracking")
	}
	srv := startWithUsers(t, line, users["lockstep-scheduler"])
	startBinary(t, "scheduler", asUser(srv, "lockstep-scheduler"), "--config", proctest.WriteFile(t, "scheduler.yaml", schedulerConfig))
	w := startBinary(t, "worker", asUser(srv, "lockstep-worker"), "--config", proctest.WriteFile(t, "worker.yaml", workerConfig))
	w.log.Wait(t, 0, 20*time.Second, w.Exited(), "lock-loss notices off", noticesOff)
	waitDemoOK(t, srv.Client(), 3, 60*time.Second)
}
