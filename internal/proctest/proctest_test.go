package proctest_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockstep-dev/lockstep/internal/proctest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// exitedWithin reports whether exited closes within d.
func exitedWithin(exited <-chan struct{}, d time.Duration) bool {
	select {
	case <-exited:
		return true
	case <-time.After(d):
		return false
	}
}

// sleeper is a process that sleeps for a minute.
func sleeper(t *testing.T) proctest.Spec {
	return proctest.Spec{What: "sleep", Bin: proctest.Binary(t, "sleep", "coreutils"), Args: []string{"60"}}
}

func TestKillPauseRestart(t *testing.T) {
	t.Parallel()
	p := proctest.Start(t, sleeper(t))
	pid := p.Pid()
	if pid == 0 {
		t.Fatal("Pid() = 0 for a running process")
	}
	if err := p.Start(); err == nil || p.Pid() != pid {
		t.Fatalf("a second Start = %v (pid %d, was %d), want an error and the same process", err, p.Pid(), pid)
	}
	p.Pause()
	p.Resume()
	p.Restart()
	if p.Pid() == 0 || p.Pid() == pid {
		t.Fatalf("Restart: pid %d, was %d; want a new process", p.Pid(), pid)
	}
	exited := p.Exited()
	p.Kill()
	if !exitedWithin(exited, 5*time.Second) {
		t.Fatal("Kill returned before the process exited")
	}
	if p.Pid() != 0 || p.Exited() != nil {
		t.Fatal("after Kill the process still counts as running")
	}
	p.Kill() // nothing runs: does nothing
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("the first process (pid %d) still exists: %v", pid, err)
	}
}

func TestStopIsGraceful(t *testing.T) {
	t.Parallel()
	p := proctest.Start(t, sleeper(t))
	if !p.Stop(5 * time.Second) {
		t.Fatal("sleep did not exit on SIGTERM")
	}
	// A process that ignores SIGTERM is killed after the timeout.
	log := filepath.Join(t.TempDir(), "stubborn.log")
	var q *proctest.Proc
	q = proctest.New(t, proctest.Spec{What: "stubborn", Bin: proctest.Binary(t, "sh", "dash"),
		Args: []string{"-c", "trap '' TERM; echo trapped; exec sleep 60"}, // SIG_IGN survives exec
		Log:  log,
		Ready: func(exited <-chan struct{}) error { // the trap is set once it says so
			for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				if strings.Contains(q.LogTail(100), "trapped") {
					return nil
				}
			}
			return errors.New("never said trapped")
		}})
	t.Cleanup(q.Kill)
	if err := q.Start(); err != nil {
		t.Fatal(err)
	}
	if q.Stop(200 * time.Millisecond) {
		t.Fatal("a process that ignores SIGTERM counted as exiting by itself")
	}
	if q.Pid() != 0 {
		t.Fatal("still running after Stop")
	}
}

// A process that dies before it is ready fails Start, and the error quotes
// its log.
func TestFailedStartQuotesLog(t *testing.T) {
	t.Parallel()
	log := filepath.Join(t.TempDir(), "p.log")
	p := proctest.New(t, proctest.Spec{
		What: "crasher", Bin: proctest.Binary(t, "sh", "dash"), Args: []string{"-c", "echo bind: address in use >&2; exit 3"},
		Log: log,
		Ready: func(exited <-chan struct{}) error {
			if exitedWithin(exited, 10*time.Second) {
				return errors.New("exited during start")
			}
			return nil
		},
	})
	t.Cleanup(p.Kill)
	err := p.Start()
	if err == nil || !strings.Contains(err.Error(), "crasher: exited during start") || !strings.Contains(err.Error(), "bind: address in use") {
		t.Fatalf("Start = %v, want the Ready error and the log's tail", err)
	}
	if p.Pid() != 0 {
		t.Fatal("a failed start left a process")
	}
}

// A process's JSON log reaches a Log through Spec.Output, lines split
// across writes included, and Wait returns the record asked for.
func TestLogWait(t *testing.T) {
	t.Parallel()
	var log proctest.Log
	p := proctest.Start(t, proctest.Spec{What: "logger", Bin: proctest.Binary(t, "sh", "dash"), Output: &log,
		Args: []string{"-c", `echo '{"msg":"starting"}'; printf '{"msg":"listening",'; sleep 0.05; echo '"addr":"127.0.0.1:1"}'; exec sleep 60`}})
	rec := log.Wait(t, 0, 10*time.Second, p.Exited(), "listening", proctest.Msg("listening", "addr", "127.0.0.1:1"))
	if rec["addr"] != "127.0.0.1:1" {
		t.Fatalf("Wait = %v", rec)
	}
	if n := log.Len(); n != 2 || !strings.Contains(log.String(), "starting") {
		t.Fatalf("Len() = %d, String() = %q", n, log.String())
	}
	if rec := log.Find(proctest.Msg("starting")); rec == nil || log.Find(proctest.Msg("stopping")) != nil {
		t.Fatalf("Find: %v for a logged record, want it; and a record never logged found", rec)
	}
	if tail := log.Tail(1); !strings.HasPrefix(tail, `{"msg":"listening"`) || strings.Contains(tail, "starting") {
		t.Fatalf("Tail(1) = %q, want the last line only", tail)
	}
	var partial proctest.Log
	_, _ = partial.Write([]byte(`{"msg":"half`))
	if partial.Len() != 0 {
		t.Fatal("a line without its end counted")
	}
}

// MkdirTemp: in GOTMPDIR when it is set, else in /dev/shm where it exists;
// TempDir's is removed when its test ends.
func TestMkdirTemp(t *testing.T) {
	gotmp := t.TempDir()
	t.Setenv("GOTMPDIR", gotmp)
	d, err := proctest.MkdirTemp("x-")
	if err != nil || filepath.Dir(d) != gotmp {
		t.Errorf("with GOTMPDIR %s: MkdirTemp made %s (%v)", gotmp, d, err)
	}
	t.Setenv("GOTMPDIR", "")
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := proctest.MkdirTemp("x-"); err != nil || filepath.Dir(d) != "/dev/shm" {
			t.Errorf("without GOTMPDIR: MkdirTemp made %s (%v), want it in /dev/shm", d, err)
		} else {
			_ = os.Remove(d)
		}
	}
	var kept string
	t.Run("TempDir", func(t *testing.T) {
		kept = proctest.TempDir(t)
		if filepath.Dir(kept) != "/dev/shm" && filepath.Dir(kept) != os.TempDir() {
			t.Errorf("TempDir made %s", kept)
		}
	})
	if _, err := os.Stat(kept); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("TempDir's %s is there after its test (%v)", kept, err)
	}
}

func TestWriteFile(t *testing.T) {
	t.Parallel()
	path := proctest.WriteFile(t, "c.yaml", "a: 1\n")
	b, err := os.ReadFile(path)
	if err != nil || string(b) != "a: 1\n" || filepath.Base(path) != "c.yaml" {
		t.Fatalf("WriteFile wrote %q at %s (%v)", b, path, err)
	}
}

// Start starts the process at once and kills it when the test ends.
func TestStartKillsAtTheEnd(t *testing.T) {
	t.Parallel()
	var p *proctest.Proc
	var pid int
	t.Run("owner", func(t *testing.T) {
		p = proctest.Start(t, sleeper(t))
		if pid = p.Pid(); pid == 0 {
			t.Fatal("Start returned before the process runs")
		}
	})
	if p.Pid() != 0 {
		t.Fatal("the process outlived the test that started it")
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("pid %d still exists: %v", pid, err)
	}
}
