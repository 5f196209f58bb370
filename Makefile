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
	python3 -m unittest bench/test_bench.py

test: deps lint unit

# Replays the golden transcripts against real memcached and redis-server, proving the goldens
# right (cases that need memkeep's clock or restarts are skipped there), runs the
# client-library programs (ioredis, node-redis, phpredis, redis-rb) against redis-server, and
# Redis's own tcl unit tests for the data types against both (`make redis-tests`).
conformance: deps
	MEMKEEP_CONFORMANCE=memcached $(CARGO) test --release --test transcripts
	MEMKEEP_CONFORMANCE=memcached $(CARGO) test --release --test binary_vectors
	MEMKEEP_CONFORMANCE=redis $(CARGO) test --release --test transcripts
	MEMKEEP_CONFORMANCE=redis $(CARGO) test --release --test client_libs
	MEMKEEP_CONFORMANCE=redis $(CARGO) test --release --test scripting
	$(MAKE) redis-tests

# Redis 7.0.15's own tcl unit tests for strings, counters, keys, expiry, scans, lists, sets,
# sorted sets, hashes and MULTI (scripts/redis-tcl-suite.py): each file runs against a fresh
# memkeep and a fresh redis-server as external servers; fails when memkeep passes fewer than
# 95% of the tests redis-server passes. The first run downloads Redis's source tarball into
# ~/.cache/memkeep (sha256 checked). About 6 minutes on 2 cores. REDIS_TESTS_ARGS adds flags
# (--failures lists memkeep's failing tests, --logs DIR keeps each run's output).
REDIS_TESTS_ARGS ?=
.PHONY: redis-tests
redis-tests: deps
	$(CARGO) build --release
	python3 scripts/redis-tcl-suite.py $(REDIS_TESTS_ARGS)

clean:
	$(CARGO) clean

# Benchmarks against memcached and Redis (bench/run.py; installs what it needs through
# bench/deps.sh): writes BENCHMARKS.md (keeping its `## Data larger than memory` section) and
# bench/throughput.svg; 10-18 minutes on 2 cores. `bench/run.py --only scaling` runs the
# connection sweep alone, `--only multi,queue` the durable transaction and queue workloads.
# `make bench-quick` is a smoke run at 5% of the sizes, written to $(BENCH_QUICK_OUT).
BENCH_QUICK_OUT ?= /tmp/memkeep-bench-quick
.PHONY: bench bench-quick
bench:
	./bench/deps.sh
	.venv/bin/python bench/run.py --out BENCHMARKS.md --chart bench/throughput.svg

bench-quick:
	./bench/deps.sh
	.venv/bin/python bench/run.py --scale 0.05 --out $(BENCH_QUICK_OUT)/BENCHMARKS.md \
		--chart $(BENCH_QUICK_OUT)/throughput.svg --keep-json $(BENCH_QUICK_OUT)/results.jsonl

# Data larger than memory (bench/bigdata.py; needs root for the cgroups and drop_caches, so it
# runs through sudo otherwise): memkeep in each sync mode, redis (AOF everysec) and memcached,
# each alone in a memory-capped cgroup (default 1 GiB; 3 GB of 20 KiB values, 5M 100-byte
# values, a mixed 90/10 phase, a zipfian cache phase), against fio on the same file system.
# Rewrites only the `## Data larger than memory` section of BENCHMARKS.md. Up to about an hour
# (every phase stops after 120 s); BIGDATA_ARGS adds flags (bench/bigdata.py --help).
# `make bench-bigdata-quick` is a 256 MiB-cap smoke run written to $(BENCH_QUICK_OUT).
BIGDATA_ARGS ?=
AS_ROOT := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
.PHONY: bench-bigdata bench-bigdata-quick
bench-bigdata:
	./bench/deps.sh
	$(CARGO) build --release
	$(AS_ROOT) .venv/bin/python bench/bigdata.py --no-build --out BENCHMARKS.md $(BIGDATA_ARGS)

bench-bigdata-quick:
	./bench/deps.sh
	$(CARGO) build --release
	mkdir -p $(BENCH_QUICK_OUT)
	$(AS_ROOT) .venv/bin/python bench/bigdata.py --no-build --cap 256m --big-keys 40000 --small-keys 500000 \
		--max-secs 20 --fio-secs 10 --out $(BENCH_QUICK_OUT)/BENCHMARKS.md \
		--keep-json $(BENCH_QUICK_OUT)/bigdata.jsonl $(BIGDATA_ARGS)

# Soak test: 5 minutes of mixed memcached + RESP load with graceful and kill -9 restarts every
# 30 s, every reply checked against a client-side model, server RssAnon checked flat. `make
# test` runs the same test for 20 s; MEMKEEP_SOAK_SECS, _RESTART_SECS, _THREADS, _SEED tune it.
.PHONY: soak
soak:
	MEMKEEP_SOAK_SECS=300 $(CARGO) test --release --test soak -- --nocapture

# Crash safety, long form: 60 SIGKILLs (under load, during startup, during the expiry sweep) on
# one data dir, every acknowledged write checked after each restart.
.PHONY: crash
crash:
	MEMKEEP_CRASH_KILLS=60 $(CARGO) test --release --test crash -- --nocapture

# Failover, long form: 20 failovers driven by three real redis-sentinel processes (kill -9 of
# the primary under a redis-py Sentinel client's writes each time); prints the table: promoted,
# writes lost after WAIT 1 (must be 0), plain acknowledged writes lost, time to the new primary.
# `make test` runs one. MEMKEEP_FAILOVERS sets the count.
FAILOVERS ?= 20
.PHONY: failover
failover: deps
	MEMKEEP_FAILOVERS=$(FAILOVERS) $(CARGO) test --release --test failover -- --nocapture

# Power loss, long form: 50 cuts per sync mode on cutfs (tests/powerloss/: a FUSE file system
# that forgets unsynced writes), each store read back through both protocols; prints the table.
# Each mode also runs with --value-log-min 4k (always+vlog, ...); MEMKEEP_POWERLOSS_MODES=always,never+vlog
# picks modes, MEMKEEP_POWERLOSS_SEED replays.
# Needs /dev/fuse and fusermount3 (`make deps` installs fuse3).
POWERLOSS_CUTS ?= 50
.PHONY: powerloss
powerloss: deps
	MEMKEEP_POWERLOSS_CUTS=$(POWERLOSS_CUTS) $(CARGO) test --release --test powerloss -- --nocapture

# Fuzzing (tests/fuzz/README.md): each cargo-fuzz target for FUZZ_SECS seconds on the committed
# corpus, new finds in $(FUZZ_SCRATCH); installs cargo-fuzz if missing, needs a nightly toolchain.
FUZZ_SECS ?= 60
FUZZ_SCRATCH ?= /tmp/memkeep-fuzz
.PHONY: fuzz
fuzz:
	FUZZ_SECS=$(FUZZ_SECS) FUZZ_SCRATCH=$(FUZZ_SCRATCH) CARGO=$(CARGO) ./tests/fuzz/run.sh
