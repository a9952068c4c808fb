# The two commands of the README: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean-results

$(STAMP): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/snakemake --cores 2
	$(BIN)/snakemake --report report.html
	@echo "dataset: results/dataset/  summary: results/summary.tsv  report: report.html"

test: $(STAMP)
	$(BIN)/snakemake --lint
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/python -m pytest -q

clean-results:
	rm -rf results logs benchmarks report.html
