# Quick start:   make demo   (runs the main job: on a GPU if present, else a small CPU version)
#                make test   (runs the CPU test suite)
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin

.PHONY: demo test test-gpu install clean

$(BIN)/perflab: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	# Use the machine's torch where there is one (GPU machines); otherwise the CPU build of torch 2.13.0.
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test,ray]'
	touch $@

install: $(BIN)/perflab

demo: $(BIN)/perflab
	$(BIN)/perflab demo

test: $(BIN)/perflab
	$(BIN)/python -m pytest -q

test-gpu: $(BIN)/perflab
	$(BIN)/python -m pytest -q -m gpu tests/gpu

clean:
	rm -rf $(VENV) src/*.egg-info
