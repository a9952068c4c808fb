"""One shard of a category through its servers: plan which turns the journal already holds, start or
find the servers, run the client, and assemble the generations rows in prompt order. Run by the
generate step (a shard's job) and the pilot step (its sample). Only a job that sends rows loads the
tokenizer (to check its servers' first answers and to make later turns).
"""

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from eagle3_datagen.engine_settings import EngineSettings
from eagle3_datagen.generation.assemble import FailureCount, assemble, journalled_result
from eagle3_datagen.generation.client import GenerateClient, ServerDied, run_loop
from eagle3_datagen.generation.identity import AnswerCheck, ServerMismatch, check_model_info
from eagle3_datagen.generation.journal import Journal, loop_rows
from eagle3_datagen.generation.launch import api_key
from eagle3_datagen.generation.planning import Plan, make_builder, make_plan, requests_to_send
from eagle3_datagen.generation.progress import ShardProgress, publishing
from eagle3_datagen.generation.server_info import seeds_honoured, server_provenance, streams_incrementally
from eagle3_datagen.generation.servers import job_facts, servers, terminate_on_sigterm
from eagle3_datagen.generation.streaming import LiveStop
from eagle3_datagen.generation.turns import TurnBuilder, follower
from eagle3_datagen.quality.flags import QualitySettings
from eagle3_datagen.settings import ClientSettings, ModelProfile
from eagle3_datagen.storage.tables import TableWriter

log = logging.getLogger(__name__)


class TooManyFailures(RuntimeError):
    """More than `max_failed_share` of a category's attempted rows failed."""


def generate_category(
    prompt_rows: Callable[[], Iterable[dict]],
    *,
    facts: dict,
    profile: ModelProfile,
    sampling: dict,
    engine: EngineSettings | dict,
    budget: dict,
    client_settings: ClientSettings,
    journal: Journal,
    server_log: Path,
    max_failed_share: float,
    category: str,
    writer: TableWriter,
    may_send: bool = True,
    quality: QualitySettings | None = None,
    shard: tuple[int, int] = (0, 1),
) -> dict:
    """Generate every usable row of a category into `writer`; returns the provenance.

    `prompt_rows()` reads the shard's prompt rows anew; `journal` keeps every finished row and is where
    results are read back from; `quality` (default: the schema's) says whether loops are stopped live.
    """
    quality = quality or QualitySettings.from_config()
    journal.reuse = loop_rows(quality.loop if quality.stops_loops_live else None)
    engine = EngineSettings.of(engine)
    builder = make_builder(facts, profile, sampling, engine, budget)
    provenance = {
        "model_fingerprint": builder.template.model_fingerprint,
        "modes": {
            m: {"sampling": t.sampling, "model_fingerprint": t.model_fingerprint} for m, t in builder.templates.items()
        },
        "stop_token_ids": builder.template.stop_token_ids,
        "job": job_facts(),
    }
    with journal, terminate_on_sigterm():
        todo = make_plan(prompt_rows(), builder, journal)
        provenance["plan"] = todo.summary()
        log.info("%s plan: %s", category, provenance["plan"])
        progress = ShardProgress(
            journal.path,
            category=category.split("[")[0],
            shard=shard[0],
            shards=shard[1],
            plan=provenance["plan"],
            interval_s=max(client_settings.progress_interval_s, 1.0),
        )
        try:
            if todo.to_send and not may_send:
                raise RuntimeError(
                    f"{category}: its plan had nothing to send, but the journal {journal.path} now lacks "
                    f"{todo.to_send} rows (was it moved?): rerun, and its plan sends them from a GPU job"
                )
            if todo.to_send:
                provenance |= _send_plan(
                    todo,
                    prompt_rows,
                    builder,
                    journal,
                    engine=engine,
                    profile=profile,
                    client_settings=client_settings,
                    server_log=server_log,
                    category=category,
                    quality=quality,
                    progress=progress,
                )
            failures = FailureCount()
            writer.write(failures.count(assemble(prompt_rows(), builder, journalled_result(journal))))
            _check_failures(failures, max_failed_share, category, journal)
        except BaseException as exc:
            progress.finish(exc)
            raise
        progress.finish()
    return provenance


