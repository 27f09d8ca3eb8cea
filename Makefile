# quotad — the developer's entry points. `make help` lists them.

GO        ?= go
SUDO      := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
TOOLS     := $(CURDIR)/.tools
BUF       := $(TOOLS)/node_modules/.bin/buf
# Fuzz budgets are execution counts, not durations: with a duration, Go 1.26's fuzz coordinator
# can report "context deadline exceeded" as a failure when the time runs out while a worker is
# mid-input (golang/go#75804, fixed in Go 1.27), which failed CI once on a loaded machine with
# no failing input. The counts are about 10 s each on the build machine: the request and config
# parsers run ~2,000-4,000 inputs a second, the reply and gossip decoders ~8,000-20,000.
FUZZTIME      ?= 20000x
FUZZTIME_FAST ?= 150000x
BENCHTIME ?= 1s
# helm renders the chart in deploy/helm in `make test`; built from the Go module proxy.
HELM_VERSION ?= v3.22.0
HELM      := $(TOOLS)/helm-$(HELM_VERSION)/helm
GRPCURL_VERSION ?= v1.9.4
GRPCURL   := $(TOOLS)/grpcurl-$(GRPCURL_VERSION)/grpcurl
# -buildvcs=auto overrides a GOFLAGS=-buildvcs=false, so that `quotad version` names the
# commit (the Go toolchain stamps it from git when the checkout's .git is a directory).
BUILDFLAGS := -buildvcs=auto -trimpath

.PHONY: help run build install test soak redis-server memcached chromium helm grpcurl shell-tools lint proto proto-check bench cluster screenshots

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

run: ## run quotad on :8080 with the embedded memory store
	$(GO) run ./cmd/quotad

build: ## build bin/quotad, stamped with its version and commit (bin/quotad version)
	$(GO) build $(BUILDFLAGS) -o bin/quotad ./cmd/quotad

install: ## install quotad into $(go env GOBIN), else $(go env GOPATH)/bin
	$(GO) install $(BUILDFLAGS) ./cmd/quotad
	@d=$$($(GO) env GOBIN); echo "installed $${d:-$$($(GO) env GOPATH)/bin}/quotad"

test: redis-server memcached chromium helm grpcurl shell-tools lint ## the whole test suite (installs redis-server, memcached, chromium, helm, grpcurl, curl and jq when missing)
	HELM=$(HELM) GRPCURL=$(GRPCURL) $(GO) test -race -count=1 -timeout 12m ./...
	$(GO) test -run '^$$' -fuzz '^FuzzCheckRequest$$' -fuzztime $(FUZZTIME) ./rpc
	$(GO) test -run '^$$' -fuzz '^FuzzConfigFile$$' -fuzztime $(FUZZTIME) ./cmd/quotad
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeAcquireReply$$' -fuzztime $(FUZZTIME_FAST) ./algorithms
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeGossip$$' -fuzztime $(FUZZTIME_FAST) ./node/cluster

SOAK ?= 60s

soak: redis-server ## the soak, SOAK (60s) a phase: 3 nodes under legit load; a baseline, every attack on node 1, a baseline again; node 1's p99 within 1.5x the others' (no -race)
	QUOTAD_SOAK=$(SOAK) $(GO) test -count=1 -timeout 20m -v -run '^TestSoakAttacksOnOneNode$$' ./cmd/quotad

CLUSTER_REDIS_PORT ?= 6390
CLUSTER_API_PORT   ?= 8080
CLUSTER_GOSSIP_PORT ?= 7946

# CLUSTER_BIN, when set, is the quotad binary `make cluster` runs instead of building one.
CLUSTER_BIN ?=

cluster: redis-server ## a local three-node cluster on 127.0.0.1-3 sharing one redis-server; refuses taken ports (Ctrl-C stops it)
	@bin="$(CLUSTER_BIN)"; if [ -z "$$bin" ]; then bin=$(TOOLS)/bin/quotad; $(GO) build -o $$bin ./cmd/quotad || exit 1; fi; \
	QUOTAD_BIN=$$bin CLUSTER_REDIS_PORT=$(CLUSTER_REDIS_PORT) CLUSTER_API_PORT=$(CLUSTER_API_PORT) \
	CLUSTER_GOSSIP_PORT=$(CLUSTER_GOSSIP_PORT) exec bash deploy/local-cluster.sh

