"""Plots of a load sweep (sweep.run_sweep), of two engines' sweeps side by side
(compare.side_by_side) and of one run's schedule (scheduler.ServingResult)."""
from __future__ import annotations

STYLE = {"off": ("tab:grey", "s"), "on": ("tab:blue", "o"), "adaptive": ("tab:green", "^")}


def plot_sweep(df, axes=None):
    """Three panels against load: throughput, TTFT (p50 solid, p99 dashed) and inter-token latency
    (p50 solid, p99 dashed), one colour per policy; medians over repeats. Returns the figure."""
    import matplotlib.pyplot as plt

    if axes is None:
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    else:
        fig = axes[0].figure
    med = df.groupby(["policy", "load"]).median(numeric_only=True).reset_index()
    for policy, g in med.groupby("policy"):
        colour, marker = STYLE.get(policy, (None, "o"))
        g = g.sort_values("load")
        axes[0].plot(g.load, g.throughput_tok_s, marker=marker, color=colour, label=policy)
        for ax, name in ((axes[1], "ttft"), (axes[2], "itl")):
            ax.plot(g.load, g[f"{name}_p50_s"] * 1e3, marker=marker, color=colour, label=f"{policy} p50")
            ax.plot(g.load, g[f"{name}_p99_s"] * 1e3, marker=marker, color=colour, ls="--", alpha=0.7,
                    label=f"{policy} p99")
    titles = ("throughput (output tokens/s)", "time to first token (ms)", "inter-token latency (ms)")
    for ax, title in zip(axes, titles):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("load (concurrent requests)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    axes[1].set_yscale("log")
    fig.tight_layout()
    return fig


ENGINE_LINES = {"ours": "-", "vLLM": ":"}


def plot_side_by_side(table, axes=None, crossovers: dict | None = None):
    """Two panels against load for a ``compare.side_by_side`` table: throughput and inter-token
    latency (p50), colour by policy (off / on), solid line for our scheduler and dotted for vLLM.
    crossovers: ``compare.crossover_loads`` output, drawn as a vertical line per engine. Returns the figure."""
    import matplotlib.pyplot as plt

    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    else:
        fig = axes[0].figure
    for (engine, policy), g in table.groupby(["engine", "policy"], sort=False):
        colour, marker = STYLE.get(policy, (None, "o"))
        ls = ENGINE_LINES.get(engine, "--")
        g = g.sort_values("load")
        kw = dict(marker=marker, color=colour, ls=ls, label=f"{engine} {policy}",
                  mfc="none" if ls != "-" else colour)
        axes[0].plot(g.load, g.throughput_tok_s, **kw)
        axes[1].plot(g.load, g.itl_p50_s * 1e3, **kw)
    for engine, load in (crossovers or {}).items():
        if load is not None:
            for ax in axes:
                ax.axvline(load, color="tab:red", ls=ENGINE_LINES.get(engine, "--"), alpha=0.5, lw=1)
    for ax, title in zip(axes, ("throughput (output tokens/s)", "inter-token latency p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("load (concurrent requests)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_schedule(result, ax=None):
    """One run step by step: running requests, the policy's K, and KV blocks in use (of the pool);
    preemptions marked. Returns the figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(figsize=(10, 3.2))
    else:
        fig = ax.figure
    steps = [s.step for s in result.steps]
    ax.step(steps, [s.batch_size for s in result.steps], where="post", label="decoding requests")
    ax.step(steps, [s.k for s in result.steps], where="post", label="K (policy)")
    pre = [s.step for s in result.steps if s.num_preempted]
    if pre:
        ax.plot(pre, [0] * len(pre), "rx", label="preemption")
    ax.set_xlabel("scheduler step")
    ax.set_ylabel("requests / K")
    right = ax.twinx()
    right.plot(steps, [s.used_blocks / result.blocks.num_blocks for s in result.steps], color="tab:purple",
               alpha=0.5, label="KV blocks used (share)")
    right.set_ylim(0, 1.05)
    right.set_ylabel("KV blocks used", color="tab:purple")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig
