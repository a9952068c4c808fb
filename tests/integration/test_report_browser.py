"""The report in a real browser: its first page leads with the run's numbers, and every figure loads.

A small run (a pilot, then the whole workflow, on the scripted engine behind the demo's Kimi-shaped
template and its two serving modes), then `snakemake --report`, opened in headless Chromium (Debian's
chromium package) driven over the Chrome DevTools Protocol. The expected values are read from the
run's own files (the summary, the parser checks, the headline fragment the report includes).
"""

import asyncio
import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import aiohttp
import pytest
from workdir import Workdir, demo_rows

from eagle3_datagen.steps.headline import HEADLINE_ID, count, percent, read_table
from polling import wait_until

pytestmark = pytest.mark.slow

# Limits for a loaded two-core machine: a run of the workflow, the browser's start, and the report's
# first render (several MB of inline scripts and data URIs).
RUN_TIMEOUT_S = 1200
BROWSER_START_S = 120
PAGE_TIMEOUT_S = 180
# The demo's answers fall into repetition loops in one of ten; here in one of three, so that the quality
# gate filters rows the headline counts by flag.
LOOPS = "--loop-share 0.3 --loop-onset 16:24 --loop-period 1:4 --loop-seed 1"


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's Chromium, installed when missing and the tests run as root (as .ci/run does)."""
    path = shutil.which("chromium")
    if path is None:
        if os.geteuid() != 0:
            pytest.skip("needs Debian's chromium (apt-get install -y chromium, as root)")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update"], check=True, stdout=subprocess.DEVNULL, env=env)
        subprocess.run(["apt-get", "install", "-y", "chromium"], check=True, stdout=subprocess.DEVNULL, env=env)
        path = shutil.which("chromium")
    assert path is not None, "chromium is not on PATH after apt-get install chromium"
    return path


@pytest.fixture(scope="module")
def report_run(tmp_path_factory, kimi_tokenizer_dir):
    """A pilot and the whole run of two categories (math in both serving modes, chat in its default one,
    with a malformed row to skip), and its report."""
    wd = Workdir(
        tmp_path_factory.mktemp("report"),
        tokenizer=kimi_tokenizer_dir,
        model_dir=None,
        backend="scripted",
        categories={"math": demo_rows("math", 6) + ['{"id": "broken", "messages": ['], "chat": demo_rows("chat", 6)},
        mode_mix={"math": "all"},
        engine_args=LOOPS,
        pilot={"fraction": 0.5, "min_rows": 2},
    )
    wd.snakemake("--cores", "2", "pilot", timeout=RUN_TIMEOUT_S)
    wd.snakemake("--cores", "2", timeout=RUN_TIMEOUT_S)
    wd.snakemake("--report", "report.html", timeout=RUN_TIMEOUT_S)
    return wd


class Page:
    """One browser tab over the DevTools Protocol: commands in order, the page's uncaught errors kept."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        self.sent = 0
        self.events: set[str] = set()
        self.errors: list[str] = []

    async def _until(self, done, what: str, timeout_s: float) -> dict:
        """Read the browser's messages (keeping events and errors) until `done(message)` is true."""
        async with asyncio.timeout(timeout_s):
            async for message in self.ws:
                data = json.loads(message.data)
                if "method" in data:
                    self.events.add(data["method"])
                if data.get("method") == "Runtime.exceptionThrown":
                    self.errors.append(json.dumps(data["params"]["exceptionDetails"])[:2000])
                if done(data):
                    return data
        raise AssertionError(f"{what}: the browser closed the connection")

    async def call(self, method: str, timeout_s: float = PAGE_TIMEOUT_S, **params) -> dict:
        self.sent += 1
        sent = self.sent
        await self.ws.send_json({"id": sent, "method": method, "params": params})
        data = await self._until(lambda d: d.get("id") == sent, method, timeout_s)
        assert "error" not in data, f"{method}: {data['error']}"
        return data["result"]

    async def event(self, method: str, timeout_s: float = PAGE_TIMEOUT_S) -> None:
        """Wait for an event (one seen already counts)."""
        if method not in self.events:
            await self._until(lambda d: d.get("method") == method, method, timeout_s)

    async def evaluate(self, expression: str, timeout_s: float = PAGE_TIMEOUT_S):
        """The value of a JavaScript expression; a promise is awaited (until `timeout_s`)."""
        result = await self.call(
            "Runtime.evaluate", timeout_s, expression=expression, awaitPromise=True, returnByValue=True
        )
        assert "exceptionDetails" not in result, f"{expression[:200]}: {result['exceptionDetails']}"
        return result["result"].get("value")


