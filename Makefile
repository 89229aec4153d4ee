# ane-export: every workflow the README names. Targets install what they need.
#   make install PREFIX=DIR  install ane-export and ane-run with what they need into DIR (default /usr/local)
#   make setup demo   set up, then run the main job on the bundled tiny model
#   make test         lints, every test (Rust and Python) and the macOS type check, as CI runs it
#   make test-install install into a temporary prefix and run build, gate, embed and vqa from elsewhere
#   make golden       regenerate golden/ with transformers (developer-only)
#   make golden-vlm   retrain the golden tiny VLM on easy-vqa (developer-only)
#   make golden-vlm-q25 retrain the golden tiny Qwen2.5-VL VLM (developer-only)
#   make golden-qwen2 regenerate the Qwen2.5-VL and Qwen2-VL goldens (developer-only)
#   make golden-qwen-massive regenerate the Qwen towers with massive activations (developer-only)
#   make golden-jpeg  regenerate the JPEG decoding goldens (developer-only)
#   make golden-encoders regenerate the CLIP, SigLIP and DINOv2 goldens (developer-only)
#   make golden-siglip2 regenerate the SigLIP2 NaFlex goldens (developer-only)
#   make golden-task  regenerate the task gate's labelled images (developer-only)
#   make golden-text  regenerate the text encoder goldens and the text task set (developer-only)
#   make golden-stress regenerate the cosine gate's stress images and their measurement (developer-only)
#   make mac-check    on a Mac: the gates and benchmarks on Core ML, Core AI's Neural Engine regions, one report to commit
#   make bench        reference, build, interpreter, gate and embed benchmarks, appended to BENCHMARKS.md
#   make bench-quick  the matmul-rate table, the 2B-shaped tower against it and its whole gate (under 10 minutes)
#   make bench-text   text encoders (MiniLM-L6- and BERT-large-shaped) at 128 and 512 tokens against transformers

PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
DEV_VENV := .venv-dev
CARGO ?= cargo
DEMO := out/demo

.PHONY: setup venv build install test-install native browser test lint test-rust test-python check-macos check-features demo golden golden-vlm golden-vlm-q25 golden-qwen2 golden-qwen-massive golden-jpeg golden-encoders golden-siglip2 golden-task golden-text golden-stress golden-mil mac-check bench bench-quick bench-text fuzz dev-venv clean

setup: venv build

venv: $(VENV)/.installed
$(VENV)/.installed: python/requirements.txt python/requirements-runtime.txt
	$(PY) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -r python/requirements.txt
	touch $@

build: native
	$(CARGO) build --release --locked

# The user's install: the two binaries in PREFIX/bin, and in
# PREFIX/share/ane-export what they find there at run time (src/home.rs):
# the Python package `build` drives, its venv with the pinned coremltools
# (made with Python 3.11, the Python the binaries embed; no dev tools), and
# the golden images, questions, labelled images, texts and labelled
# texts the gates use by default. Nothing refers back to the checkout. Installing again updates
# the same files and keeps the venv when its pins have not changed.
PREFIX ?= /usr/local
SHARE = $(PREFIX)/share/ane-export
install: build
	install -d "$(PREFIX)/bin" "$(SHARE)/python" "$(SHARE)/golden"
	install -m 755 target/release/ane-export target/release/ane-run "$(PREFIX)/bin/"
	rm -rf "$(SHARE)/python/ane_export" "$(SHARE)/golden/images" "$(SHARE)/golden/images-stress" "$(SHARE)/golden/vqa" "$(SHARE)/golden/task" "$(SHARE)/golden/text" "$(SHARE)/golden/task-text"
	cp -R python/ane_export "$(SHARE)/python/"
	find "$(SHARE)/python" -name __pycache__ -prune -exec rm -rf {} +
	cp -R golden/images golden/images-stress golden/vqa golden/task "$(SHARE)/golden/"
	install -d "$(SHARE)/golden/text"
	cp golden/text/texts.jsonl "$(SHARE)/golden/text/"
	cp -R golden/task-text "$(SHARE)/golden/"
	@cmp -s python/requirements-runtime.txt "$(SHARE)/.venv/requirements-runtime.txt" || { \
		rm -rf "$(SHARE)/.venv" && $(PY) -m venv "$(SHARE)/.venv" && \
		"$(SHARE)/.venv/bin/python" -m pip install -q --upgrade pip && \
		"$(SHARE)/.venv/bin/python" -m pip install -q -r python/requirements-runtime.txt && \
		cp python/requirements-runtime.txt "$(SHARE)/.venv/"; }
	@echo "installed $(PREFIX)/bin/ane-export and $(PREFIX)/bin/ane-run (data in $(SHARE))"

