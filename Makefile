# Cotal: signer-isolated daemons. `make run` starts the local stack, `make test` runs every test.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
export GOTOOLCHAIN := auto

GO        ?= go
BUF       := $(GO) tool -modfile=tools/buf.mod buf
STATICCHECK := $(GO) tool -modfile=tools/staticcheck.mod staticcheck
DEV_DIR   ?= .cotal-dev
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

.PHONY: all generate check-generated lint test fuzz bench check run build clean

all: check

## generate: regenerate pkg/gen from proto/ with buf and the pinned local plugins.
generate:
	$(BUF) generate

## check-generated: regenerate and fail if the committed generated code differs.
check-generated: generate
	@if [ -n "$$(git status --porcelain -- pkg/gen)" ]; then \
		echo "generated code is stale; run 'make generate' and commit:"; \
		git status --porcelain -- pkg/gen; git --no-pager diff --stat -- pkg/gen; exit 1; \
	fi

## lint: buf lint, gofmt, go vet, staticcheck.
lint:
	$(BUF) lint
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...

## test: every test with the race detector (the README's test command).
test:
	$(GO) test -race -count=1 ./...

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
	rm -rf bin
