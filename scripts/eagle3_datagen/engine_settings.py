"""The engine block of the validated config as types, one per engine kind (`SGLangServer`,
`LocalServer`: the CPU stand-in, `ExternalServers`: running servers given by URL), built in one place
(`EngineSettings.from_config`), so that no other module reads `engine[...]` or branches on its kind.
"""

from dataclasses import dataclass

from eagle3_datagen.settings import defaults

# Launch flags that would change or cut the data: parsers rewrite tokens on the chat layer (and a
# server for this pipeline needs none), auto-truncation silently cuts prompts, and without the
# tokenizer the server cannot check what it is given.
REFUSED_SGLANG_FLAGS = ("--reasoning-parser", "--tool-call-parser", "--allow-auto-truncate", "--skip-tokenizer-init")
# Flags the job sets itself for a server across nodes (engine.sglang.nodes): each rank's are its own.
NODE_FLAGS = ("--nnodes", "--node-rank", "--dist-init-addr", "--dist-timeout")


# The flags of `extra_args` the job reads or refuses, by what they set, in SGLang 0.5.23's spellings
# (srt/arg_groups/fields/parallel.py: tp_size, pp_size, dp_size and their aliases; server_args.py:
# host). Its parser takes any unambiguous prefix of a flag (argparse's allow_abbrev): `--tp` is
# `--tp-size`, `--dp` `--dp-size`, `--reasoning-pars` `--reasoning-parser`, while `--pp` could also be
# either neighbour below, which it refuses.
READ_FLAGS = {
    "tp": ("--tp-size", "--tensor-parallel-size"),
    "pp": ("--pp-size", "--pipeline-parallel-size"),
    "dp": ("--dp-size", "--data-parallel-size"),
    "host": ("--host",),
    "port": ("--port",),
    "device": ("--device",),
    # With it, SGLang's --dp-size counts attention groups inside the tensor-parallel GPUs, not replicas
    # (srt/arg_groups/parallel_hook.py, handle_deprecated_dp_attention).
    "dp_attention": ("--enable-dp-attention",),
    "refused": REFUSED_SGLANG_FLAGS,
    "node": NODE_FLAGS,
    None: ("--pp-max-micro-batch-size", "--pp-async-batch-depth", "--enable-dp-attention-local-control-broadcast"),
}
# Where a server bound to every interface is reached (as SGLang's own ServerArgs.url does).
WILDCARD_HOSTS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}


def read_flag(arg) -> str | None:
    """Which of READ_FLAGS `arg` gives (`--flag`, `--flag=V`, or a prefix SGLang takes for it), if any."""
    name = str(arg).split("=", 1)[0]
    if not name.startswith("--") or len(name) < 4:  # shorter prefixes are ambiguous in SGLang
        return None
    keys = {key for key, flags in READ_FLAGS.items() if name in flags}
    keys = keys or {key for key, flags in READ_FLAGS.items() if any(f.startswith(name) for f in flags)}
    if len(keys) > 1:
        could = ", ".join(f for key in keys for f in READ_FLAGS[key] if f.startswith(name))
        raise ValueError(
            f"engine.sglang.extra_args: {name} is ambiguous to SGLang (it could be {could}); write it whole"
        )
    return next(iter(keys), None)


def flag_value(args, flag: str) -> str | None:
    """The value `args` give `flag` (a key of READ_FLAGS, or a flag written whole) as `--flag V` or
    `--flag=V`; the last one wins, as in argparse."""
    value = None
    for i, arg in enumerate(args):
        name, eq, given = str(arg).partition("=")
        if (name == flag) if flag.startswith("--") else (read_flag(arg) == flag):
            value = given if eq else (str(args[i + 1]) if i + 1 < len(args) else None)
    return value


def without_flag(args, flag: str) -> list[str]:
    """`args` less every `flag` (a key of READ_FLAGS) and its value."""
    out, skip = [], False
    for arg in map(str, args):
        if skip:
            skip = False
        elif read_flag(arg) == flag:
            skip = "=" not in arg
        else:
            out.append(arg)
    return out