# The installed tool with the checkout out of reach: installed into a
# temporary prefix, then build, gate, embed and vqa from another directory
# on a copy of the bundled tiny VLM (tests/install.sh).
test-install:
	bash tests/install.sh

# What the build needs besides Rust. (The towers' Linears run on the OpenBLAS
# pinned in python/requirements-runtime.txt, opened from the venv at run time:
# src/blas.rs; nothing to link.) JPEGs decode with
# libjpeg-turbo built from source by turbojpeg-sys (src/preprocess/jpeg.rs):
# cmake, and nasm for its x86 SIMD. Installed when missing; on macOS cmake is
# asked for (Homebrew's), the rest comes with the system.
NATIVE_DEBS := cmake nasm
native:
	@if [ "$$(uname -s)" = Linux ]; then \
		dpkg -s $(NATIVE_DEBS) >/dev/null 2>&1 || { apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(NATIVE_DEBS) >/dev/null; }; \
	else \
		command -v cmake >/dev/null || { echo "cmake is needed to build libjpeg-turbo: brew install cmake" >&2; exit 2; }; \
	fi

test: lint test-rust test-python check-macos check-features test-install

# Formatting and lints: rustfmt, clippy with every warning an error (tests
# included), and ruff on the Python (ruff.toml).
lint: venv native
	@rustup component list --installed | grep -q '^clippy' || rustup component add clippy rustfmt
	$(CARGO) fmt --check
	$(CARGO) clippy --locked --all-targets -- -D warnings
	$(VENV)/bin/ruff check python tests

# The build without the default features (no libjpeg-turbo: the image crate's
# JPEG decoder) must keep compiling, tests included.
check-features:
	$(CARGO) check --locked --no-default-features --all-targets

# The Rust tests drive coremltools through the .venv (build tests) and open
# the gate's HTML report in Debian's headless Chromium.
test-rust: venv browser native
	$(CARGO) test --release --locked

