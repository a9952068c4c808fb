"""One SGLang server across the nodes of a SLURM job (`engine.sglang.nodes` above 1).

The job's step runs on the head node and starts rank 0 there (a `ManagedServer`: it alone serves
HTTP); every other rank runs on a node of its own with `srun --overlap`, a step of the same job, under
the watchdog, so that none outlives the job. All meet at `--dist-init-addr`: the head's node name (or
its address on `engine.sglang.dist_init_interface`) and a port free there. A rank first checks on its
node what rank 0 checked on the head (model path, GPUs). A rank that exits ends the start-up or the
run, with a message naming its node and its log's last lines; as a rank's death takes the others
with it (gloo, NCCL), the one named is the first seen to die among those whose log does not say
they lost a peer.
"""

import argparse
import fcntl
import json
import logging
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from eagle3_datagen.engine_settings import EngineSettings, SGLangServer
from eagle3_datagen.generation.launch import node_args, server_env, sglang_command
from eagle3_datagen.generation.redact import redact_command
from eagle3_datagen.generation.startup import ServerError, check_gpus, check_model_path, exit_text, log_tail, port_free
from eagle3_datagen.generation.watchdog import package_env, watched

log = logging.getLogger(__name__)

# With data-parallel attention SGLang also binds the six ports after the rendezvous port.
DERIVED_PORTS = 6
# What a rank's srun keeps of the job's SLURM environment: the job (so srun joins it) and its
# config. The rest describes the head's own step and would shape the rank's (its node, its tasks).
KEPT_SLURM = ("SLURM_JOB_ID", "SLURM_CONF")
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES")
# How long a rank may take to end by itself once rank 0 stopped (it follows rank 0's shutdown).
RANK_GRACE_S = 30.0
# What a rank's log says when it died because a peer did (gloo over TCP, NCCL, torch's watchdog).
PEER_LOST = re.compile(
    r"gloo.*(?:Connection (?:reset|closed) by peer|Broken pipe)|ncclRemoteError|Watchdog caught collective operation timeout"
)
# How long the rank that died first is waited for, once the ranks seen dead all lost a peer.
SETTLE_S = 5.0


def job_nodes(nodelist: str) -> list[str]:
    """The node names of a SLURM node list (`gpu[01-04]`, `a1,b[2-3]`), as `scontrol show hostnames` expands it."""
    try:
        done = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"scontrol show hostnames {nodelist!r} could not run: {exc}") from None
    if done.returncode != 0 or not done.stdout.split():
        raise RuntimeError(f"scontrol show hostnames {nodelist!r} failed: {done.stderr.strip() or done.returncode}")
    return done.stdout.split()


def job_nodelist(job: str) -> str | None:
    """The node list of SLURM job `job`, as its controller knows it (None where squeue cannot say)."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%N"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def interface_address(name: str) -> str:
    """The IPv4 address of network interface `name` on this node."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError as exc:
            names = ", ".join(n for _, n in socket.if_nameindex())
            raise RuntimeError(
                f"engine.sglang.dist_init_interface {name!r} has no IPv4 address on {socket.gethostname()} "
                f"({exc.strerror}); its interfaces: {names}"
            ) from None
    return socket.inet_ntoa(packed[20:24])


def rendezvous_port() -> int:
    """A port free on this node for every interface, with the ports SGLang derives from it free too."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("0.0.0.0", 0))
            port = s.getsockname()[1]
        if port + DERIVED_PORTS < 65536 and all(port_free(port + i, "0.0.0.0") for i in range(DERIVED_PORTS + 1)):
            return port
    raise RuntimeError(f"no port with the {DERIVED_PORTS} after it free on {socket.gethostname()}")


@dataclass(frozen=True)
class Layout:
    """Where the ranks of one server run: rank 0 on `head` (this node), rank i on `others[i - 1]`."""

    head: str
    others: tuple[str, ...]
    dist_init_addr: str


def layout(sglang: SGLangServer, environ=os.environ) -> Layout:
    """The nodes of this SLURM job for a server across `sglang.nodes` of them; refused outside such a job."""
    job, nodelist = environ.get("SLURM_JOB_ID"), environ.get("SLURM_JOB_NODELIST")
    if not job or not nodelist:
        raise RuntimeError(
            f"engine.sglang.nodes is {sglang.nodes}: such a server spans the nodes of one SLURM job, and this job "
            "is not one (SLURM_JOB_NODELIST is unset); run with snakemake --profile slurm, or set nodes: 1"
        )
    nodes = job_nodes(nodelist)
    if len(nodes) < sglang.nodes:
        # Snakemake's job step starts this step with the job's SLURM_* variables removed, and srun
        # then names only the step's own node: the job's whole list is the controller's.
        nodelist = job_nodelist(job) or nodelist
        nodes = job_nodes(nodelist)
    here = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    if len(nodes) < sglang.nodes or here not in nodes:
        raise RuntimeError(
            f"engine.sglang.nodes is {sglang.nodes}, but SLURM job {job} holds {len(nodes)} node(s) ({nodelist}) "
            f"and this step runs on {here}; the generate job asks for engine.sglang.nodes nodes (resource nodes)"
        )
    others = tuple(node for node in nodes if node != here)[: sglang.nodes - 1]
    host = interface_address(sglang.dist_init_interface) if sglang.dist_init_interface else here
    return Layout(here, others, f"{host}:{rendezvous_port()}")


def rank_env(env: dict) -> dict:
    """A rank's environment: the server's, less the head step's SLURM and device variables."""
    slurm = ("SLURM_", "SRUN_", "SBATCH_")
    return package_env(
        {k: v for k, v in env.items() if not (k.startswith(slurm) and k not in KEPT_SLURM or k in DEVICE_VARIABLES)}
    )


