"""Result records: derived columns, targets, tables and files. Pure Python (no TensorFlow).

A record is the dict one worker prints (see `benchmarks.worker`), one per strategy/model pair.
`derive` adds the columns that compare pairs (ratios to `one_device` and `mirrored`, the loss
check); `write_results` writes them as JSON lines and a Markdown table.
"""

import json
import math
import os

__all__ = [
    "REQUIRED_FIELDS",
    "derive",
    "check_targets",
    "format_table",
    "markdown_report",
    "write_results",
    "short_error",
    "lookup_tables",
]

# Every JSON line has at least these keys (None where a failed pair has no value).
REQUIRED_FIELDS = (
    "strategy",
    "model",
    "replicas",
    "status",
    "error",
    "steps_per_sec",
    "examples_per_sec",
    "tensors_to_replicas_per_step",
    "bytes_to_replicas_per_step",
    "final_loss",
    "loss_vs_one_device",
)

MB = 1e6


def _ok(record):
    return record.get("status") == "ok"


def _relative(value, reference):
    if value is None or reference is None or not math.isfinite(reference) or reference == 0:
        return None
    return (value - reference) / abs(reference)


def _ratio(value, reference):
    if value is None or not reference:
        return None
    return value / reference


def _find(records, strategy, model, size, replicas=None):
    found = [
        r
        for r in records
        if _ok(r)
        and r["strategy"] == strategy
        and r["model"] == model
        and r.get("size") == size
        and (replicas is None or r["replicas"] == replicas)
    ]
    return found[0] if len(found) == 1 else None


def derive(records, tolerances=None):
    """Returns copies of `records` with the comparison columns filled in.

    Added to every record (None when a pair or its reference failed or is absent):
        ratio_to_one_device: steps/s over `one_device`'s for the same model and size.
        ratio_to_mirrored: steps/s over `mirrored`'s for the same model, size and replicas.
        loss_vs_one_device: (final_loss - one_device's) / |one_device's|; `final_loss` is
            the loss `fit` reported for the last timed repeat. Over hundreds of steps, the
            different order of floating-point sums makes correct strategies drift apart too.
        eval_loss_vs_one_device: the same for `eval_loss`, the loss recomputed on the first
            batch from the trained weights, outside the strategy.
        check_loss_vs_one_device: the same for `check_loss`, the loss `fit` reported over the
            first few steps, before such drift.
        loss_check: "reference" for one_device; "ok" when |check_loss_vs_one_device| is within
            the model's tolerance, "DIFFERS" when not; None without a reference.

    Args:
        records: list of dicts as printed by workers.
        tolerances: `{model: relative tolerance}` for `loss_check`; default 1e-4.
    """
    tolerances = tolerances or {}
    out = []
    for record in records:
        r = dict(record)
        for key in (
            "ratio_to_one_device",
            "ratio_to_mirrored",
            "loss_vs_one_device",
            "eval_loss_vs_one_device",
            "check_loss_vs_one_device",
            "loss_check",
        ):
            r.setdefault(key, None)
        if _ok(r):
            model, size = r["model"], r.get("size")
            one = _find(records, "one_device", model, size)
            mirrored = (
                _find(records, "mirrored", model, size, r["replicas"])
                if r["strategy"] != "one_device"
                else _find(records, "mirrored", model, size)
            )
            if one is not None:
                r["ratio_to_one_device"] = _ratio(r.get("steps_per_sec"), one["steps_per_sec"])
                r["loss_vs_one_device"] = _relative(r.get("final_loss"), one.get("final_loss"))
                r["eval_loss_vs_one_device"] = _relative(r.get("eval_loss"), one.get("eval_loss"))
                r["check_loss_vs_one_device"] = _relative(
                    r.get("check_loss"), one.get("check_loss")
                )
            if mirrored is not None:
                r["ratio_to_mirrored"] = _ratio(r.get("steps_per_sec"), mirrored["steps_per_sec"])
            if r["strategy"] == "one_device":
                r["loss_check"] = "reference"
            elif r["check_loss_vs_one_device"] is not None:
                tolerance = tolerances.get(model, 1e-4)
                r["loss_check"] = (
                    "ok" if abs(r["check_loss_vs_one_device"]) <= tolerance else "DIFFERS"
                )
        out.append(r)
    return out


