# Lockstep: build, test, benchmark.
GO        ?= go
PKGS      ?= ./...
TESTFLAGS ?=
BENCH     ?= .
BENCHTIME ?= 2s

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
	$(GO) test -race -timeout 12m $(TESTFLAGS) $(PKGS)

bench: deps
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem $(PKGS)

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1; }
	$(GO) vet $(PKGS)
