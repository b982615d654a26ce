# One venv for everything local; the serving image installs only the `serve` extra.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
EPOCHS  ?= 10
API_PORT ?= 8000
DEMO_PORT ?= 7860

.PHONY: install test demo serve train export fetch bench docker-smoke clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0   # the CPU wheel; an unpinned torch pulls CUDA packages
	$(BIN)/pip install -q -e '.[serve,train,demo,dev]'

install: $(BIN)/python

test: $(BIN)/python            ## run the test suite (what .ci/run runs)
	$(BIN)/python -m pytest -q

fetch: $(BIN)/python           ## download and verify MNIST into data/mnist
	$(BIN)/python -m training.data fetch

train: fetch                   ## train a CapsNet (EPOCHS=10 by default)
	$(BIN)/python -m training.train --epochs $(EPOCHS)

export: $(BIN)/python          ## export runs/mnist/best.pt to model/*.onnx and the model card
	$(BIN)/python -m training.export

clean:
	rm -rf $(VENV) .pytest_cache runs
