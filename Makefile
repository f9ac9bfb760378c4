# Cotal: signer-isolated daemons. `make run` starts the local stack, `make test` runs every test.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
export GOTOOLCHAIN := auto

GO        ?= go
BUF       := $(GO) tool -modfile=tools/buf.mod buf
STATICCHECK := $(GO) tool -modfile=tools/staticcheck.mod staticcheck
DEV_DIR   ?= .cotal-dev
NPM       ?= npm
TS_DIR    := sdk/ts
# Everything buf generates; `make check-generated` fails when any of it differs from the commit.
GEN_DIRS  := pkg/gen $(TS_DIR)/src/gen
FUZZTIME  ?= 4s
# package:FuzzTarget pairs run by `make fuzz` (and so by `make check`) for $(FUZZTIME) each:
# every decoder of untrusted bytes.
FUZZ_TARGETS ?= \
	signerd/internal/server:FuzzParseMint \
	signerd/internal/policy:FuzzParse \
	signerd/internal/policy:FuzzChannelMatch \
	signerd/internal/audit:FuzzVerify \
	pkg/space:FuzzNames \
	pkg/profiles:FuzzBuild \
	pkg/creds:FuzzParseCreds \
	pkg/trust:FuzzLoadSpace \
	pkg/mtls:FuzzParseID \
	pkg/mtls:FuzzParseCAPool

.PHONY: all generate check-generated lint test test-go test-ts fuzz bench check run build clean

all: check

## generate: regenerate pkg/gen (Go) and sdk/ts/src/gen (TypeScript) from proto/ with buf and the
## pinned local plugins (Go tools in go.mod, protoc-gen-es from sdk/ts's lockfile).
generate: $(TS_DIR)/node_modules
	$(BUF) generate

## sdk/ts/node_modules: the TypeScript SDK's dependencies, exactly as its lockfile pins them.
$(TS_DIR)/node_modules: $(TS_DIR)/package.json $(TS_DIR)/package-lock.json
	cd $(TS_DIR) && $(NPM) ci --no-audit --no-fund
	@touch $@

## check-generated: regenerate and fail if the committed generated code differs or a generated
## file is not committed.
check-generated: generate
	@if [ -n "$$(git status --porcelain --untracked-files=all -- $(GEN_DIRS))" ]; then \
		echo "generated code is stale; run 'make generate' and commit:"; \
		git status --porcelain --untracked-files=all -- $(GEN_DIRS); git --no-pager diff --stat -- $(GEN_DIRS); exit 1; \
	fi

## lint: buf lint, gofmt, go vet, staticcheck.
lint:
	$(BUF) lint
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...

## test: every test: the Go tests with the race detector, then the TypeScript SDK's.
test: test-go test-ts

## test-go: the Go tests with the race detector.
test-go:
	$(GO) test -race -count=1 ./...

## test-ts: build bin/signerd, then the TypeScript SDK (tsc) and its node --test suite against
## that signerd.
test-ts: $(TS_DIR)/node_modules
	$(GO) build -o bin/signerd ./signerd
	cd $(TS_DIR) && SIGNERD_BIN="$(CURDIR)/bin/signerd" $(NPM) test

## fuzz: run each fuzz target briefly.
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg="$${t%%:*}"; fn="$${t##*:}"; \
		echo "fuzz $$fn in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run='^$$' -fuzz="^$$fn\$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=1s "./$$pkg"; \
	done

## bench: the benchmarks recorded in BENCHMARKS.md.
bench:
	$(GO) test -run='^$$' -bench=. -benchmem ./...

## check: everything CI runs.
check: check-generated lint test fuzz

## build: the binaries into ./bin.
build:
	$(GO) build -o bin/ ./...

## run: the local stack from ./$(DEV_DIR).
run:
	$(GO) build -o bin/signerd ./signerd
	$(GO) run ./deploy/local/cotal-dev --dir $(DEV_DIR) --signerd bin/signerd

clean:
	rm -rf bin $(TS_DIR)/dist $(TS_DIR)/dist-test
