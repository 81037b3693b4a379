SHELL := /bin/bash

# toolgate: build, run the demo, test.
#
#   make run    the gateway on its embedded demo default (caddyfile/demo.Caddyfile)
#   make test   everything CI runs: vet, formatting, unit and integration tests
#               with the race detector against real peers, every fuzzer for a
#               few seconds, and the MCP conformance suite through the gateway
#   make fuzz   every fuzzer for FUZZTIME each (default 60s)
#   make bench-compare
#               toolgate side by side with a plain Caddy reverse_proxy
#               against the performance budget (README, "Performance") (not part of test)
#   make reloads  config reloads under load, toolgate beside plain Caddy
#   make soak   ten minutes of load with sessions coming and going; memory,
#               goroutines and file descriptors every 30 s

GO ?= go

.PHONY: build run test vet unit conformance fuzz fuzz-short bench bench-compare reloads soak xcaddy clean

build:
	$(GO) build -ldflags "-X main.version=$$(git describe --always --dirty 2>/dev/null)" -o bin/toolgate ./cmd/toolgate

run:
	$(GO) run ./cmd/toolgate run --config caddyfile/demo.Caddyfile

# staticcheck, pinned, run from the module proxy (its checks: staticcheck.conf)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

vet:
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted"; exit 1; fi

# unit and integration tests (the integration package takes about ten
# minutes on a loaded two-core machine: hence the timeout); the peers they need (a real Vault, a
# KMS-compatible server) are built once and cached, PostgreSQL clusters are
# started from Debian's binaries (internal/pgtest), and
# TOOLGATE_REQUIRE_PEERS turns a missing peer into a failure instead of a
# skip.
unit:
	@vault_bin=$$(integration/vaultserver/build.sh) && \
	kms_bin=$$(integration/kmsserver/build.sh) && \
	TOOLGATE_REQUIRE_PEERS=1 TOOLGATE_VAULT_BIN="$$vault_bin" TOOLGATE_KMS_BIN="$$kms_bin" \
	$(GO) test -race -count=1 -timeout 45m -skip '^TestConformance$$' ./...
	@# tests built without the race detector (//go:build !race): quic-go's
	@# client races with itself in 0-RTT dials (integration/h2_attack_0rtt_norace_test.go)
	TOOLGATE_REQUIRE_PEERS=1 $(GO) test -count=1 -timeout 10m -run '^(TestH2AttackH3ZeroRTT|TestFixAttackH3ZeroRTT)' ./integration/

# the MCP conformance suite (pinned, installed from npm once) against the Go
# SDK's everything-server directly, through toolgate, and through three
# toolgate replicas on one PostgreSQL behind a round-robin load balancer;
# prints the summaries and fails on any difference
conformance:
	TOOLGATE_REQUIRE_PEERS=1 $(GO) test -race -count=1 -timeout 30m -v -run '^TestConformance$$' ./integration/ 2>&1 | grep -v '^{"level'; exit $${PIPESTATUS[0]}

# every fuzzer (package:Fuzzer); inputs that fail are kept by Go under the
# package's testdata/fuzz as regression seeds, which every `go test` runs
FUZZERS := internal/mcpmsg:FuzzParse internal/mcpmsg:FuzzEndsAdversarial internal/eventstream:FuzzReader modules/mcpproxy:FuzzSSEWriter \
	modules/mcpproxy:FuzzPrescanAdvDifferential \
	modules/policy:FuzzJSONTerm modules/policy:FuzzPlanMatchesTopdown modules/policy:FuzzScanDecidesAsThePolicy internal/regoplan:FuzzRecall \
	modules/ciphers/kms:FuzzParseEnvelope \
	modules/gateway:FuzzVerifyState modules/gateway:FuzzUnmarshalCaddyfile \
	modules/api:FuzzOAuthCallbackQuery
FUZZTIME ?= 60s