def srun_command(sglang: SGLangServer, node: str, *, cpus: int, cmd: list[str]) -> list[str]:
    """`srun` of one rank on `node`, in a step of this job beside the head's (`--overlap`), checked there first."""
    checks = {"model_path": sglang.model_path, "tp_size": sglang.tp_size, "nodes": sglang.nodes}
    checks["extra_args"] = sglang.extra_args
    gres = [f"--gres=gpu:{sglang.gpus}"] if sglang.gpus else []
    return [
        "srun",
        f"--jobid={os.environ['SLURM_JOB_ID']}",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        f"--nodelist={node}",
        f"--cpus-per-task={cpus}",
        "--mem=0",  # the job's memory on the node, shared with nothing else there
        *gres,
        "--export=ALL",
        sys.executable,
        "-m",
        "eagle3_datagen.generation.nodes",
        "--checks",
        json.dumps(checks),
        "--",
        *cmd,
    ]


class Rank:
    """One non-head rank: its `srun` under the watchdog, and its log."""

    def __init__(self, rank: int, node: str, cmd: list[str], log_path: Path, env: dict):
        self.rank, self.node, self.cmd, self.log_path, self.env = rank, node, cmd, log_path, env
        self.proc: subprocess.Popen | None = None
        self.exited_at: float | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log.info("starting rank %d on %s: %s (log: %s)", self.rank, self.node, redact_command(self.cmd), self.log_path)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                watched(self.cmd), stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=self.env
            )

    def poll(self) -> int | None:
        code = self.proc.poll() if self.proc is not None else None
        if code is not None and self.exited_at is None:
            self.exited_at = time.monotonic()
        return code

    def describe(self) -> str:
        return (
            f"rank {self.rank} on node {self.node} exited with {exit_text(self.poll())}; its log is {self.log_path}; "
            f"its last lines:\n{log_tail(self.log_path)}"
        )

    def stop(self, grace_s: float) -> None:
        """Wait for it to end by itself (it follows rank 0's shutdown), then SIGKILL its srun: a killed
        srun ends its step, and SLURM the rank's processes on its node."""
        if self.proc is None:
            return
        deadline = time.monotonic() + grace_s
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        if self.poll() is None:
            log.warning(
                "rank %d on %s still runs %.0f s after rank 0 stopped; killing its srun", self.rank, self.node, grace_s
            )
            with suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        log.info("rank %d on %s ended (%s)", self.rank, self.node, exit_text(self.proc.returncode))