def size_flag(args, flag: str) -> int:
    """The parallel size `args` give `flag` (pp, dp), 1 where they give none."""
    value = flag_value(args, flag)
    if value is None:
        return 1
    if not value.isdecimal() or int(value) < 1:
        raise ValueError(f"engine.sglang.extra_args: {READ_FLAGS[flag][0]} {value!r} is not a positive whole number")
    return int(value)


def check_extra_args(args) -> None:
    """Refuse launch arguments that would reshape or cut the generated data, or that the job sets itself."""
    for key, why in (
        ("refused", " would reshape or cut the generated data; remove it"),
        (
            "node",
            ": the job sets these for each rank; give the number of nodes as engine.sglang.nodes "
            "(and engine.sglang.dist_timeout_s)",
        ),
        (
            "tp",
            ": the tensor-parallel size is engine.sglang.tp_size (the job passes it and counts its GPUs "
            "from it); set it there and remove it here",
        ),
    ):
        found = [str(a) for a in args if read_flag(a) == key]
        if found:
            raise ValueError(f"engine.sglang.extra_args: {', '.join(found)}{why}")
    for flag in ("pp", "dp"):
        size_flag(args, flag)


@dataclass(frozen=True)
class JobResources:
    """What a generate job asks the cluster for (engine.job)."""

    cpus: int
    mem_mb: int
    runtime: int