def check_targets(records, model="mlp"):
    """The issue's targets for dpkeras on `model`, one dict per target and replica count.

    Each dict: `target` (text), `replicas`, `value` (the measured ratio or count), `limit`,
    `met` (bool, None when a pair it needs failed or is absent) and `detail` (text).
    """
    results = []
    for r in records:
        if not (r["strategy"] == "dpkeras" and r["model"] == model):
            continue
        n = r["replicas"]

        def add(target, value, limit, met, detail, n=n):
            results.append(
                {
                    "target": target,
                    "replicas": n,
                    "value": value,
                    "limit": limit,
                    "met": met,
                    "detail": detail,
                }
            )

        if not _ok(r):
            add("dpkeras runs", None, None, False, f"dpkeras failed: {r.get('error')}")
            continue
        size = r.get("size")
        for name, strategy, limit in (
            ("steps/s >= central_storage's", "central_storage", 1.0),
            ("steps/s >= 1.3x mirrored's", "mirrored", 1.3),
            ("steps/s within 10% of one_device's", "one_device", 0.9),
        ):
            other = _find(records, strategy, model, size, None if strategy == "one_device" else n)
            if other is None:
                add(name, None, limit, None, f"no successful {strategy} pair to compare with")
                continue
            ratio = r["steps_per_sec"] / other["steps_per_sec"]
            add(
                name,
                ratio,
                limit,
                ratio >= limit,
                f"{r['steps_per_sec']:.2f} vs {other['steps_per_sec']:.2f} steps/s "
                f"= {ratio:.3f}x (needs >= {limit:.2f}x)",
            )
        split = r.get("tensors_to_each_replica")
        variables = r.get("model_variables")
        if split and variables is not None:
            device, (_, arrays, _, unknown) = max(split.items(), key=lambda kv: kv[1][1])
            add(
                "tensors to each replica <= one per model variable",
                arrays,
                variables,
                arrays <= variables,
                f"at most {arrays} array tensors to a replica per step ({device}) for "
                f"{variables} model variables"
                + (
                    f"; plus {unknown} of unknown shape (control edges, no data)" if unknown else ""
                ),
            )
            device, (_, _, scalars, _) = max(split.items(), key=lambda kv: kv[1][2])
            add(
                "metrics add no tensors to replicas",
                scalars,
                0,
                scalars == 0,
                f"{scalars} scalar tensors to {device} per step (metric state and counters; "
                f"the model has {r.get('metric_variables')} metric variables)",
            )
    return results


def short_error(error, limit=100):
    """The first sentence of an error line, cut to `limit` characters, for tables."""
    if not error:
        return ""
    text = error
    for stop in (". ", ".`", "\n"):
        i = text.find(stop)
        if 0 < i:
            text = text[: i + 1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fmt(value, spec, missing="-"):
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return missing
    return format(value, spec)


def _variables(by_device):
    """`{'/cpu:0': 8036500}` -> `'/cpu:0 8.04'`; equal copies on 3 devices -> `'3 x 8.04'`."""
    if not by_device:
        return "-"
    sizes = set(by_device.values())
    if len(by_device) > 1 and len(sizes) == 1:
        return f"{len(by_device)} x {sizes.pop() / MB:.2f}"
    return ", ".join(f"{d} {b / MB:.2f}" for d, b in by_device.items())


COLUMNS = (
    ("model", "model"),
    ("size", "size"),
    ("strategy", "strategy"),
    ("repl", "replicas"),
    ("status", "status"),
    ("steps/s", "steps/s"),
    ("spread", "spread"),
    ("ex/s", "examples/s"),
    ("x1dev", "x one_device"),
    ("xmirr", "x mirrored"),
    ("cpu s/step", "CPU s/step"),
    ("->repl t", "tensors to each replica/step"),
    ("->repl MB", "MB to each replica/step"),
    ("<-repl t", "tensors back/step"),
    ("allred", "all-reduce ops, MB/replica/step"),
    ("vars MB", "variable MB by device"),
    ("loss", "final loss"),
    ("dloss", "vs one_device"),
    ("check", "loss check (first steps vs one_device)"),
)


def _row(r):
    ok = _ok(r)
    status = "ok" if ok else f"FAILED ({r.get('phase') or 'run'})"
    allreduce = "-"
    if ok and r.get("collectives_per_replica_per_step"):
        allreduce = (
            f"{r['collectives_per_replica_per_step']:g}, "
            f"{r['collective_bytes_per_replica_per_step'] / MB:.2f}"
        )
    return [
        r["model"],
        _fmt(r.get("size"), "g"),
        r["strategy"],
        str(r["replicas"]),
        status,
        _fmt(r.get("steps_per_sec"), ".2f"),
        _fmt(
            None if r.get("steps_per_sec_spread") is None else 100 * r["steps_per_sec_spread"],
            ".0f",
        )
        + ("%" if ok else ""),
        _fmt(r.get("examples_per_sec"), ".0f"),
        _fmt(r.get("ratio_to_one_device"), ".2f"),
        _fmt(r.get("ratio_to_mirrored"), ".2f"),
        _fmt(r.get("cpu_seconds_per_step"), ".3f"),
        _fmt(r.get("tensors_to_replicas_per_step"), ".4g"),
        _fmt(
            None
            if r.get("bytes_to_replicas_per_step") is None
            else r["bytes_to_replicas_per_step"] / MB,
            ".3f",
        ),
        _fmt(r.get("tensors_from_replicas_per_step"), ".4g"),
        allreduce,
        _variables(r.get("variable_bytes_by_device")) if ok else "-",
        _fmt(r.get("final_loss"), ".5f"),
        _fmt(None if r.get("loss_vs_one_device") is None else 100 * r["loss_vs_one_device"], "+.3f")
        + ("%" if r.get("loss_vs_one_device") is not None else ""),
        _check(r),
    ]


def _check(r):
    check = r.get("loss_check")
    delta = r.get("check_loss_vs_one_device")
    if check in ("ok", "DIFFERS") and delta is not None:
        return f"{check} ({100 * delta:+.3g}%)"
    return check or "-"


def format_table(records):
    """A fixed-width text table of `derive`d records, for the terminal."""
    header = [short for short, _ in COLUMNS]
    rows = [header] + [_row(r) for r in records]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    failures = [r for r in records if not _ok(r)]
    if failures:
        lines.append("")
        lines.append("Failed pairs (the error's first line):")
        for r in failures:
            lines.append(
                f"  {r['model']} / {r['strategy']} / {r['replicas']} replicas, in "
                f"{r.get('phase') or 'run'}: {short_error(r.get('error'), 200)}"
            )
    return "\n".join(lines)


def _markdown_table(records):
    header = [long for _, long in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in records:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in _row(r)) + " |")
    return lines