def _send_plan(
    todo: Plan,
    prompt_rows: Callable[[], Iterable[dict]],
    builder: TurnBuilder,
    journal: Journal,
    *,
    engine: EngineSettings | dict,
    profile: ModelProfile,
    client_settings: ClientSettings,
    server_log: Path,
    category: str,
    quality: QualitySettings,
    progress: ShardProgress,
) -> dict:
    """Send the plan's requests and their later turns until the journal holds every one; the provenance."""
    key = api_key(engine)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    # Each server's first answers are checked against the tokenizer the prompts were made with (the
    # one the later turns use). The first mode's chat layer is built here, before the server is
    # started, so that a profile it cannot take ends the job before any GPU time is spent.
    answer_check = AnswerCheck(builder.layer_for(profile.mode).tokenizer, tokenizer_dir=profile.tokenizer)
    # Answers are streamed wherever the servers can (a cut one is resumed); loops are watched where stopped live.
    with servers(engine, profile=profile, log_path=server_log, key=key, incremental_streaming=True) as srv:
        sent = {"servers": server_provenance(srv.urls, profile, headers)}
        live = _live_stop(LiveStop.from_quality(quality), sent["servers"], category)
        stopped = live is not None and live.loop is not None
        sent["live_stop"] = {"stopped_live": stopped, "streamed": live is not None, **quality.to_json()}
        for url, info in sent["servers"].items():  # refuses a server that cannot serve this job
            log.info(
                "%s", check_model_info(info["model_info"], info["server_info"], url=url, tokenizer=profile.tokenizer)
            )
        # A seed labels a row; it makes the row reproducible only where the server honours it.
        sent["seeds_honoured"] = seeds_honoured(sent["servers"])
        if not sent["seeds_honoured"]:
            log.warning(
                "%s: the server runs without --enable-deterministic-inference: each row's seed is "
                "recorded but does not make it reproducible (engine.deterministic_inference)",
                category,
            )
        client = GenerateClient(
            srv.urls,
            builder.template,
            client_settings,
            label=category,
            headers=headers,
            alive=srv.alive,
            answer_check=answer_check,
            live=live,
        )
        # A conversation's next turn is made from its answer as soon as the answer is journalled.
        # (Only where there are later turns: each entry waits for its answer's follow-up.)
        in_flight: dict | None = {} if todo.later_turns else None
        requests = requests_to_send(prompt_rows(), builder, journal, in_flight)
        journal.remaining_rows = todo.to_send + todo.later_turns  # for a full disk's message
        try:
            with publishing(progress, lambda: _sent_counts(client)):
                run_loop(
                    client.run(
                        requests,
                        journal,
                        total=todo.to_send + todo.later_turns,
                        keep_results=False,
                        follow=follower(in_flight) if todo.later_turns else None,
                    )
                )
        except ServerDied as exc:  # where to look: the rank that died first and its log's end, else its log
            where = (srv.ranks is not None and srv.ranks.first_death()) or f"its log is {server_log}"
            raise ServerDied(
                f"{category}: {exc}; {where}. The journal {journal.path} keeps every finished row: rerun to resume."
            ) from None
        except ServerMismatch as exc:
            raise ServerMismatch(f"{category}: {exc}") from None
        sent["client"] = {**client.pace, **client.load_facts()}
    return sent


def _sent_counts(client: GenerateClient) -> dict:
    """The client's counts for the progress file (read from another thread: plain numbers)."""
    counts = client.progress
    if counts is None:
        return {}
    return {
        "done": counts.done,
        "failed": counts.failed,
        "retries": counts.retries,
        "output_tokens": counts.tokens,
        "in_flight": client.in_flight,
        "limit": client.control.limit if client.control is not None else None,
    }


def _live_stop(live: LiveStop, infos: dict, category: str) -> LiveStop | None:
    """`live`, unless a server would stream every chunk whole: then requests are not streamed (a warning)."""
    whole = [url for url, info in infos.items() if not streams_incrementally(info["server_info"])]
    if not whole:
        return live
    log.warning(
        "%s: %s streams without --incremental-streaming-output (/server_info incremental_streaming_output is "
        "false): every streamed chunk would repeat the whole output, so requests are not streamed: %sa cut "
        "answer (a timeout, a dropped connection) is generated again from its start, not resumed",
        category,
        ", ".join(whole),
        "loops are not stopped live (quality.live_stop), they run to max_new_tokens and the quality gate flags "
        "them afterwards; "
        if live.loop is not None
        else "",
    )
    return None


def _check_failures(failures: FailureCount, max_failed_share: float, category: str, journal: Journal) -> None:
    """Raise `TooManyFailures` when more than `max_failed_share` of the attempted rows failed."""
    share = failures.failed / failures.attempted if failures.attempted else 0.0
    if share > max_failed_share:
        raise TooManyFailures(
            f"{category}: {failures.failed} of {failures.attempted} rows failed ({share:.1%} > max_failed_share "
            f"{max_failed_share:.1%}); the journal {journal.path} keeps the finished rows, and a rerun sends only "
            f"the failed ones. First failures: {'; '.join(failures.examples)}"
        )