@dataclass(frozen=True)
class SGLangServer:
    """engine.sglang: the SGLang server a job launches."""

    model_path: str
    python: str
    tp_size: int
    trust_remote_code: bool
    mem_fraction_static: float | None
    extra_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # (name, value as text), in the config's order
    nodes: int = 1
    dist_init_interface: str | None = None
    dist_timeout_s: int | None = 600

    kind = "sglang"
    launched = True
    weights_dir = None  # what it serves is read from the server itself (/model_info)

    def __post_init__(self):
        check_extra_args(self.extra_args)
        tp, pp, dp, nodes = self.tp_size, self.pp_size, self.dp_size, self.nodes
        if dp > 1 and nodes > 1:
            # SGLang starts replica i at GPU i × tp × pp of every node (data_parallel_controller.py):
            # across nodes the replicas would not fit the node's share of the GPUs.
            raise ValueError(
                f"engine.sglang.extra_args: data-parallel size {dp} with engine.sglang.nodes {nodes}: SGLang "
                "cannot place data-parallel replicas across nodes; use nodes: 1, or --enable-dp-attention"
            )
        # SGLang puts pp / nodes whole pipeline stages on each node, or each stage on nodes / pp nodes
        # (entrypoints/engine.py, _calculate_rank_ranges): every node the same number of GPUs.
        if self.gpus * nodes != tp * pp * dp:
            how = (
                f"is not a multiple of engine.sglang.nodes {nodes}: each node holds the same number of GPUs"
                if (tp * pp) % nodes
                else f"cannot be laid out on engine.sglang.nodes {nodes}: SGLang needs the pipeline-parallel size "
                "and the number of nodes to be one a multiple of the other"
            )
            raise ValueError(f"{self.parallel_sizes} {how}")

    @property
    def pp_size(self) -> int:
        return size_flag(self.extra_args, "pp")

    @property
    def dp_size(self) -> int:
        """Data-parallel replicas, each on GPUs of its own (with dp attention, the ranks share the tp GPUs)."""
        if any(read_flag(arg) == "dp_attention" for arg in self.extra_args):
            return 1
        return size_flag(self.extra_args, "dp")

    @property
    def parallel_sizes(self) -> str:
        """What the GPU count comes from, as the config says it."""
        text = f"engine.sglang.tp_size {self.tp_size}"
        for name, size in (("pipeline-parallel", self.pp_size), ("data-parallel", self.dp_size)):
            text += f" × {name} size {size}" if size > 1 else ""
        return text

    @property
    def gpus(self) -> int:
        """GPUs on each node of the server: tp × pp × dp replicas, spread over its nodes as SGLang lays them out."""
        tp, pp, nodes = self.tp_size, self.pp_size, self.nodes
        return max(pp // nodes, 1) * (tp // max(nodes // pp, 1)) * self.dp_size

    @property
    def host(self) -> str:
        """Where the server listens: `--host` in extra_args, else localhost only."""
        host = flag_value(self.extra_args, "host")
        return "127.0.0.1" if host is None else host

    @property
    def client_host(self) -> str:
        """Where the job reaches the server (localhost for a server bound to every interface)."""
        return WILDCARD_HOSTS.get(self.host, self.host)


@dataclass(frozen=True)
class LocalServer:
    """engine.local: the CPU stand-in a job launches."""

    backend: str
    model_dir: str | None  # None: the model profile's tokenizer folder
    max_batch: int
    gpus: int
    extra_args: tuple[str, ...]

    kind = "local"
    launched = True

    @property
    def weights_dir(self) -> str | None:
        """The weights the model backend serves (part of what identifies its answers)."""
        return self.model_dir if self.backend == "model" else None


@dataclass(frozen=True)
class ExternalServers:
    """engine.external: running servers (or an sglang_router); requests are spread across them."""

    urls: tuple[str, ...]

    kind = "external"
    launched = False
    gpus = 0  # the servers are not the job's
    weights_dir = None


KINDS = {cls.kind: cls for cls in (SGLangServer, LocalServer, ExternalServers)}


@dataclass(frozen=True)
class EngineSettings:
    """The engine block: its server (one type per kind) and what every kind shares."""

    server: SGLangServer | LocalServer | ExternalServers
    deterministic_inference: bool
    api_key_env: str | None
    startup_timeout_s: float
    job: JobResources

    @classmethod
    def of(cls, engine: "EngineSettings | dict") -> "EngineSettings":
        """`engine` as settings: the settings themselves, or built from a config's engine block."""
        return engine if isinstance(engine, cls) else cls.from_config(engine)

    @classmethod
    def from_config(cls, engine: dict) -> "EngineSettings":
        """From the config's engine block (or a run's provenance of it), the schema's defaults under it."""
        engine = defaults("engine", **engine)
        kind = engine["kind"]
        if kind not in KINDS:
            raise ValueError(f"engine.kind {kind!r}: one of {', '.join(KINDS)}")
        block = dict(engine.get(kind) or {})
        if kind == "sglang" and "model_path" not in block:
            raise ValueError("engine.kind is sglang but engine.sglang.model_path is not set")
        for key in ("extra_args", "urls"):
            if key in block:
                block[key] = tuple(str(a) for a in block[key] or ())
        if "env" in block:
            env = (block["env"] or {}).items()
            block["env"] = tuple((str(k), str(v).lower() if isinstance(v, bool) else str(v)) for k, v in env)
        return cls(
            server=KINDS[kind](**block),
            deterministic_inference=bool(engine["deterministic_inference"]),
            api_key_env=engine["api_key_env"],
            startup_timeout_s=float(engine["startup_timeout_s"]),
            job=JobResources(**{k: int(v) for k, v in engine["job"].items()}),
        )

    @property
    def kind(self) -> str:
        return self.server.kind

    @property
    def gpus(self) -> int:
        """GPUs on each node of the server a job launches (none for external servers: they are not the job's)."""
        return int(self.server.gpus)

    @property
    def nodes(self) -> int:
        return int(getattr(self.server, "nodes", 1))

    @property
    def all_gpus(self) -> int:
        """GPUs of the server a job launches, all its nodes together (what its GPU-hours count)."""
        return self.gpus * self.nodes

    def fingerprint(self) -> dict:
        """What identifies the server's answers before it starts, beside the model's name and `weights_dir`."""
        backend = {"backend": self.server.backend} if isinstance(self.server, LocalServer) else {}
        return {"kind": self.kind, **backend}
