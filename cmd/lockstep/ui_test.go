package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockstep-dev/lockstep/internal/lock"
	"github.com/lockstep-dev/lockstep/internal/proctest"
	"github.com/lockstep-dev/lockstep/internal/redistest"
)

// startUI runs `lockstep ui` on a free port against the Redis at addr and
// returns its base URL once it answers.
func startUI(t *testing.T, addr string, args ...string) string {
	t.Helper()
	return startUIEnv(t, []string{"LOCKSTEP_REDIS_ADDR=" + addr}, args...)
}

// startUIEnv is startUI with the environment env.
func startUIEnv(t *testing.T, env []string, args ...string) string {
	t.Helper()
	port, err := proctest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	hostPort := "127.0.0.1:" + strconv.Itoa(port)
	startProc(t, "lockstep", env, append([]string{"ui", "--http-addr", hostPort}, args...)...)
	base := "http://" + hostPort
	waitFor(t, 10*time.Second, "lockstep ui answering", func() bool {
		resp, err := http.Get(base + "/")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	})
	return base
}

// get fetches url and returns the status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if loc := resp.Header.Get("Location"); loc != "" {
		return resp.StatusCode, loc
	}
	return resp.StatusCode, string(b)
}

func getJSON(t *testing.T, url string, wantStatus int, v any) {
	t.Helper()
	status, body := get(t, url)
	if status != wantStatus {
		t.Fatalf("GET %s: %d, want %d\n%s", url, status, wantStatus, body)
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("GET %s: %v\n%s", url, err, body)
	}
}

// setScene makes what the page shows: lock:order:42 held with two waiters,
// lock:order:7 held, and a lost lock (lock:order:9, broken by unlock).
func setScene(t *testing.T, c *cluster) {
	t.Helper()
	c.enqueueDemo(t, "hold-42", "42", 60_000)
	c.enqueueDemo(t, "hold-7", "7", 60_000)
	c.enqueueDemo(t, "hold-9", "9", 60_000)
	for _, r := range []string{"lock:order:42", "lock:order:7", "lock:order:9"} {
		waitFor(t, 20*time.Second, r+" held", func() bool { return lockOf(t, c.addr, r) != nil })
	}
	c.enqueueDemo(t, "wait-1", "42", 5)
	waitFor(t, 10*time.Second, "wait-1 waiting", func() bool { return len(waiters(t, c.addr)) == 1 })
	c.enqueueDemo(t, "wait-2", "42", 5)
	waitFor(t, 10*time.Second, "wait-2 waiting", func() bool { return len(waiters(t, c.addr)) == 2 })
	if r := cli(t, c.addr, "", "unlock", "lock:order:9", "--force", "--yes"); r.code != 0 {
		t.Fatalf("unlock: exit %d: %s", r.code, r.stderr)
	}
}

