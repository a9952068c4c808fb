"""eagle3-datagen: exact-token EAGLE-3 training data from SGLang's native /generate API.

The subpackages are the pipeline's shape, lowest layer first; a module imports only from its own
layer and those below it (tests/unit/test_architecture.py checks it):

  settings     the validated config as typed values (model profile, budgets, client, pilot, export, hashing)
  sampling     where a row's sampling values come from, in one order
  storage/     tables (Parquet in batches), the file layout, and the readers of users' prompt files
  tokens/      the token domain: chat templates, stop sets, SGLang's parsers, the chat layer
  demo/        the demo's tiny model and the tokenizer fixtures built from packages
  generation/  talking to SGLang exactly once per row: requests, client, journal, load, servers, turns
  figures      drawing the report's figures from plain data
  steps/       one module per Snakemake rule: the step functions the scripts call
  workflow, runner   the config and category sheet as the rules read them; the scripts' wiring
  cli          the `eagle3-datagen` command: what a user runs by hand (`python -m eagle3_datagen`)

`engine/` stands apart: the CPU stand-in of SGLang's HTTP server (tests and the demo), importing
only `settings`.
"""

__version__ = "0.1.0"