# Go before 1.27 can report the end of -fuzztime as a failure ("context
# deadline exceeded", no failing input: go.dev/issue/75804, a race in its
# fuzzing coordinator, seen under CPU load): such a run is made once more,
# and fails only if it happens again or an input fails.
fuzz:
	@listed=$$(printf '%s\n' $(FUZZERS) | sed 's/.*://' | sort); \
	found=$$(grep -rhoE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]+' . | sed 's/^func //' | sort); \
	if [ "$$listed" != "$$found" ]; then echo "FUZZERS in the Makefile and the fuzzers in the tree differ:"; \
		diff <(echo "$$listed") <(echo "$$found"); exit 1; fi
	@for f in $(FUZZERS); do \
		echo "fuzzing $${f#*:} in ./$${f%%:*} for $(FUZZTIME)"; \
		for try in 1 2; do \
			out=$$($(GO) test -run '^$$' -fuzz "^$${f#*:}$$" -fuzztime $(FUZZTIME) ./$${f%%:*} 2>&1); status=$$?; \
			grep -v '^fuzz: elapsed' <<<"$$out"; \
			[ $$status -eq 0 ] && break; \
			if [ $$try -eq 1 ] && grep -qx '    context deadline exceeded' <<<"$$out" && ! grep -q 'Failing input written to' <<<"$$out"; then \
				echo "Go's fuzzing reported its own -fuzztime deadline as a failure, with no failing input (go.dev/issue/75804); fuzzing again"; \
				continue; \
			fi; \
			exit 1; \
		done; \
	done

fuzz-short:
	@$(MAKE) --no-print-directory fuzz FUZZTIME=3s

test: vet unit fuzz-short conformance

# the benchmarks: the parser, policy evaluation, one tools/call through the
# whole pipeline (testing.B), and the open-loop load harness (direct vs
# through toolgate, p50/p99); they measure, they never fail on time
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./internal/mcpmsg/ ./modules/policy/
	$(GO) test -run '^$$' -bench 'BenchmarkToolCall' -benchmem ./integration/ 2>&1 | grep -v '^{"level'
	$(GO) test -run '^$$' -bench 'BenchmarkOpenLoop' -benchtime 1x ./integration/ 2>&1 | grep -v '^{"level'

# the side-by-side harness (cmd/toolgate-benchcompare): a go-sdk upstream
# (SSE- and JSON-answering), a plain Caddy reverse_proxy and toolgate with
# the default policies, each its own process, under open-loop load in
# interleaved rounds; prints the tables and the budget ratios and keeps
# results, logs and profiles in .bench-compare/. 15 to 30 minutes with the
# defaults; pass options in BENCH_ARGS, e.g.
#   make bench-compare BENCH_ARGS='-rounds 5 -duration 20s'
bench-compare: build
	$(GO) build -o bin/toolgate-benchcompare ./cmd/toolgate-benchcompare
	bin/toolgate-benchcompare -toolgate bin/toolgate $(BENCH_ARGS)
# config reloads under load (BenchmarkReloads): toolgate and a plain Caddy
# reverse_proxy in one process, RATE calls/s each, ten reloads through the
# admin API; prints the failed calls of each by kind (H2C=1: HTTP/2 without
# TLS). It measures, it never fails on figures.
RATE ?= 200
reloads:
	TOOLGATE_RELOAD_RATE=$(RATE) TOOLGATE_RELOAD_H2C=$(H2C) $(GO) test -run '^$$' -bench 'BenchmarkReloads' -benchtime 1x ./integration/ 2>&1 | grep -v '^{"level'; exit $${PIPESTATUS[0]}

# the soak (BenchmarkSoak): the toolgate binary at SOAK_RATE calls/s for
# SOAK (default 10m) with sessions created and ended throughout; prints
# RSS, heap, goroutines and open fds every 30 s and fails if they grow past
# its bounds after the first minute
SOAK ?= 10m
SOAK_RATE ?= 200
soak:
	TOOLGATE_SOAK_DURATION=$(SOAK) TOOLGATE_SOAK_RATE=$(SOAK_RATE) $(GO) test -run '^$$' -bench 'BenchmarkSoak' -benchtime 1x -timeout 0 ./integration/ 2>&1 | grep -v '^{"level'; exit $${PIPESTATUS[0]}

# a custom binary with the Caddy plugins listed in xcaddy.json
xcaddy:
	$(GO) run ./cmd/toolgate-build -manifest xcaddy.json

clean:
	rm -rf bin .toolgate-demo .bench-compare
