package config

import (
	"strings"
	"testing"
)

func TestLoadOperatorReadsEveryBinarysFile(t *testing.T) {
	lookup := envMap(map[string]string{"LOCKSTEP_REDIS_ADDR": "127.0.0.1:7777"})
	for _, path := range []string{"../../configs/worker.yaml", "../../configs/scheduler.yaml", ""} {
		c, err := LoadOperator(path, lookup)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if c.Redis.Addr != "127.0.0.1:7777" || c.Lock.Prefix == "" {
			t.Fatalf("%s: redis %q, prefix %q", path, c.Redis.Addr, c.Lock.Prefix)
		}
	}
	_, err := LoadOperator("", envMap(map[string]string{"LOCKSTEP_REDIS_MODE": "bogus"}))
	if err == nil || !strings.Contains(err.Error(), "LOCKSTEP_REDIS_MODE") {
		t.Fatalf("bad mode: %v, want an error naming LOCKSTEP_REDIS_MODE", err)
	}
}