def devtools_port(profile: Path, process: subprocess.Popen) -> int:
    """The DevTools port the browser chose (--remote-debugging-port=0 writes it to its profile)."""
    active = profile / "DevToolsActivePort"

    def written():
        lines = active.read_text().splitlines() if active.exists() else []
        return int(lines[0]) if lines and lines[0].isdigit() else None

    return wait_until(written, "Chromium's DevTools port", timeout_s=BROWSER_START_S, process=process)


# Resolves once the report's app has rendered its first page (the description and the workflow graph
# are rendered together).
FIRST_PAGE = """new Promise(resolve => {
    const ready = () => document.getElementById("rulegraph");
    if (ready()) return resolve(true);
    new MutationObserver((_, observer) => { if (ready()) { observer.disconnect(); resolve(true); } })
        .observe(document.body, {childList: true, subtree: true});
})"""

# Where the headline is on the first page (null without one), its text, and the page's text.
LAYOUT = f"""(() => {{
    const section = document.getElementById("{HEADLINE_ID}");
    if (!section) return null;
    const headline = section.getBoundingClientRect();
    const graph = document.getElementById("rulegraph").getBoundingClientRect();
    return {{top: headline.top, bottom: headline.bottom, left: headline.left, right: headline.right,
             graphTop: graph.top, height: window.innerHeight, width: window.innerWidth,
             text: section.textContent, pageText: document.getElementById("app").innerText}};
}})()"""

# Every result the report embeds, loaded from its data URI: images decoded as the browser shows them,
# any other file fetched; and the images on the first page itself.
EMBEDDED = """Promise.all(Object.entries(results).map(([path, r]) => r.mime_type.startsWith("image/")
    ? new Promise(resolve => {
        const img = new Image();
        img.onload = () => resolve({path, mime: r.mime_type, width: img.naturalWidth, height: img.naturalHeight});
        img.onerror = () => resolve({path, mime: r.mime_type, width: 0, height: 0});
        img.src = r.data_uri;
    })
    : fetch(r.data_uri).then(resp => resp.arrayBuffer()).then(
        body => ({path, mime: r.mime_type, bytes: body.byteLength}),
        () => ({path, mime: r.mime_type, bytes: 0}))
)).then(found => ({found, pageImages: Array.from(document.images).map(
    img => ({src: img.src.slice(0, 60), complete: img.complete, width: img.naturalWidth}))}))"""


def text_of_fragment(page_text: str) -> str:
    return " ".join(page_text.split())


async def inspect_report(chromium: str, report: Path, fragment: str, shots: Path) -> dict:
    profile = shots / "profile"
    args = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--remote-debugging-port=0",
        f"--user-data-dir={profile}",
        "--window-size=1400,1000",
        "about:blank",
    ]
    (profile / "DevToolsActivePort").unlink(missing_ok=True)  # a port is read only from this browser
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port = devtools_port(profile, process)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as resp:
                target = next(t for t in await resp.json() if t["type"] == "page")
            async with session.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                await page.call("Runtime.enable")
                await page.call("Page.enable")
                page.events.clear()  # about:blank's own load is not the report's
                await page.call("Page.navigate", url=report.as_uri())
                await page.event("Page.loadEventFired")
                await page.evaluate(FIRST_PAGE)
                shot = await page.call("Page.captureScreenshot", format="png")
                (shots / "first_page.png").write_bytes(base64.b64decode(shot["data"]))
                layout = await page.evaluate(LAYOUT)
                assert layout is not None, f"no headline on the report's first page ({shots / 'first_page.png'})"
                # The fragment the headline step wrote, as the browser reads it, to compare with the page's.
                layout["fragmentText"] = await page.evaluate(
                    f"new DOMParser().parseFromString({json.dumps(fragment)}, 'text/html').body.textContent"
                )
                layout["embedded"] = await page.evaluate(EMBEDDED)
                layout["errors"] = page.errors
                return layout
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def first_page(chromium, report_run, tmp_path_factory) -> dict:
    shots = tmp_path_factory.mktemp("browser")
    fragment = (report_run.path / "results" / "headline.html").read_text(encoding="utf-8")
    page = asyncio.run(inspect_report(chromium, report_run.path / "report.html", fragment, shots))
    page["screenshot"] = shots / "first_page.png"
    return page


