package main

// Stub, replaced at merge by the CLI helper's app.go.

import (
	"io"

	"github.com/redis/go-redis/v9"
)

type app struct {
	stdout, stderr io.Writer
	stdin          io.Reader
	configPath     string                // --config, may be ""
	client         redis.UniversalClient // from the config's redis section (LOCKSTEP_REDIS_*), the one constructor
	prefix         string                // key prefix, default "lockstep:"
}
