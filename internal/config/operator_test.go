package config

import (
	"strings"
	"testing"
)

func TestLoadOperatorReadsEveryBinarysFile(t *testing.T) {
	env := map[string]string{"LOCKSTEP_REDIS_ADDR": "127.0.0.1:7777"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for _, path := range []string{"../../configs/worker.yaml", "../../configs/scheduler.yaml", ""} {
		c, err := LoadOperator(path, lookup)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if c.Redis.Addr != "127.0.0.1:7777" || c.Lock.Prefix == "" {
			t.Fatalf("%s: redis %q, prefix %q", path, c.Redis.Addr, c.Lock.Prefix)
		}
	}
	_, err := LoadOperator("", func(k string) (string, bool) {
		if k == "LOCKSTEP_REDIS_MODE" {
			return "bogus", true
		}
		return "", false
	})
	if err == nil || !strings.Contains(err.Error(), "LOCKSTEP_REDIS_MODE") {
		t.Fatalf("bad mode: %v, want an error naming LOCKSTEP_REDIS_MODE", err)
	}
}
