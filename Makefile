# Meridian — make help lists the targets.
SHELL := /bin/bash
GO ?= go
PKG := github.com/meridian-llm/meridian
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
BIN := bin/meridian
# Packages whose tests run under the race detector (all of them: most have goroutines).
RACE_PKGS ?= ./...
BENCH_COUNT ?= 5
FUZZTIME ?= 20s
# staticcheck is pinned; make lint installs it into bin/ when it is missing or
# of another version, so a fresh machine needs only Go.
STATICCHECK_VERSION := 0.8.2
STATICCHECK := $(CURDIR)/bin/staticcheck

.PHONY: help demo test bench fuzz lint build clean ui-check

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

demo: ## run 3 regions on loopback with live traffic, a failover and a status page (meridian demo; DEMO_FLAGS=--help)
	@$(GO) run -ldflags "$(LDFLAGS)" ./cmd/meridian demo $(DEMO_FLAGS)

test: ## vet, then every test (race detector on; one package at a time: the end-to-end tests start whole fleets)
	$(GO) vet ./...
	$(GO) test -race -p 1 -timeout 30m $(RACE_PKGS)
	$(GO) test -count 1 -run '^TestSecuritySlowBodyFlood$$' ./scenarios/fleet/
	$(GO) test -count 1 -gcflags=-d=checkptr -run '^TestPropertyGrowthMatchesStopTheWorld$$' ./index/
	$(GO) test -count 1 -run '^TestResidencyUnderPressure$$' ./scenarios/sim/

bench: ## run the benchmarks behind every published target and print a table (about 15 minutes)
	@mkdir -p bin
	@: > bin/bench.txt
	$(GO) test -run '^$$' -bench 'Benchmark(Lookup|NaiveLookup|Register|Memory|GrowthPause)' -benchmem -count $(BENCH_COUNT) -cpu 1,2 ./index/ | tee -a bin/bench.txt
	$(GO) test -run '^$$' -bench 'BenchmarkDecodeApply(Parallel)?$$' -benchmem -count $(BENCH_COUNT) ./regional/kvevents/ | tee -a bin/bench.txt
	$(GO) test -run '^$$' -bench 'Benchmark(Decide|Place|BacklogMs)$$' -benchmem -count $(BENCH_COUNT) ./regional/route/ | tee -a bin/bench.txt
	$(GO) test -run '^$$' -bench 'Benchmark(TokenizeAndDecide|SessionTokenization)$$' -benchmem -count $(BENCH_COUNT) ./regional/ | tee -a bin/bench.txt
	$(GO) test -run '^$$' -bench 'BenchmarkProxyOverhead/' -benchtime 3000x -count $(BENCH_COUNT) ./regional/ | tee -a bin/bench.txt
	$(GO) test -run '^$$' -bench 'Benchmark(IngestKafka|IngestApply)$$' -benchtime 3x -count $(BENCH_COUNT) ./regional/ | tee -a bin/bench.txt
	$(GO) test -run '^$$' -bench 'BenchmarkE2ESharedPrefixTTFT$$' -benchtime 1x -count $(BENCH_COUNT) ./regional/ | tee -a bin/bench.txt
	$(GO) test -run '^$$' -bench 'BenchmarkReadPath$$' -benchmem -count $(BENCH_COUNT) ./global/ | tee -a bin/bench.txt
	$(GO) test -run '^$$' -bench 'Benchmark(PolicyApply|FailoverPropagation)$$' -benchtime 200x -count $(BENCH_COUNT) ./global/ | tee -a bin/bench.txt
	$(GO) test -run '^$$' -bench 'BenchmarkAppend$$/appenders=256$$' -count $(BENCH_COUNT) ./global/audit/ | tee -a bin/bench.txt
	$(GO) test -run '^$$' -bench 'Benchmark(Build1M|Depth)$$' -benchmem -count $(BENCH_COUNT) ./regional/summary/ | tee -a bin/bench.txt
	$(GO) test -run '^$$' -bench 'BenchmarkEvaluate$$' -benchmem -count $(BENCH_COUNT) ./residency/ | tee -a bin/bench.txt
	@$(GO) run ./scripts/benchtable.go bin/bench.txt

fuzz: ## run each fuzz target for FUZZTIME
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list 'Fuzz.*' $$pkg 2>/dev/null | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

lint: ## gofmt, go vet and staticcheck (pinned; installed into bin/ on first use)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@$(STATICCHECK) -version 2>/dev/null | grep -qF '($(STATICCHECK_VERSION))' || { \
	  echo "installing staticcheck v$(STATICCHECK_VERSION) into bin/"; rm -f $(STATICCHECK); \
	  GOBIN=$(CURDIR)/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@v$(STATICCHECK_VERSION); }
	$(STATICCHECK) ./...

ui-check: ## start the demo, render a controller's /ui and the sim report in headless Chromium (installed if missing) and check them
	scripts/ui-check

build: ## build bin/meridian with the version stamped in
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/meridian

clean: ## remove build output
	rm -rf bin