redis-server: ## install redis-server (and redis-cli) when missing
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || \
		{ echo "installing redis-server"; $(SUDO) apt-get update -qq && \
		  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq redis-server >/dev/null; }
	@redis-server --version

memcached: ## install memcached when missing (tests start their own on free ports, never use one on 11211)
	@command -v memcached >/dev/null || \
		{ echo "installing memcached"; $(SUDO) apt-get update -qq && \
		  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq memcached >/dev/null; }
	@memcached -V

shell-tools: ## install curl and jq (the docs' examples, which the tests run, use them) when missing
	@command -v curl >/dev/null && command -v jq >/dev/null || \
		{ echo "installing curl and jq"; $(SUDO) apt-get update -qq && \
		  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq curl jq >/dev/null; }

chromium: ## install Debian's chromium (the console's browser test drives it) when missing
	@command -v chromium >/dev/null || \
		{ echo "installing chromium"; $(SUDO) apt-get update -qq && \
		  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium fonts-liberation >/dev/null; }
	@chromium --version 2>/dev/null

screenshots: redis-server chromium ## rewrite docs/console-*.png from the console's browser tests: the Playground on one node, the Live view on node-3 of a three-node cluster
	$(GO) test -count=1 -run '^(TestConsoleInChromium|TestConsoleLiveViewShowsTheClusterFromAMemberWithoutLoad)$$' ./cmd/quotad -args -console.screenshots $(CURDIR)/docs

helm: ## install helm $(HELM_VERSION) into .tools/helm-$(HELM_VERSION) when missing (go install; minutes the first time)
	@[ -x $(HELM) ] || { echo "installing helm $(HELM_VERSION) into $(dir $(HELM))"; \
		GOBIN=$(dir $(HELM)) GOFLAGS=-buildvcs=false $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION); }
	@echo "helm: $(HELM)"

grpcurl: ## install grpcurl $(GRPCURL_VERSION) into .tools/grpcurl-$(GRPCURL_VERSION) when missing (the docs' gRPC examples, which the tests run, use it)
	@[ -x $(GRPCURL) ] || { echo "installing grpcurl $(GRPCURL_VERSION) into $(dir $(GRPCURL))"; \
		GOBIN=$(dir $(GRPCURL)) GOFLAGS=-buildvcs=false $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION); }
	@echo "grpcurl: $(GRPCURL)"

# lint runs three checkers, each for what the others miss:
#  - go vet: the toolchain's checks of suspicious constructs (printf verbs, copied locks,
#    struct tags, unreachable code, ...);
#  - gofmt: one layout for every Go file;
#  - staticcheck, pinned to STATICCHECK_VERSION, with every check but ST1000: SA (bugs:
#    a value compared with itself, deprecated APIs, misused standard library), S
#    (simplifications), ST (style: error strings, receiver names, initialisms, doc comments
#    that start with the name they document, as docs/architecture.md asks) and the checks
#    staticcheck leaves off by default, which the code passes too. ST1000 (a package
#    comment) is off because the generated packages under proto/ have none.
# `go run pkg@version` builds staticcheck once into the Go build cache: the first run on a
# machine takes a minute or two (download, build, analysis of every package; measured
# 2m40s to build and 1m40s to analyse on this 2-core box under a load of 12), later runs
# seconds (4s unchanged, under a minute after edits).
STATICCHECK_VERSION ?= v0.8.2

lint: ## go vet, gofmt and staticcheck (see the comment above the target)
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
		if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) -checks all,-ST1000 ./...

proto: ## regenerate the protobuf code (buf from npm, local plugins only)
	@[ -x $(BUF) ] || { mkdir -p $(TOOLS) && cd $(TOOLS) && npm install --silent --no-save @bufbuild/buf@1.75.0 >/dev/null; }
	GOBIN=$(TOOLS)/bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	GOBIN=$(TOOLS)/bin $(GO) install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.19.1
	PATH=$(TOOLS)/bin:$$PATH $(BUF) lint
	PATH=$(TOOLS)/bin:$$PATH $(BUF) generate --template proto/buf.gen.yaml

proto-check: proto ## fail if regenerating the protobuf code changes anything
	git diff --exit-code -- proto

bench: redis-server ## Go benchmarks: models, scripts, lease and denied-cache hits
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) ./algorithms ./node ./cache