def format_targets(targets):
    """Lines saying which targets were met, by how much."""
    lines = []
    for t in targets:
        mark = {True: "MET   ", False: "MISSED", None: "N/A   "}[t["met"]]
        lines.append(f"  [{mark}] {t['replicas']} replicas: {t['target']}: {t['detail']}")
    return lines


def legend():
    """What the columns mean, for the Markdown report."""
    return [
        "Columns: steps/s is the median over the timed repeats and spread is (max - min) / "
        "median; x one_device and x mirrored divide steps/s by those strategies' (same model, "
        "size and replicas); CPU s/step is the process's CPU time per step (all threads; less "
        "sensitive to other load than steps/s). Transfers are counted from TensorFlow's "
        "partitioned step graph (real _Send/_Recv), averaged over replicas; all-reduce is "
        "MirroredStrategy's collective ops and the bytes they reduce. Variable MB counts model, "
        "optimizer and metric variables once per copy. The final loss is what fit reported "
        "for the last repeat (over hundreds of steps, correct strategies drift apart by the "
        "order of their floating-point sums); the loss check compares the loss fit reported "
        "over the first steps with one_device's, within a tolerance per model, and says "
        "DIFFERS when a strategy computes (or reports) something else.",
    ]


def markdown_report(records, title, machine_lines, targets=None, extra=None):
    """The Markdown file: title, machine description, table, failures, targets."""
    lines = [f"# {title}", ""]
    lines += [f"    {line}" for line in machine_lines]
    lines += [""] + _markdown_table(records) + [""]
    lines += legend() + [""]
    failures = [r for r in records if not _ok(r)]
    if failures:
        lines.append(
            "Failed pairs (the error's first sentence; the JSON lines have its whole first line):"
        )
        lines.append("")
        for r in failures:
            error = short_error(r.get("error"), 240).replace("`", "'")
            lines.append(
                f"- {r['model']} / {r['strategy']} / {r['replicas']} replicas, in "
                f"{r.get('phase') or 'run'}: {error}"
            )
        lines.append("")
    if targets:
        lines += (
            ["Targets (dpkeras on the MLP):", "", "```"] + format_targets(targets) + ["```", ""]
        )
    if extra:
        lines += list(extra) + [""]
    return "\n".join(lines)


