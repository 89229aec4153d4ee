# ane-export: every workflow the README names. Targets install what they need.
#   make setup demo   set up, then run the main job on the bundled tiny model
#   make test         every test (Rust and Python), as CI runs it
#   make golden       regenerate golden/ with transformers (developer-only)
#   make bench        reference vs PyTorch benchmark, appended to BENCHMARKS.md

PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
DEV_VENV := .venv-dev
CARGO ?= cargo
DEMO := out/demo

.PHONY: setup venv build test test-rust test-python demo golden bench dev-venv clean

setup: venv build

venv: $(VENV)/.installed
$(VENV)/.installed: python/requirements.txt
	$(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -r python/requirements.txt
	touch $@

build:
	$(CARGO) build --release --locked

test: test-rust test-python

test-rust:
	$(CARGO) test --release --locked

test-python: venv
	cd python && ../$(VENV)/bin/python -m pytest -q

# The main job on the bundled tiny Qwen3-VL checkpoint: host preprocessing of
# two images into one call, then the fp32 reference tower on it.
demo: build
	mkdir -p $(DEMO)
	target/release/ane-run preprocess --model golden/models/tiny-a \
		--image golden/images/wide.jpg golden/images/rgba.png --out $(DEMO)/pixels.safetensors
	target/release/ane-export reference --model golden/models/tiny-a \
		--pixel-values $(DEMO)/pixels.safetensors --out $(DEMO)/reference.safetensors
	@echo "wrote $(DEMO)/pixels.safetensors and $(DEMO)/reference.safetensors"

dev-venv: $(DEV_VENV)/.installed
$(DEV_VENV)/.installed: python/requirements-dev.txt
	$(PY) -m venv $(DEV_VENV)
	$(DEV_VENV)/bin/python -m pip install -q --upgrade pip
	$(DEV_VENV)/bin/python -m pip install -q -r python/requirements-dev.txt
	touch $@

golden: dev-venv
	$(DEV_VENV)/bin/python python/golden/make_golden.py

bench: dev-venv build
	$(DEV_VENV)/bin/python python/bench/bench_tower.py --bin target/release/ane-export \
		--patches 1024 4096 --repeats 3 --out BENCHMARKS.md

clean:
	rm -rf out $(VENV) $(DEV_VENV)
	$(CARGO) clean
