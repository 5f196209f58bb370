# memkeep: `make run` builds and starts a server on ./data; `make test` installs what the tests
# need and runs them all.

CARGO ?= cargo
DATA  ?= ./data

.PHONY: all build run test deps lint unit conformance clean

all: build

build:
	$(CARGO) build --release

run: build
	./target/release/memkeep -H $(DATA)

# Tools the tests talk to (memcached for conformance, libmemcached's memccapable, ...).
deps:
	./scripts/install-test-deps.sh

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

unit:
	$(CARGO) test --release

test: deps lint unit

# Replays the golden transcripts against real memcached and redis-server, proving the goldens
# right (cases that need memkeep's clock or restarts are skipped there).
conformance: deps
	MEMKEEP_CONFORMANCE=memcached $(CARGO) test --release --test transcripts
	MEMKEEP_CONFORMANCE=redis $(CARGO) test --release --test transcripts

clean:
	$(CARGO) clean
