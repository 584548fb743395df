# Lockstep: build, test, benchmark.
GO        ?= go
PKGS      ?= ./...
TESTFLAGS ?=

.PHONY: all build test bench bench-peers lint deps chaos

# The go command's temporary files (each package's test binary, linked
# anew at every run: 0.7 GB at once in make test) go in memory where the
# machine has /dev/shm, as the test helpers put the servers' data
# (proctest.MkdirTemp): a disk that the machine shares, nearly full or slow,
# then neither fails nor slows a run. An exported GOTMPDIR wins.
export GOTMPDIR ?= $(if $(wildcard /dev/shm/.),/dev/shm)

all: build

build:
	$(GO) build ./...
	$(GO) build -o bin/ ./cmd/... 2>/dev/null || true

# deps installs what the tests start: redis-server, etcd, prometheus and
# chromium from Debian's packages, and Jaeger built from source once per
# machine (cached; about 5 minutes on 2 cores the first time).
deps:
	@GO=$(GO) scripts/deps.sh

# test vets with -race so that vet and the race-enabled tests share one
# compile of every package. It includes the 90-second chaos run with a fixed seed (internal/chaos
# TestChaos at its default flags): the harness and the checker run on every
# change. It runs after the other packages, not beside them: its seven
# processes would otherwise starve the short-TTL fault tests of CPU.
#
# Four tests of a package at once (-parallel 4; the default is the number of
# CPUs): most of them wait on real servers, ticks and TTLs, not on the CPU.
# internal/lock runs on its own with three at once: its Cluster, Sentinel,
# Redlock and etcd fault tests on short leases starved one another beside
# the other packages (leases lost while healthy, in make test only).
#
# The binaries that tests run are built without -race, by several test
# packages at once (proctest.Main): their packages are compiled once first
# (go list -export), so that those builds find them in the build cache rather
# than compile them side by side; 35 s less with an empty cache, 0.4 s with a
# warm one.
#
# It also builds and vets the example service (examples/, modules of their
# own; internal/exampletest runs them), and builds and tests the library
# packages with the oldest Go release go.mod declares (GOTOOLCHAIN fetches it
# through the module proxy once).
GO_MIN   := $(shell awk '$$1 == "go" { print $$2; exit }' go.mod)
LIBPKGS  ?= . ./worker ./schedules ./etcd ./fence
EXAMPLES := $(wildcard examples/*/go.mod)
test: deps
	$(GO) vet -race $(PKGS)
	$(GO) list -export -deps ./cmd/... >/dev/null
	@for m in $(dir $(EXAMPLES)); do echo "examples: vet and build $$m"; (cd $$m && $(GO) vet -race ./... && $(GO) build -race ./...) || exit 1; done
	$(GO) test -race -count=1 -parallel 4 -timeout 12m $(TESTFLAGS) $$($(GO) list $(PKGS) | grep -v -e '/internal/chaos$$' -e '/internal/lock$$')
	$(GO) test -race -count=1 -parallel 3 -timeout 8m $(TESTFLAGS) ./internal/lock
	GOTOOLCHAIN=go$(GO_MIN) $(GO) test -count=1 $(TESTFLAGS) $(LIBPKGS)
	$(GO) test -race -count=1 -timeout 8m $(TESTFLAGS) ./internal/chaos

# bench runs each benchmark next to its baseline in one run, so ratios can be
# read off one output; counts and times suit a 2-core machine (a few minutes).
bench: deps
	$(GO) test -run '^$$' -bench 'Cycle' -benchtime 3s -count 3 ./internal/lock
	$(GO) test -run '^$$' -bench 'PermitsContended' -benchtime 5000x -count 3 ./internal/lock
	$(GO) test -run '^$$' -bench 'Renew10k' -benchtime 20x ./internal/lock
	$(GO) test -run '^$$' -bench 'RenewAtScale' -benchtime 5x ./internal/lock
	$(GO) test -run '^$$' -bench 'OneCaller' -benchmem -count 5 .
	$(GO) test -run '^$$' -bench 'MemoryReleased' -benchtime 1000000x ./internal/lock
	$(GO) test -run '^$$' -bench 'MemoryHandOff' -benchtime 200000x -timeout 30m ./internal/jobs
	$(GO) test -run '^$$' -bench 'MemoryParked' -benchtime 100000x ./internal/jobs
	$(GO) test -run '^$$' -bench 'LossNotice' -benchtime 1x ./internal/watchdog
	$(GO) test -run '^$$' -bench 'Backends/(cycle|handoff|renew1000)/' -benchtime 2s ./internal/lock
	$(GO) test -run '^$$' -bench 'Backends/limited/' -benchtime 12s ./internal/lock
	$(GO) test -run '^$$' -bench 'FencedWrite' -benchtime 2s ./fence
	$(GO) test -run '^$$' -bench 'QueuedWrite' -benchtime 2s ./fence/pgxfence
	$(GO) test -run '^$$' -bench 'Throughput' -benchtime 25000x ./internal/jobs
	$(GO) test -run '^$$' -bench 'RateCost' -benchtime 20000x ./internal/jobs
	$(GO) test -run '^$$' -bench 'Contention|HotResources' -benchtime 3x ./internal/jobs
	$(GO) test -run '^$$' -bench 'TickLateness' -benchtime 20x ./internal/scheduler
	$(GO) test -run '^$$' -bench 'Burst10k' -benchtime 2x ./internal/scheduler
	$(GO) test -run '^$$' -bench 'KillAtBurst' -benchtime 2x ./internal/scheduler

# bench-peers puts Lockstep's lock next to raw go-redis, bsm/redislock and
# redsync in one run (bench/peers, a module of its own: the peers are never
# dependencies of Lockstep): uncontended cycles at 1 and 64 goroutines, 16
# contenders on one key, interleaved repetitions, medians with their spread,
# commands and Redis CPU per cycle; and the rate limit beside
# go-redis/redis_rate (admissions/s, Redis CPU, over-grant); and issue 39's
# fairness scenario, FairBy beside plain asynq (B's last completion, Jain's
# index). About three minutes on 2 cores.
REPS ?= 5
bench-peers: deps
	cd bench/peers && $(GO) run . -reps $(REPS)

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet $(PKGS)

# run starts a whole Lockstep in one process (cmd/local): 2 scheduler replicas
# and 3 workers on an embedded Redis (or the one LOCKSTEP_REDIS_ADDR names), a
# demo schedule, and a summary line every 3s. Ctrl-C stops it; to run for a
# fixed time: make run RUNFLAGS=--duration=30s (or LOCKSTEP_LOCAL_DURATION=30s).
# Built, then run: `go run` would exit 1 after Ctrl-C whatever the program says.
# Built with -tags localonly into bin/run/: without the etcd back end and
# OpenTelemetry's SDK, which a local run on its embedded Redis does not use
# (half the packages to compile on a fresh machine); make build builds the
# full binaries into bin/.
.PHONY: run
RUNFLAGS ?=
run:
	$(GO) build -tags localonly -o bin/run/ ./cmd/local ./cmd/lockstep
	bin/run/local $(RUNFLAGS)

# chaos runs the real binaries (3 scheduler replicas, 3 workers, an AOF Redis)
# under a fault schedule drawn from SEED (empty: a new one, printed) for
# DURATION (FAULTS: a comma-separated subset of the fault kinds; empty: all;
# LOCK=etcd: the locks on a 3-member etcd cluster, with its faults added;
# STORE=postgres: the demo's fenced store in a private PostgreSQL;
# REDIS=cluster: the queue and the locks on a private Redis Cluster of 3
# masters with a replica each, with its faults added),
# prints a live line, checks the recorded history and writes
# OUT/chaos-report.md and OUT/chaos-report.json (and OUT/logs). It exits 1
# when the checker finds a violation. The run bounds each of its own phases,
# so the test binary runs without a global timeout.
.PHONY: chaos
DURATION ?= 10m
SEED     ?=
OUT      ?= chaos-out
FAULTS   ?=
LOCK     ?= redis
STORE    ?= redis
REDIS    ?= single
chaos: deps
	$(GO) test -c -o bin/chaos.test ./internal/chaos
	bin/chaos.test -test.run '^TestChaos$$' -test.v -test.timeout 0 \
		-chaos.duration $(DURATION) -chaos.seed $(or $(SEED),0) -chaos.out $(OUT) -chaos.faults '$(FAULTS)' -chaos.lock $(LOCK) -chaos.store $(STORE) -chaos.redis $(REDIS)
