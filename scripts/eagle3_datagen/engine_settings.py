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


def check_extra_args(args) -> None:
    """Refuse launch arguments that would reshape or cut the generated data."""
    for flags, why in (
        (REFUSED_SGLANG_FLAGS, " would reshape or cut the generated data; remove it"),
        (
            NODE_FLAGS,
            ": the job sets these for each rank; give the number of nodes as engine.sglang.nodes "
            "(and engine.sglang.dist_timeout_s)",
        ),
    ):
        found = [a for a in args if str(a).split("=", 1)[0] in flags]
        if found:
            raise ValueError(f"engine.sglang.extra_args: {', '.join(found)}{why}")


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
        if self.tp_size % self.nodes:
            raise ValueError(
                f"engine.sglang.tp_size {self.tp_size} is not a multiple of engine.sglang.nodes {self.nodes}: "
                "each node holds the same number of GPUs"
            )

    @property
    def gpus(self) -> int:
        """GPUs on each node of the server."""
        return self.tp_size // self.nodes


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

    def fingerprint(self) -> dict:
        """What identifies the server's answers before it starts, beside the model's name and `weights_dir`."""
        backend = {"backend": self.server.backend} if isinstance(self.server, LocalServer) else {}
        return {"kind": self.kind, **backend}
