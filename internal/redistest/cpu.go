package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// CPU is the CPU time (used_cpu_user + used_cpu_sys, INFO cpu) the Redis
// server behind c has used so far: what benchmarks take the difference of.
func CPU(tb testing.TB, c redis.UniversalClient) time.Duration {
	tb.Helper()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatalf("INFO cpu: %s: %v", line, err)
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// Commands is the number of commands the Redis server behind c has run so
// far (INFO commandstats; a script's own commands counted, INFO left out):
// what benchmarks take the difference of for server commands per op.
func Commands(tb testing.TB, c redis.UniversalClient) int64 {
	tb.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var total int64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(k, "cmdstat_") || k == "cmdstat_info" {
			continue
		}
		for _, kv := range strings.Split(v, ",") {
			if n, ok := strings.CutPrefix(kv, "calls="); ok {
				calls, err := strconv.ParseInt(n, 10, 64)
				if err != nil {
					tb.Fatalf("INFO commandstats: %s: %v", line, err)
				}
				total += calls
			}
		}
	}
	return total
}
