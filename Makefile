# Hermes Secure Link. `make run` runs the front with zero configuration;
# `make test` runs every check CI runs.
GO ?= go
BIN ?= bin/securelink
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)

PREFIX ?= /usr/local
DESTDIR ?=
UNITDIR ?= /etc/systemd/system
CONFDIR ?= /etc/securelink

.PHONY: pgo bench-http1 all build run test vet fmt-check units install install-check bench fuzz soak clean

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
test: fmt-check vet build units install-check
	./scripts/ensure-test-deps.sh
	$(GO) test -race -count=1 -timeout 12m ./...
	# the raw system calls made outside the race detector (internal/rawsock's
	# sys_raw.go): the broker's sockets, the front's client sockets and
	# upstream legs
	$(GO) test -count=1 ./internal/rawsock/ ./broker/msgconn/ ./proxy/ ./relay/

# systemd-analyze verify clean and exposure <= 2.0 for every shipped unit.
units: build
	./scripts/check-units.sh

# Installs the binary, the units (ExecStart pointing at $(PREFIX)/bin) and the
# example configuration (as $(CONFDIR)/config.yaml only when absent), and
# creates the service users when installing for real (no DESTDIR, as root).
install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/securelink
	install -d -m 0755 $(DESTDIR)$(UNITDIR) $(DESTDIR)$(CONFDIR) $(DESTDIR)$(PREFIX)/share/doc/securelink
	for u in systemd/*.service; do \
		sed 's|/usr/local/bin/securelink|$(PREFIX)/bin/securelink|; s|/usr/local/share/doc|$(PREFIX)/share/doc|' $$u > $(DESTDIR)$(UNITDIR)/$$(basename $$u); \
		chmod 0644 $(DESTDIR)$(UNITDIR)/$$(basename $$u); \
	done
	install -m 0644 config.example.yaml README.md $(DESTDIR)$(PREFIX)/share/doc/securelink/
	[ -e $(DESTDIR)$(CONFDIR)/config.yaml ] || install -m 0644 config.example.yaml $(DESTDIR)$(CONFDIR)/config.yaml
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then \
		for u in securelink securelink-broker; do \
			getent passwd $$u >/dev/null || useradd --system --user-group --no-create-home \
				--home-dir /var/lib/$$u --shell /usr/sbin/nologin $$u; \
		done; \
		command -v systemctl >/dev/null && systemctl daemon-reload || true; \
	fi

# `make install` into a scratch DESTDIR, checked file by file.
install-check:
	./scripts/check-install.sh

bench: build
	./bench/run.sh

# What serving HTTP/1.1 outside net/http could win for the small GET: the
# front, nginx and fasthttp (its own module, not the product's) side by
# side (docs/decisions.md).
bench-http1: build
	./bench/http1-spike/run.sh

# Writes cmd/securelink/default.pgo, the CPU profile `go build` applies for
# profile-guided optimization, from the bench's loads against a build with
# -tags pgoprofile, about 3 minutes (bench/pgo.sh). None is committed: it
# measured no gain (docs/decisions.md).
pgo:
	./bench/pgo.sh

# Every fuzz target for FUZZTIME each (default 60s), one after another; not
# part of `make test`, which replays the seed corpora (and committed crashers).
FUZZTIME ?= 60s
fuzz:
	FUZZTIME=$(FUZZTIME) ./scripts/fuzz.sh

# The built daemons under steady loopback load for SOAK_MINUTES (default 10);
# fails on resource growth after warm-up or on any client error.
SOAK_MINUTES ?= 10
soak: build
	SOAK_MINUTES=$(SOAK_MINUTES) ./bench/soak.sh

# Reach interop with the Python reference, both directions (not part of
# `make test`: no registry carries it). REF is a checkout of
# Codename-11/hermes-relay; nothing of it is copied into this tree.
.PHONY: interop
interop: build
	./interop/run.sh "$(REF)"

clean:
	rm -rf bin
