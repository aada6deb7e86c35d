# Quick start:   make demo   (runs the main job: on a GPU if present, else a small CPU version)
#                make test   (runs the CPU test suite)
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin

.PHONY: demo test test-gpu install venv clean

# The environment with a torch: the machine's where there is one, otherwise the CPU build of torch 2.13.0.
# --system-site-packages sees a system or conda interpreter's torch; when $(PYTHON) is itself a virtualenv
# (uv, the GPU machine), tools/parent_site.py adds that environment's site-packages too, so its torch is
# reused instead of downloaded (which fails offline).
$(VENV)/.torch-ready:
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PYTHON) tools/parent_site.py $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet torch==2.13.0
	touch $@

$(BIN)/perflab: pyproject.toml $(VENV)/.torch-ready
	$(BIN)/pip install --quiet -e '.[test,ray,hf]'
	touch $@

venv: $(VENV)/.torch-ready

install: $(BIN)/perflab

demo: $(BIN)/perflab
	$(BIN)/perflab demo

# Two workers, a test file (tests/conftest.py's groups) each at a time: the Ray and sweep tests spend most of their
# time waiting on processes, which the other worker's tests fill
test: $(BIN)/perflab
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

test-gpu: $(BIN)/perflab
	$(BIN)/python -m pytest -q -m gpu tests/gpu

clean:
	rm -rf $(VENV) src/*.egg-info