browser:
	@command -v chromium >/dev/null || { \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test-python: venv
	cd python && ../$(VENV)/bin/python -m pytest -q

# The code only a Mac runs (Core ML's child, powermetrics, F_SETNOSIGPIPE)
# cannot run here, but it must compile: every target, tests included, is
# type-checked for Apple silicon (no linking; pyo3 told the Python version;
# turbojpeg-sys told where a library would be instead of cross-building it).
MAC_TARGET := aarch64-apple-darwin
check-macos:
	@rustup target list --installed | grep -qx $(MAC_TARGET) || rustup target add $(MAC_TARGET)
	PYO3_CROSS_PYTHON_VERSION=3.11 TURBOJPEG_SOURCE=explicit TURBOJPEG_LIB_DIR=/ \
		$(CARGO) check --locked --target $(MAC_TARGET) --all-targets

# The main job on the bundled tiny VLM (golden/tiny-vlm: Qwen3-VL trained on
# easy-vqa): host preprocessing of two images into one call and the fp32
# reference tower on it; the export of the tower into a Core ML artifact (b1024
# and b4096 in one multifunction package, and the same program as a Core AI
# .aimodel) and its description; the three release gates on it, each format
# with its own executor (the interpreter, Apple's Core AI runtime), which write
# out/demo/tiny-vlm/gate/report.html and accept it; then questions answered from the accepted artifact (the MIL
# interpreter in fp16) and, for comparison, from the reference tower.
demo: setup
	mkdir -p $(DEMO)
	target/release/ane-run preprocess --model golden/tiny-vlm \
		--image golden/images/wide.jpg golden/images/rgba.png --out $(DEMO)/pixels.safetensors
	target/release/ane-export reference --model golden/tiny-vlm \
		--pixel-values $(DEMO)/pixels.safetensors --out $(DEMO)/reference.safetensors
	target/release/ane-export build --model golden/tiny-vlm --out $(DEMO)/tiny-vlm --force --format both
	target/release/ane-export inspect $(DEMO)/tiny-vlm/tiny-vlm.mlpackage
	target/release/ane-export gate $(DEMO)/tiny-vlm
	target/release/ane-run embed --artifact $(DEMO)/tiny-vlm --out $(DEMO)/embeddings \
		golden/vqa/images/test-0000.png golden/vqa/images/canvas-06-640x640.png
	target/release/ane-run vqa --artifact $(DEMO)/tiny-vlm --image golden/vqa/images/test-0000.png \
		--question "what shape is in the image?"
	target/release/ane-run vqa --artifact $(DEMO)/tiny-vlm --image golden/vqa/images/canvas-06-640x640.png \
		--question "what color is the shape in the top left?" --json
	target/release/ane-run vqa --artifact $(DEMO)/tiny-vlm --image golden/vqa/images/canvas-06-640x640.png \
		--question "what color is the shape in the top left?" --tower reference
	@echo "wrote $(DEMO)/: pixels and reference outputs, the accepted artifact tiny-vlm/ with its gate report, embeddings/"

# On a Mac with Apple silicon: the demo artifact gated with Core ML (measured
# residency, cosine from the Neural Engine), benchmarked over the three
# compute units and, as root, for energy; recordings and one report in
# tests/data/mac/recorded/ to commit. Elsewhere it says it needs macOS.
mac-check:
	@bash tests/mac-check.sh

dev-venv: $(DEV_VENV)/.installed
$(DEV_VENV)/.installed: python/requirements-dev.txt
	$(PY) -m venv $(DEV_VENV)
	$(DEV_VENV)/bin/python -m pip install -q --upgrade pip
	$(DEV_VENV)/bin/python -m pip install -q -r python/requirements-dev.txt
	touch $@

golden: dev-venv
	$(DEV_VENV)/bin/python python/golden/make_golden.py

# The golden tiny VLM, its question set and the language-model parity data
# (golden/tiny-vlm, golden/vqa, golden/lm); trains for about half an hour on 2 cores.
golden-vlm: dev-venv
	$(DEV_VENV)/bin/python python/golden/make_tiny_vlm.py

# The golden tiny Qwen2.5-VL VLM (golden/tiny-vlm-q25, golden/lm/tiny-vlm-q25-*),
# trained on easy-vqa like golden/tiny-vlm; about 55 minutes on 2 cores.
golden-vlm-q25: dev-venv
	$(DEV_VENV)/bin/python python/golden/make_tiny_vlm_q25.py

# The Qwen2.5-VL and Qwen2-VL goldens (golden/models/tiny-q25, tiny-q2, their
# tower outputs, golden/preprocess-p14 and their language-model parity data).
golden-qwen2: dev-venv
	$(DEV_VENV)/bin/python python/golden/make_golden_qwen2.py

# The Qwen towers with planted massive activations (golden/models/tiny-a-massive32k,
# tiny-a-massive, tiny-q25-massive*, tiny-q2-massive*, their tower outputs,
# golden/README-qwen-massive.md), from the Qwen goldens' configs and seeds.
golden-qwen-massive: dev-venv
	$(DEV_VENV)/bin/python python/golden/make_golden_qwen_massive.py

# The encoder goldens (golden/models/tiny-clip*, tiny-siglip*, their tower
# outputs, golden/preprocess-clip and preprocess-siglip, both backends).
golden-encoders: dev-venv
	$(DEV_VENV)/bin/python python/golden/make_golden_encoders.py

# The SigLIP2 NaFlex goldens (golden/models/tiny-siglip2*, their tower outputs
# at several patch budgets, golden/preprocess-siglip2 in both backends and
# golden/pixel-values/tiny-siglip2).
golden-siglip2: dev-venv
	$(DEV_VENV)/bin/python python/golden/make_golden_siglip2.py

# The task gate's labelled images (golden/task: easy-vqa's shapes with their
# shape and colour, 300 to train the probes on, 150 held out).
golden-task: dev-venv
	$(DEV_VENV)/bin/python python/golden/make_golden_task.py

# The text encoder goldens (golden/models/tiny-bert, tiny-bert-mlm, tiny-minilm,
# tiny-xlmr, tiny-modernbert with their trained tokenizers, golden/text: the
# corpus, the texts, transformers' token ids and the towers' outputs) and the
# text task gate's labelled questions (golden/task-text); under a minute.
golden-text: dev-venv
	$(DEV_VENV)/bin/python python/golden/make_golden_text.py

# The cosine gate's stress images (golden/images-stress; numpy and PIL), then
# the measurement that chose them (golden/README-stress.md; about 5 minutes).
golden-stress: dev-venv
	$(DEV_VENV)/bin/python python/golden/make_stress_images.py
	$(DEV_VENV)/bin/python python/golden/measure_stress_images.py

# The JPEG goldens (golden/images-jpeg, golden/preprocess-jpeg): qualities,
# chroma subsamplings, progressive, gray, CMYK, every EXIF orientation.
golden-jpeg: dev-venv
	$(DEV_VENV)/bin/python python/golden/make_golden_jpeg.py

golden-mil: venv
	$(VENV)/bin/python python/golden/make_mil_cases.py

# The static residency checker's rule cases (golden/residency: a program per rule that
# breaks it and one that keeps it), for tests/it/residency_rules.rs.
golden-residency: venv
	$(VENV)/bin/python python/golden/make_residency_cases.py

FUZZ_SECONDS ?= 600
FUZZ_TARGETS := package_reader safetensors_header shard_index buckets_yaml manifest image_decode
fuzz: native
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		RUSTC_BOOTSTRAP=1 cargo fuzz run $$t corpus/$$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

# One run, one machine: numpy's matmul rate, the Linears' candidates side by
# side, and the 2B-shaped tower's whole gate on the eight natural golden images
# (python/bench/bench_quick.py; `make bench` adds the tower against the rate and
# the gate on the default set;
# the checkpoint and artifact are kept in $TMPDIR/ane-export-bench-quick).
bench-quick: dev-venv venv build
	$(DEV_VENV)/bin/python python/bench/bench_quick.py --out BENCHMARKS.md

# The reference and the interpreter (fp32, fp16) against transformers at 128
# and 512 tokens on random MiniLM-L6- and BERT-large-shaped BertModels, in
# GFLOP/s against numpy's matmul rate measured in the same run
# (python/bench/bench_text.py; issue 54).
bench-text: dev-venv venv build
	$(DEV_VENV)/bin/python python/bench/bench_text.py --out BENCHMARKS.md

bench: dev-venv venv build
	$(DEV_VENV)/bin/python python/bench/bench_matmul.py --out BENCHMARKS.md
	$(DEV_VENV)/bin/python python/bench/bench_quick.py --tower --default-set --rounds 3 --out BENCHMARKS.md
	$(DEV_VENV)/bin/python python/bench/bench_tower.py --bin target/release/ane-export \
		--patches 1024 4096 --repeats 3 --out BENCHMARKS.md
	$(DEV_VENV)/bin/python python/bench/bench_build.py --bin target/release/ane-export \
		--run-bin target/release/ane-run --interp-patches 1024 4096 --rounds 3 --out BENCHMARKS.md
	$(DEV_VENV)/bin/python python/bench/bench_gate.py --out BENCHMARKS.md
	$(DEV_VENV)/bin/python python/bench/bench_precision.py --out BENCHMARKS.md
	$(DEV_VENV)/bin/python python/bench/bench_coreai.py --out BENCHMARKS.md
	$(DEV_VENV)/bin/python python/bench/bench_gate_memory.py --a target/release/ane-export \
		--tower qwen3vl-8b --out BENCHMARKS.md
	$(DEV_VENV)/bin/python python/bench/bench_embed.py --out BENCHMARKS.md
	$(DEV_VENV)/bin/python python/bench/bench_vqa.py --out BENCHMARKS.md
	$(DEV_VENV)/bin/python python/bench/bench_qwen25.py --out BENCHMARKS.md
	$(DEV_VENV)/bin/python python/bench/bench_encoders.py --gate clip-l so400m --out BENCHMARKS.md
	$(DEV_VENV)/bin/python python/bench/bench_text.py --out BENCHMARKS.md

clean:
	rm -rf out $(VENV) $(DEV_VENV)
	$(CARGO) clean