// The JSON endpoints the page reads (documented in docs/operations.md) against a
// real worker and scheduler.
func TestUIEndpoints(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := startCluster(t, srv)
	base := startUI(t, srv.Addr, "--asynqmon", "http://asynqmon.example:8080/")
	setScene(t, c)

	var locks []lockView
	getJSON(t, base+"/api/locks", 200, &locks)
	byRes := map[string]lockView{}
	for _, l := range locks {
		byRes[l.Resource] = l
	}
	if l := byRes["lock:order:42"]; l.TaskID != "hold-42" || l.Type != "demo:order.pay" || l.Waiters != 2 || l.HeldMs == nil {
		t.Fatalf("/api/locks: lock:order:42 = %+v (all: %+v)", l, locks)
	}

	var ws []waiterView
	getJSON(t, base+"/api/waiters?resource=lock:order:42", 200, &ws)
	if len(ws) != 2 || ws[0].TaskID != "wait-1" || ws[1].TaskID != "wait-2" {
		t.Fatalf("/api/waiters = %+v, want wait-1 then wait-2", ws)
	}
	var e apiError
	getJSON(t, base+"/api/waiters", 400, &e)
	if !strings.Contains(e.Error, "resource") {
		t.Fatalf("/api/waiters without resource: %q", e.Error)
	}

	var losses []lossView
	waitFor(t, 10*time.Second, "the broken lock among the losses", func() bool {
		getJSON(t, base+"/api/losses", 200, &losses)
		return len(losses) > 0
	})
	if l := losses[0]; l.Resource != "lock:order:9" || l.Reason != "expired" || l.TaskID != "hold-9" ||
		l.Type != "demo:order.pay" || l.Fence <= 0 || l.AtMs <= 0 || l.Queue != "default" || l.Holder == "" {
		t.Fatalf("/api/losses = %+v, want lock:order:9 lost (expired) by hold-9", losses)
	}

	var task taskView
	getJSON(t, base+"/api/tasks/hold-42", 200, &task)
	if task.Queue != "default" || task.Type != "demo:order.pay" || task.State != "active" ||
		task.Asynqmon != "http://asynqmon.example:8080/queues/default/tasks/hold-42" {
		t.Fatalf("/api/tasks/hold-42 = %+v", task)
	}
	if task.Payload == "" || task.PayloadHidden {
		t.Fatalf("/api/tasks/hold-42 = %+v, want its payload", task)
	}
	hidden := startUI(t, srv.Addr, "--hide-payloads")
	var bare taskView
	getJSON(t, hidden+"/api/tasks/hold-42", 200, &bare)
	if bare.Payload != "" || !bare.PayloadHidden || bare.Type != "demo:order.pay" {
		t.Fatalf("--hide-payloads: /api/tasks/hold-42 = %+v, want no payload, payload_hidden", bare)
	}
	getJSON(t, base+"/api/tasks/nope", 404, &e)
	if status, loc := get(t, base+"/tasks/hold-42"); status != http.StatusFound || loc != task.Asynqmon {
		t.Fatalf("/tasks/hold-42: %d to %q, want a redirect to asynqmon", status, loc)
	}

	var o overview
	getJSON(t, base+"/api/overview", 200, &o)
	if len(o.Locks) < 2 || len(o.Waiters["lock:order:42"]) != 2 || len(o.Losses) == 0 || o.ServerTimeMs <= 0 ||
		o.Asynqmon != "http://asynqmon.example:8080" {
		t.Fatalf("/api/overview = %+v", o)
	}
	var scheds []map[string]any
	if err := json.Unmarshal(o.Schedules, &scheds); o.SchedulesError != "" || err != nil || len(scheds) != 1 || scheds[0]["name"] != "every-second" || len(o.Ticks) != 1 {
		t.Fatalf("/api/overview schedules %s (error %q), ticks %v: want every-second and its ticks", o.Schedules, o.SchedulesError, o.Ticks)
	}
	getJSON(t, base+"/api/ticks", 400, &e)

	status, page := get(t, base+"/")
	if status != 200 || !strings.Contains(page, `<script src="app.js">`) || strings.Contains(page, "http://") {
		t.Fatalf("/: %d, want the page with its own script and no outside address\n%s", status, page)
	}
	if status, js := get(t, base+"/app.js"); status != 200 || !strings.Contains(js, "api/overview") {
		t.Fatalf("/app.js: %d", status)
	}
}

// chromium runs headless Chromium once with args, in a fresh profile.
func chromium(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=3000", "--window-size=1400,1100"}, args...)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) } // and its helpers
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // no helper outlives the run
	return string(out), err
}

// The page in headless Chromium shows the held lock, its waiters and the
// lost lock; a screenshot is saved in $ARTIFACTS_DIR (default bin/artifacts)
// as ui.png.
func TestUIInChromium(t *testing.T) {
	t.Parallel()
	bin := proctest.Binary(t, "chromium", "chromium") // fails with an install hint, never skips
	var err error
	srv := redistest.Start(t)
	c := startCluster(t, srv)
	base := startUI(t, srv.Addr)
	setScene(t, c)
	// A tenant waiting for its fair share: a task of it seen, not started.
	if _, err := lock.New(srv.Client()).Fair(context.Background(), lock.FairScope("default", "tenant.export"),
		lock.FairAsk{Seen: []lock.FairTask{{ID: "export-7", Tenant: "t7", Weight: 2}}, TTL: 5 * time.Minute}); err != nil {
		t.Fatal(err)
	}

	var dom string
	waitFor(t, 60*time.Second, "lock:order:42 with its waiters, the lost lock and tenant t7 in the page's DOM", func() bool {
		dom, err = chromium(t, bin, "--dump-dom", base+"/")
		if err != nil {
			t.Logf("chromium: %v", err)
			return false
		}
		return strings.Contains(dom, `<tr data-resource="lock:order:42">`) &&
			strings.Contains(dom, `data-task="hold-42"`) &&
			strings.Contains(dom, `<div class="waiters" data-resource="lock:order:42">`) &&
			strings.Contains(dom, `data-task="wait-2"`) &&
			strings.Contains(dom, `<td class="reason">expired</td>`) &&
			strings.Contains(dom, `<tr data-tenant="t7">`)
	})
	if strings.Contains(dom, "cannot reach") {
		t.Fatalf("page reports an error:\n%s", dom)
	}

	dir := os.Getenv("ARTIFACTS_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "bin", "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot, err := filepath.Abs(filepath.Join(dir, "ui.png"))
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(shot)
	if _, err := chromium(t, bin, "--screenshot="+shot, "--hide-scrollbars", base+"/"); err != nil {
		t.Fatalf("chromium --screenshot: %v", err)
	}
	if st, err := os.Stat(shot); err != nil || st.Size() < 10_000 {
		t.Fatalf("screenshot %s: %v, %v", shot, st, err)
	}
	t.Logf("screenshot: %s", shot)
}
