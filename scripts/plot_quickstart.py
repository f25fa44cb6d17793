"""The quickstart's training curve for the manual (docs/training.md), from a run folder.

    python scripts/plot_quickstart.py runs/quickstart docs/quickstart_curve.svg

Reads ``metrics.jsonl`` (one row per GRPO iteration) and, when present, ``summary.json``
(the held-out evaluation before and after GRPO); draws the success rate of each
iteration's own training episodes and the mean reward, with the held-out before and after
success rates and their 95% intervals at both ends.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load(run_dir: Path) -> tuple[list[dict], dict | None]:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise SystemExit(f"error: {metrics} not found; give the output_dir of a finished `draco-gym train` run")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"error: {metrics} has no iterations")
    summary = run_dir / "summary.json"
    return rows, json.loads(summary.read_text()) if summary.is_file() else None


def plot(rows: list[dict], summary: dict | None, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    its = [r.get("training_iteration", i + 1) for i, r in enumerate(rows)]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(its, [r.get("env_runners/env/success") for r in rows], marker="o",
            label="train episodes: success rate")
    ax.plot(its, [r.get("env_runners/episode_return_mean") for r in rows], marker=".", linestyle="--",
            label="train episodes: mean reward")
    if summary:
        for x, key, colour in ((0, "before", "tab:red"), (its[-1] + 1, "after", "tab:green")):
            rate = summary["eval"][key]["success_rate"]
            low, high = rate["ci95"]
            ax.errorbar([x], [rate["mean"]], yerr=[[rate["mean"] - low], [high - rate["mean"]]], fmt="s",
                        color=colour, capsize=4, label=f"held-out success {key} GRPO (95% CI)")
    ax.set_xlabel("GRPO iteration (held-out evaluation at 0 and after the last)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(-0.05, 1.3)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=7)
    ax.set_title("Quickstart: SmolLM2-135M, warm start then GRPO", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Date": None} if out.suffix == ".svg" else None)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run's output_dir (metrics.jsonl, summary.json)")
    parser.add_argument("out", type=Path, help="the image to write (.svg or .png)")
    args = parser.parse_args(argv)
    if args.out.suffix not in (".svg", ".png"):
        print(f"error: {args.out}: write a .svg or .png", file=sys.stderr)
        return 2
    plot(*load(args.run_dir), args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