def test_the_first_page_leads_with_the_headline(first_page):
    page = first_page
    where = f"(screenshot: {page['screenshot']})"
    assert not page["errors"], f"uncaught errors in the report's page {where}: {page['errors']}"
    # The headline the step wrote is on the first page as it is, seen without scrolling, above the graph.
    assert text_of_fragment(page["text"]) == text_of_fragment(page["fragmentText"]), where
    assert 0 <= page["top"] < page["height"] / 4, f"the headline starts at {page['top']} px {where}"
    assert page["graphTop"] >= page["bottom"], f"the workflow graph is not below the headline {where}"
    assert page["right"] <= page["width"], f"the headline is wider than the window {where}"


def test_the_first_page_says_what_the_run_produced(first_page, report_run):
    text = " ".join(first_page["pageText"].split())
    results = report_run.path / "results"
    summary = {(r["category"], r["mode"]): r for r in read_table(results / "summary.tsv")}
    total = summary[("total", "all")]
    assert total["filtered"] > 0 and total["skipped"] > 0, "the run should leave rows out for two reasons"
    assert f"{count(total['ok'])} of {count(total['rows'])} rows kept" in text
    assert ", ".join(f"{count(total[r])} {r}" for r in ("skipped", "failed", "filtered")) in text
    assert f"{count(total['prompt_tokens'])} prompt tokens and {count(total['output_tokens'])} output tokens" in text
    assert f"{percent(total['truncated_share'])} of answers cut at max_new_tokens" in text
    assert "0 GPU-hours (CPU engine)" in text and "the pilot projected" in text
    # Each category's row, and math's row per mode (it mixes two).
    for (category, mode), row in summary.items():
        if category == "total":
            continue
        numbers = [count(row[k]) for k in ("rows", "ok", "skipped", "failed", "filtered")]
        assert " ".join([category, mode, *numbers]) in text, f"{category} ({mode}): {numbers}"
    assert {m for c, m in summary if c == "math"} == {"thinking", "instant", "all"}
    # The parser checks' verdict counts, per category.
    for category in ("math", "chat"):
        verdicts = json.loads((results / "checks" / f"{category}.json").read_text())["verdicts"]
        checked = verdicts.pop("total")
        assert checked > 0
        for verdict, n in verdicts.items():
            if n:
                assert f"{percent(n / checked)} ({count(n)})" in text, (category, verdict)


def test_every_figure_in_the_report_loads(first_page, report_run):
    embedded = first_page["embedded"]
    found = {Path(e["path"]).name: e for e in embedded["found"]}
    figures = sorted(p.name for p in (report_run.path / "results" / "plots").glob("*.png"))
    assert figures and {name for name, e in found.items() if e["mime"].startswith("image/")} == set(figures)
    for name in figures:
        assert found[name]["width"] > 0 and found[name]["height"] > 0, f"{name} does not decode: {found[name]}"
    for name, entry in found.items():
        if not entry["mime"].startswith("image/"):
            assert entry["bytes"] > 0, f"{name}: {entry}"
    assert "headline.html" in found and "summary.tsv" in found
    for image in embedded["pageImages"]:
        assert image["complete"] and image["width"] > 0, image
