# Lockstep: build, test, benchmark.
GO        ?= go
PKGS      ?= ./...
TESTFLAGS ?=

.PHONY: all build test bench lint deps

all: build

build:
	$(GO) build ./...
	$(GO) build -o bin/ ./cmd/... 2>/dev/null || true

# deps installs what the tests start: a real redis-server from Debian's packages.
deps:
	@scripts/deps.sh

test: deps
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -timeout 12m $(TESTFLAGS) $(PKGS)

# bench runs each benchmark next to its baseline in one run, so ratios can be
# read off one output; counts and times suit a 2-core machine (a few minutes).
bench: deps
	$(GO) test -run '^$$' -bench 'Cycle' -benchtime 3s -count 3 ./internal/lock
	$(GO) test -run '^$$' -bench 'Renew10k' -benchtime 20x ./internal/lock
	$(GO) test -run '^$$' -bench 'LossNotice' -benchtime 1x ./internal/watchdog
	$(GO) test -run '^$$' -bench 'Throughput' -benchtime 5000x -count 3 ./internal/jobs
	$(GO) test -run '^$$' -bench 'Contention|HotResources' -benchtime 3x ./internal/jobs
	$(GO) test -run '^$$' -bench 'TickLateness' -benchtime 20x ./internal/scheduler

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet $(PKGS)

# run starts a whole Lockstep in one process (cmd/local): 2 scheduler replicas
# and 3 workers on an embedded Redis (or the one LOCKSTEP_REDIS_ADDR names), a
# demo schedule, and a summary line every 3s. Ctrl-C stops it; to run for a
# fixed time: make run RUNFLAGS=--duration=30s (or LOCKSTEP_LOCAL_DURATION=30s).
# Built, then run: `go run` would exit 1 after Ctrl-C whatever the program says.
.PHONY: run
RUNFLAGS ?=
run:
	$(GO) build -o bin/local ./cmd/local
	bin/local $(RUNFLAGS)
