"""The pilot's projection figure: projected output tokens and GPU-hours (server-hours where the
server's GPUs are unknown) per projection row, with the 95 % interval from the pilot sample's
spread; a sentence in place of the hours when the pilot measured no throughput."""

from eagle3_datagen.figures.base import category_axis, empty_panel, integer_ticks, pyplot

NO_PILOT = "No pilot rows: nothing to project."
NO_THROUGHPUT = (
    "No hours projected: the pilot measured no throughput (its client sent no request, as when every "
    "answer of the sample was already in the journal)."
)


def _hours(rows: list[dict]) -> tuple[str, list[float], list[float]] | None:
    """(unit, hours, 95 % half-widths) of the rows, GPU-hours where every row knows its GPUs; None
    where no row has a throughput."""
    if all(r.get("server_hours") is None for r in rows):
        return None
    gpu = all(r.get("gpu_hours") is not None for r in rows)
    key, unit = ("gpu_hours", "GPU-hours") if gpu else ("server_hours", "server-hours")
    hours = [r[key] or 0.0 for r in rows]
    ci = [(r.get("server_hours_ci95") or 0.0) * (r["gpus_per_server"] if gpu else 1) for r in rows]
    return unit, hours, ci


def draw_projection(rows: list[dict], labels: list[str] | None = None):
    """Projected output tokens and hours per projection row (a category, or one of its serving
    modes); `labels` name the bars (default: the rows' categories); the figure, unsaved."""
    names = labels if labels is not None else [r["category"] for r in rows]
    if len(names) != len(rows):
        raise ValueError(f"{len(names)} labels for {len(rows)} projection rows")
    fig, axes = pyplot().subplots(1, 2, figsize=(max(12, 0.7 * len(rows) + 5), 4.2))
    tokens_title = "Projected output tokens (95 % interval)"
    if not rows:
        empty_panel(axes[0], tokens_title, NO_PILOT)
        empty_panel(axes[1], "Projected hours", NO_PILOT)
        return fig
    x = range(len(rows))
    axes[0].bar(x, [r["output_tokens"] for r in rows], 0.6, yerr=[r["output_tokens_ci95"] for r in rows], capsize=4)
    axes[0].set(title=tokens_title, ylabel="output tokens")
    integer_ticks(axes[0].yaxis)
    category_axis(axes[0], names)
    hours = _hours(rows)
    if hours is None:
        empty_panel(axes[1], "Projected hours", NO_THROUGHPUT)
        return fig
    unit, values, ci = hours
    axes[1].bar(x, values, 0.6, yerr=ci, capsize=4, color="tab:orange")
    axes[1].set(title=f"Projected {unit} (95 % interval)", ylabel=f"{unit} at the pilot's throughput")
    category_axis(axes[1], names)
    return fig
