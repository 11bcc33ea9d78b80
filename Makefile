# Two commands for a fresh machine: `make setup` installs everything, `make test` runs the
# whole suite (lint, types, layering, unit, property, integration against PostgreSQL and
# SQLite, end-to-end against a real kube-apiserver).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup test run python control-plane peers helm postgres node browser lint unit e2e

setup: python control-plane peers helm postgres node browser

# Muster for real in one command: what `muster up` needs (the same cached steps as setup,
# without the peers and the browser), then a local cluster whose real node runs Muster's
# chart (two replicas, history in PostgreSQL), playing examples/demo.yaml with a live view
# until Ctrl-C. `.venv/bin/muster down` stops it and undoes what the node changed on the host.
run: python control-plane helm postgres node
	$(BIN)/muster up $(ARGS)

python:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'

# Built once from the Go module proxy into ~/.cache/muster/k8s-<version>/bin, then reused.
control-plane: python
	$(BIN)/muster local-cluster build

# The JobSet, Kubeflow Trainer, LeaderWorkerSet and KubeRay controllers (with their CRDs),
# built the same way into ~/.cache/muster/<peer>-<version>/; `muster local-cluster up --with
# jobset,trainer,lws,kuberay` runs them.
# Kueue is built only on demand, for the side-by-side benchmark (`--peers kueue`).
peers: control-plane
	$(BIN)/muster local-cluster build --peers jobset,trainer,lws,kuberay

# helm, built the same way into ~/.cache/muster/helm-<version>/bin and linked into .venv/bin.
helm: python
	ln -sf "$$(bash hack/install-helm.sh)" $(BIN)/helm

postgres:
	bash hack/install-postgres.sh

# The real node's Debian packages (containerd, runc, CNI plugins, iptables, buildah, ...),
# then its images, built without a Docker engine and cached by content in
# ~/.cache/muster/images: the pause image from Kubernetes' source, Muster's from the
# Dockerfile, the example Job's (examples/real-job).
node: control-plane
	bash hack/install-node.sh
	$(BIN)/muster local-cluster images

# Debian's Chromium: the html report's test opens the report in it, headless.
browser:
	bash hack/install-chromium.sh

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy quota

test: lint
	$(BIN)/pytest

unit:
	$(BIN)/pytest tests/unit -q

e2e:
	$(BIN)/pytest tests/e2e -m e2e