def write_jsonl(records, path):
    """Writes one JSON object per line; every line has `REQUIRED_FIELDS`."""
    with open(path, "w") as f:
        for r in records:
            line = {k: r.get(k) for k in REQUIRED_FIELDS}
            line.update(r)
            f.write(json.dumps(line, sort_keys=False) + "\n")


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_results(records, out_dir, stem, title, machine_lines, targets=None, extra=None):
    """Writes `<stem>.jsonl` and `<stem>.md` under `out_dir`; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    jsonl = os.path.join(out_dir, f"{stem}.jsonl")
    md = os.path.join(out_dir, f"{stem}.md")
    write_jsonl(records, jsonl)
    with open(md, "w") as f:
        f.write(markdown_report(records, title, machine_lines, targets, extra) + "\n")
    return jsonl, md


def lookup_tables(records):
    """Markdown lines: per model with embedding lookups, the rows a step's ids need per replica
    (every id, distinct per replica, distinct per step), from the data, next to each strategy's
    counted transfers and its tables' memory. [] when no record has lookups."""
    rows = [r for r in records if r.get("ids_per_replica_per_step") is not None]
    if not rows:
        return []
    lines = [
        "Embedding lookups, per replica per step (from the ids; float32 rows): every id's row, "
        "each distinct row of the replica's share, each distinct row of the global batch "
        "(shared by the replicas); then the bytes to each replica the step graph's transfers "
        "count (a row count known only at run time, as after deduplication, is not counted "
        "there) and the tables' memory with optimizer slots, times the copies kept.",
        "",
        "| model | strategy | repl | dedup | ids | MB all ids | distinct | MB distinct "
        "| distinct/step | MB distinct/step | ->repl MB counted | tables GiB x copies | status |",
        "|" + "---|" * 13,
    ]
    for r in rows:
        copies = r.get("table_copies")
        tables = r.get("table_bytes_with_slots")
        lines.append(
            "| "
            + " | ".join(
                [
                    r["model"],
                    r["strategy"],
                    str(r["replicas"]),
                    str(r.get("deduplicate") or "-"),
                    _fmt(r.get("ids_per_replica_per_step"), ".0f"),
                    _fmt(_mb(r.get("id_row_bytes_per_replica_per_step")), ".3f"),
                    _fmt(r.get("distinct_ids_per_replica_per_step"), ".0f"),
                    _fmt(_mb(r.get("distinct_row_bytes_per_replica_per_step")), ".3f"),
                    _fmt(r.get("distinct_ids_per_step"), ".0f"),
                    _fmt(_mb(r.get("distinct_row_bytes_per_step")), ".3f"),
                    _fmt(_mb(r.get("bytes_to_replicas_per_step")), ".3f"),
                    "-" if not tables else f"{tables / 2**30:.3f} x {copies}",
                    "ok" if _ok(r) else f"FAILED ({r.get('phase') or 'run'})",
                ]
            )
            + " |"
        )
    return lines


def _mb(value):
    return None if value is None else value / MB


def scaling_tables(records):
    """Pivot tables for a scaling run, as Markdown lines: per model and size, one row per
    strategy and one column per replica count, of steps/s relative to one device, and of MB
    sent to (or all-reduced by) each replica per step."""
    lines = []
    keys = sorted({(r["model"], r.get("size")) for r in records}, key=lambda k: (k[0], k[1]))
    for model, size in keys:
        group = [r for r in records if r["model"] == model and r.get("size") == size]
        replicas = sorted({r["replicas"] for r in group if r["strategy"] != "one_device"})
        strategies = [
            s
            for s in ("dpkeras", "dpkeras_hybrid", "dpkeras_sharded", "mirrored", "central_storage")
            if any(r["strategy"] == s for r in group)
        ]
        one = _find(group, "one_device", model, size)
        base = (
            f"one_device: {one['steps_per_sec']:.2f} steps/s"
            if one
            else "one_device: not run or failed"
        )
        for title, cell in (
            (f"steps/s relative to one_device ({base})", _scaling_ratio_cell),
            ("MB to each replica per step (sent + all-reduced)", _scaling_bytes_cell),
        ):
            lines += [
                f"**{model}, size {size:g}: {title}**",
                "",
                "| strategy | "
                + " | ".join(f"{n} replica{'s' if n != 1 else ''}" for n in replicas)
                + " |",
                "|---|" + "---|" * len(replicas),
            ]
            for s in strategies:
                cells = []
                for n in replicas:
                    match = [r for r in group if r["strategy"] == s and r["replicas"] == n]
                    cells.append(cell(match[0]) if match else "-")
                lines.append(f"| {s} | " + " | ".join(cells) + " |")
            lines.append("")
    return lines


def _scaling_ratio_cell(r):
    if not _ok(r):
        return "failed"
    ratio = r.get("ratio_to_one_device")
    return f"{ratio:.2f}" if ratio is not None else f"{r['steps_per_sec']:.2f} steps/s"


def _scaling_bytes_cell(r):
    if not _ok(r):
        return "failed"
    sent = (r.get("bytes_to_replicas_per_step") or 0) / MB
    reduced = (r.get("collective_bytes_per_replica_per_step") or 0) / MB
    return f"{sent:.2f} + {reduced:.2f}" if reduced else f"{sent:.2f}"
