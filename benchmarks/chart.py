"""The benchmark's pictures (matplotlib, written as PNG)."""

__all__ = ["comparison_chart", "scaling_chart"]

STRATEGY_ORDER = (
    "one_device",
    "dpkeras",
    "dpkeras_hybrid",
    "dpkeras_sharded",
    "mirrored",
    "central_storage",
)
COLOURS = {
    "one_device": "#7f7f7f",
    "dpkeras": "#1f77b4",
    "dpkeras_sharded": "#9467bd",
    "dpkeras_hybrid": "#17becf",
    "mirrored": "#ff7f0e",
    "central_storage": "#2ca02c",
}
MB = 1e6


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ordered(names):
    known = [s for s in STRATEGY_ORDER if s in names]
    return known + sorted(set(names) - set(known))


def comparison_chart(records, path, subtitle=""):
    """Three panels per model: steps/s relative to one device, tensors and MB to each replica.

    Failed pairs are drawn as an empty, hatched bar labelled "failed".
    """
    plt = _pyplot()
    models = list(dict.fromkeys(r["model"] for r in records))
    strategies = _ordered({r["strategy"] for r in records})
    panels = (
        ("steps/s relative to one_device", lambda r: r.get("ratio_to_one_device")),
        ("tensors sent to each replica per step", lambda r: r.get("tensors_to_replicas_per_step")),
        (
            "MB to each replica per step (sent + all-reduced)",
            lambda r: (
                (
                    (r.get("bytes_to_replicas_per_step") or 0)
                    + (r.get("collective_bytes_per_replica_per_step") or 0)
                )
                / MB
            ),
        ),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5))
    width = 0.8 / max(1, len(strategies))
    for ax, (title, value) in zip(axes, panels):
        labelled = set()
        for j, s in enumerate(strategies):
            for i, m in enumerate(models):
                match = [r for r in records if r["model"] == m and r["strategy"] == s]
                if not match:
                    continue
                r = match[0]
                x = i + (j - (len(strategies) - 1) / 2) * width
                v = value(r) if r.get("status") == "ok" else None
                if v is None:
                    ax.bar(x, 0, width, color="none", edgecolor=COLOURS.get(s, "k"), hatch="//")
                    ax.text(
                        x,
                        0,
                        "failed",
                        rotation=90,
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        color=COLOURS.get(s, "k"),
                    )
                else:
                    ax.bar(x, v, width, color=COLOURS.get(s), label=None if s in labelled else s)
                    labelled.add(s)
        if "relative" in title:
            ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xticks(range(len(models)))
        ax.set_xticklabels(models)
        ax.set_title(title, fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.suptitle(f"dpkeras benchmark{': ' + subtitle if subtitle else ''}", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def scaling_chart(records, path, subtitle=""):
    """Per model and size: steps/s relative to one device, and MB to each replica per step,
    against the number of replicas, one line per strategy."""
    plt = _pyplot()
    keys = sorted({(r["model"], r.get("size")) for r in records})
    fig, axes = plt.subplots(2, len(keys), figsize=(4.5 * len(keys), 7.5), squeeze=False)
    for col, (model, size) in enumerate(keys):
        group = [
            r
            for r in records
            if r["model"] == model and r.get("size") == size and r["strategy"] != "one_device"
        ]
        for s in _ordered({r["strategy"] for r in group}):
            rows = sorted((r for r in group if r["strategy"] == s), key=lambda r: r["replicas"])
            ok = [r for r in rows if r.get("status") == "ok"]
            xs = [r["replicas"] for r in ok]
            axes[0][col].plot(
                xs,
                [r.get("ratio_to_one_device") or float("nan") for r in ok],
                "o-",
                color=COLOURS.get(s),
                label=s,
            )
            axes[1][col].plot(
                xs,
                [
                    (
                        (r.get("bytes_to_replicas_per_step") or 0)
                        + (r.get("collective_bytes_per_replica_per_step") or 0)
                    )
                    / MB
                    for r in ok
                ],
                "o-",
                color=COLOURS.get(s),
                label=s,
            )
            failed = [r["replicas"] for r in rows if r.get("status") != "ok"]
            if failed:
                axes[0][col].plot(
                    failed,
                    [0] * len(failed),
                    "x",
                    color=COLOURS.get(s),
                    markersize=9,
                    label=f"{s} failed",
                )
        axes[0][col].axhline(1.0, color="k", lw=0.8, ls="--")
        axes[0][col].set_title(f"{model}, size {size:g}: steps/s / one_device", fontsize=10)
        axes[1][col].set_title(f"{model}, size {size:g}: MB to each replica/step", fontsize=10)
        counts = sorted({r["replicas"] for r in group})
        for row in axes:
            row[col].set_xscale("log", base=2)
            row[col].set_xticks(counts)
            row[col].set_xticklabels([str(n) for n in counts])
            row[col].minorticks_off()
            row[col].set_xlabel("replicas")
        axes[0][col].legend(fontsize=7)
    fig.suptitle(f"dpkeras scaling{': ' + subtitle if subtitle else ''}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
