# Hermes Secure Link. `make run` runs the front with zero configuration;
# `make test` runs every check CI runs.
GO ?= go
BIN ?= bin/securelink
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: all build run test vet fmt-check race bench clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/securelink

run: build
	./$(BIN) serve

fmt-check:
	@out=$$(gofmt -l .); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...

# The whole suite, race detector on; fuzz targets run their seed corpora.
test: fmt-check vet build
	./scripts/ensure-test-deps.sh
	$(GO) test -race -count=1 -timeout 12m ./...

bench: build
	./bench/run.sh

clean:
	rm -rf bin
