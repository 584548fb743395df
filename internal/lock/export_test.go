package lock

import "github.com/redis/go-redis/v9"

// RenewScript exposes the single-lease renew script to benchmarks.
func RenewScript() *redis.Script { return scriptRenew }
