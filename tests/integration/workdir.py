"""A throwaway working directory for running the real workflow on a small config."""

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from eagle3_datagen.generation.requests import parse_rid

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def row_label(rid: str) -> str:
    """The row a rid was sent for, as `{id}.{sample}[.t{turn}]` (its serving mode left out: these
    tests run one mode)."""
    (row_id, sample, turn, _mode), _nonce, _attempt = parse_rid(rid)
    return f"{row_id}.{sample}" + (f".t{turn}" if turn else "")


def demo_rows(category: str, n: int, start: int = 0) -> list[dict]:
    with open(ROOT / "config" / "prompts" / f"{category}.jsonl", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh][start : start + n]


def multi_turn_rows() -> list[dict]:
    """The demo's conversations of two or more user turns and no tools (chat-046 has four)."""
    return [
        r for r in demo_rows("chat", 60) if sum(m["role"] == "user" for m in r["messages"]) > 1 and "tools" not in r
    ]


class Workdir:
    """config/config.yaml, config/categories.tsv and prompt files in a temporary directory.

    Every local engine a run launches records what it served in `record_dir` (one file per engine);
    `engine_args` adds more of the engine's test options (faults, latency), passed through the
    environment as the engine's users would (launch.LOCAL_ENGINE_ARGS_ENV).
    """

    def __init__(
        self,
        path: Path,
        *,
        tokenizer: Path,
        model_dir: Path | None,
        backend: str,
        categories: dict[str, list],
        plain_qwen3: bool = False,
        engine_args: str = "",
        mode_mix: dict[str, str] | None = None,
        sheet: dict[str, dict[str, str]] | None = None,
        **overrides,
    ):
        """`mode_mix`: a category's serving-mode mix (its mode_mix cell of the sheet), where given;
        `sheet`: more cells of a category's row, by column (`{"chat": {"shards": "2"}}`)."""
        self.path = path
        self.record_dir = path / "engine_record"
        self.engine_args = engine_args
        self.snakefile = ROOT / "Snakefile"
        self.ids: dict[str, set] = {}
        prompts = path / "config" / "prompts"
        prompts.mkdir(parents=True, exist_ok=True)
        cells = {name: dict((sheet or {}).get(name, {})) for name in categories}
        for name, mix in (mode_mix or {}).items():
            cells[name]["mode_mix"] = mix
        for name, rows in categories.items():
            self.write_prompts(name, rows)
        self.write_sheet(cells)
        with open(ROOT / "config" / "config.yaml") as fh:
            config = yaml.safe_load(fh)
        config["model"]["tokenizer"] = str(tokenizer)
        if plain_qwen3:
            # Qwen3's own template: no <think> in the prompt (the model may generate it), Qwen parsers.
            config["model"].update(
                prompt_suffix=[],
                prompt_only_tokens=[],
                chat_template_kwargs={},
                reasoning_parser="qwen3",
                tool_call_parser="qwen25",
            )
            config["model"].pop("modes", None)  # one mode: the profile's own values
            config.pop("mode_mix", None)
        config["engine"]["local"] = {"backend": backend, "model_dir": str(model_dir or tokenizer), "max_batch": 16}
        config["engine"]["startup_timeout_s"] = 120
        config["client"]["progress_interval_s"] = 1
        config["max_new_tokens"] = 48
        for key, value in overrides.items():
            config[key] = value
        self.config = config
        self.write_config()

    def set_sampling(self, sampling: dict) -> None:
        """The sampling of every row: the config's block, and no mode's own values over it."""
        self.config["sampling"] = dict(sampling)
        for mode in (self.config["model"].get("modes") or {}).values():
            mode.pop("sampling", None)

    def one_mode(self) -> None:
        """The profile as one mode, its own values (the demo's modes are the Kimi-shaped template's)."""
        self.config["model"].pop("modes", None)
        self.config.pop("mode_mix", None)

    def write_config(self) -> None:
        (self.path / "config" / "config.yaml").write_text(yaml.safe_dump(self.config, sort_keys=False))

    def write_sheet(self, cells: dict[str, dict[str, str]]) -> None:
        """config/categories.tsv: each category's prompts file, and its `cells` (column: value)."""
        columns = sorted({column for row in cells.values() for column in row})
        lines = ["\t".join(["category", "prompts", *columns])]
        for name, row in cells.items():
            lines.append("\t".join([name, f"config/prompts/{name}.jsonl", *(str(row.get(c, "")) for c in columns)]))
        (self.path / "config" / "categories.tsv").write_text("\n".join(lines) + "\n")

    def write_prompts(self, name: str, rows: list) -> None:
        """One line per row: a dict as JSON, a str or bytes as it is (for malformed lines)."""
        self.ids[name] = {str(row["id"]) for row in rows if isinstance(row, dict) and "id" in row}
        with open(self.path / "config" / "prompts" / f"{name}.jsonl", "wb") as fh:
            for row in rows:
                if isinstance(row, dict):
                    row = json.dumps(row, ensure_ascii=False)
                fh.write(row if isinstance(row, bytes) else row.encode("utf-8"))
                fh.write(b"\n")

    def env(self) -> dict:
        return dict(
            os.environ,
            PYTHONUNBUFFERED="1",
            EAGLE3_DATAGEN_ENGINE_ARGS=f"--record-dir {self.record_dir} {self.engine_args}",
        )

    def copy(self, path: Path) -> "Workdir":
        """The same working directory (results, cache, Snakemake's records, mtimes kept) at `path`."""
        shutil.copytree(self.path, path, symlinks=True)
        clone = copy.copy(self)
        clone.path, clone.record_dir = path, path / "engine_record"
        clone.config, clone.ids = copy.deepcopy(self.config), copy.deepcopy(self.ids)
        return clone

    def snakemake(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        cmd = SNAKEMAKE + ["--snakefile", str(self.snakefile), "--directory", str(self.path), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env())
        if check and proc.returncode != 0:
            raise AssertionError(
                f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
            )
        return proc

    def jsonl(self, relative: str) -> list[dict]:
        with open(self.path / relative, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]

    def engine_record(self, category: str | None = None) -> list[dict]:
        """What the engines served (of one category's rows), in the order they finished."""
        entries = []
        for path in sorted(self.record_dir.glob("*.jsonl")) if self.record_dir.exists() else []:
            with open(path, encoding="utf-8") as fh:
                entries += [json.loads(line) for line in fh if line.strip()]
        if category is not None:
            ids = self.ids[category]
            entries = [e for e in entries if e["rid"] and parse_rid(e["rid"])[0][0] in ids]
        return sorted(entries, key=lambda e: e["t_end"])
