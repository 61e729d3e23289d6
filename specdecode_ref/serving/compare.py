"""Two engines under the same loads: the course's scheduler (``sweep.run_sweep``) beside vLLM
(``vllm_runner.run_vllm_sweep``), in one table, with the load where speculation stops paying.

    table = side_by_side(ours_df, vllm_df)          # one row per (engine, load, policy)
    crossover_loads(table)                          # {"ours": 4, "vLLM": None}: None = never within the loads tried
    compare_outputs(ours_outputs, vllm_outputs)     # how many requests are identical, token for token

Both engines see the same prompts, all submitted at time 0, with at most ``load`` requests in
flight; the rows share column names (``metrics.serving_metrics``), so a column means the same
thing for both.
"""
from __future__ import annotations

COLUMNS = ["throughput_tok_s", "ttft_p50_s", "itl_p50_s", "itl_p99_s", "tpot_mean_s", "acceptance_rate", "tau",
           "vllm_mean_acceptance_length", "spec_decode_num_drafts", "spec_decode_num_draft_tokens",
           "spec_decode_num_accepted_tokens"]
HIGHER_IS_BETTER = {"throughput_tok_s", "tokens_per_step"}


def side_by_side(ours, theirs, policies=("off", "on"), ours_name: str = "ours", theirs_name: str = "vLLM"):
    """One table of both engines' sweeps: the median over repeats per (engine, load, policy) of the
    shared columns, and ``on_vs_off``: throughput divided by the same engine's "off" throughput at
    that load (above 1: speculation pays). ours / theirs: DataFrames of run_sweep / run_vllm_sweep
    (any "engine" column they carry is replaced by the names given here)."""
    import pandas as pd

    parts = []
    for name, df in ((ours_name, ours), (theirs_name, theirs)):
        missing = {"load", "policy", "throughput_tok_s"} - set(df.columns)
        if missing:
            raise ValueError(f"the {name} rows lack the columns {sorted(missing)}")
        cols = [c for c in COLUMNS if c in df.columns]
        med = df[df.policy.isin(policies)].groupby(["load", "policy"], sort=True)[cols].median().reset_index()
        med.insert(0, "engine", name)
        parts.append(med)
    table = pd.concat(parts, ignore_index=True)
    off = table[table.policy == "off"].set_index(["engine", "load"]).throughput_tok_s
    keys = list(zip(table.engine, table.load))
    table["on_vs_off"] = [row / off[key] if key in off.index else float("nan")
                          for row, key in zip(table.throughput_tok_s, keys)]
    order = {p: i for i, p in enumerate(policies)}
    table = table.sort_values(["engine", "load", "policy"], key=lambda c: c.map(order) if c.name == "policy" else c)
    return table.reset_index(drop=True)


def crossover_loads(table, metric: str = "throughput_tok_s") -> dict:
    """Per engine, the smallest load at which speculation "on" no longer beats "off" on ``metric``
    (throughput: higher is better; a latency in seconds: lower is better); None when "on" wins at
    every load measured (the crossover, if any, lies beyond the largest load). Loads where either
    policy is missing are skipped."""
    if metric not in table.columns:
        raise ValueError(f"no column {metric!r} in the table")
    higher = metric in HIGHER_IS_BETTER
    found = {}
    for engine, g in table.groupby("engine", sort=False):
        values = g.pivot_table(index="load", columns="policy", values=metric, aggfunc="median")
        found[engine] = None
        if not {"on", "off"} <= set(values.columns):
            continue
        for load, row in values.sort_index().iterrows():
            on, off = row["on"], row["off"]
            if on != on or off != off:  # NaN: not measured
                continue
            if not (on > off if higher else on < off):
                found[engine] = int(load)
                break
    return found


def compare_outputs(ours, theirs) -> dict:
    """Token-for-token comparison of two engines' outputs for the same prompts (lists of token id
    lists, or 1-D tensors): how many requests are identical and, for the others, the position of
    the first differing token (a near-tie broken differently makes the texts part from there)."""
    ours = [list(map(int, o.tolist() if hasattr(o, "tolist") else o)) for o in ours]
    theirs = [list(map(int, t.tolist() if hasattr(t, "tolist") else t)) for t in theirs]
    if len(ours) != len(theirs):
        raise ValueError(f"{len(ours)} outputs against {len(theirs)}: the engines must serve the same prompts")
    first = []
    for a, b in zip(ours, theirs):
        if a == b:
            first.append(None)
            continue
        n = min(len(a), len(b))
        first.append(next((i for i in range(n) if a[i] != b[i]), n))
    return {"requests": len(ours), "identical": sum(f is None for f in first), "first_difference": first}