class Ranks:
    """The ranks beside rank 0, watched from a thread, so that the first to die is known."""

    def __init__(self, ranks: list[Rank], head_node: str, head_args: tuple[str, ...]):
        self.ranks, self.head_node, self.head_args = ranks, head_node, head_args
        self.head = None  # rank 0's ManagedServer (`servers`), launched with `head_args`
        self.head_exited_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> None:
        for rank in self.ranks:
            rank.start()
        self._thread.start()

    def _watch(self) -> None:
        server = None  # rank 0's own process: its watchdog may outlive it by seconds, cleaning up
        while not self._stop.wait(0.5):
            for rank in self.ranks:
                rank.poll()
            proc = getattr(self.head, "proc", None)
            if proc is None or self.head_exited_at is not None:
                continue
            server = server or _first_child(proc.pid)
            if proc.poll() is not None or (server is not None and not _running(server)):
                self.head_exited_at = time.monotonic()

    def alive(self) -> bool:
        return all(rank.poll() is None for rank in self.ranks)

    def failed_rank(self) -> str | None:
        """The message of a rank that has exited (while rank 0 starts, any exit is a failure)."""
        dead = [rank for rank in self.ranks if rank.poll() is not None]
        return min(dead, key=lambda r: r.exited_at).describe() if dead else None

    def first_death(self) -> str | None:
        """Which rank died first, its node and its log's end; None while every rank runs.

        Deaths are seen by polling, and a rank's death takes the others with it, so two can be seen
        in one poll, and the one that died first is told by its log: the others say they lost a peer."""
        deadline = time.monotonic() + SETTLE_S
        while deaths := self._deaths():
            causes = [d for d in deaths if not PEER_LOST.search(log_tail(d[1], lines=200))]
            if causes or len(deaths) == len(self.ranks) + 1 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        else:
            return None
        _, path, rank = min(causes or deaths, key=lambda d: d[0])
        if rank is None:
            return f"rank 0 on node {self.head_node} died first; its log is {path}; its last lines:\n{log_tail(path)}"
        return rank.describe() + f"\n(rank 0's log: {self.head.log_path})"

    def _deaths(self) -> list[tuple[float, Path, "Rank | None"]]:
        """(when it was seen dead, its log, the rank or None for rank 0) of each rank seen dead."""
        deaths = [(r.exited_at, r.log_path, r) for r in self.ranks if r.poll() is not None]
        if self.head_exited_at is not None:
            deaths.append((self.head_exited_at, self.head.log_path, None))
        return deaths

    def stop(self) -> None:
        self._stop.set()
        for rank in self.ranks:
            rank.stop(RANK_GRACE_S)


def _first_child(pid: int) -> int | None:
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def _running(pid: int) -> bool:
    """Whether `pid` runs (neither gone nor a zombie waiting for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@contextmanager
def across_nodes(engine: EngineSettings, *, port: int, profile, log_path: Path, key: str | None, streaming: bool):
    """Start the ranks but rank 0 on the job's other nodes and yield them (`Ranks`; the caller starts
    rank 0 with `head_args` and sets `head`); stop them afterwards, once rank 0 has stopped."""
    sglang = engine.server
    try:
        check_model_path(sglang)
        check_gpus(sglang)
        where = layout(sglang)
    except RuntimeError as exc:
        raise ServerError(f"the SGLang server was not started: {exc}") from None
    # Only rank 0 serves: the others' own health endpoint stays on their localhost (an address of
    # the head node given as --host is none of theirs).
    cmd = sglang_command(
        engine,
        port=port,
        context_length=profile.context_length,
        api_key=key,
        incremental_streaming=streaming,
        host="127.0.0.1",
    )
    env = rank_env(server_env(sglang.env))
    stem = log_path.name.removesuffix(".server.log").removesuffix(".log")
    ranks = []
    for i, node in enumerate(where.others, start=1):
        rank_cmd = cmd + node_args(engine, rank=i, dist_init_addr=where.dist_init_addr)
        srun = srun_command(sglang, node, cpus=engine.job.cpus, cmd=rank_cmd)
        ranks.append(Rank(i, node, srun, log_path.with_name(f"{stem}.rank{i}.server.log"), env))
    head_args = tuple(node_args(engine, rank=0, dist_init_addr=where.dist_init_addr))
    log.info(
        "one server across %d nodes: rank 0 on %s (this node), %s; they meet at %s",
        sglang.nodes,
        where.head,
        ", ".join(f"rank {i} on {node}" for i, node in enumerate(where.others, start=1)),
        where.dist_init_addr,
    )
    watched = Ranks(ranks, where.head, head_args)
    try:
        watched.start()
        yield watched
    finally:
        watched.stop()


def main(argv=None) -> int:
    """A rank on its node: refuse to start where the model path or the GPUs are missing, else exec the server."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--checks", required=True, help="JSON: model_path, tp_size, nodes, extra_args")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the server command")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    checks = json.loads(args.checks)
    checks["extra_args"] = tuple(checks["extra_args"])
    sglang = SGLangServer(python=cmd[0], trust_remote_code=False, mem_fraction_static=None, env=(), **checks)
    try:
        check_model_path(sglang)
        check_gpus(sglang)
    except RuntimeError as exc:
        print(f"rank on node {socket.gethostname()}: the SGLang server was not started: {exc}", file=sys.stderr)
        return 3
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main())
