"""Suffix decoding against n-gram lookup and plain decoding, on a stream of requests (notebook 11).

Suffix decoding's global tree learns from every finished output, so its results depend on the
order requests arrive in: the stream is decoded in arrival order, one proposer object for the
whole stream, while n-gram lookup starts from nothing on every request. For each request the
three runs (plain, n-gram, suffix) are back to back, so slow drifts of the machine hit all three.

``run_stream`` measures at batch 1; ``run_stream_served`` serves the stream through the scheduler
at a given concurrency (requests arriving while others decode, the global tree shared by all).
"""
from __future__ import annotations

from ..engine import generate
from ..proposers import load_proposer
from ..serving.scheduler import serve

METHODS = ("plain", "ngram", "suffix")


def _proposers(model, methods, options: dict):
    """name -> proposer kept for the whole stream (None for plain)."""
    out = {}
    for m in methods:
        out[m] = None if m == "plain" else load_proposer(m, model, **options.get(m, {}))
    return out


def run_stream(model, prompts: list, labels: list | None = None, methods=METHODS, max_new_tokens: int = 64,
               options: dict | None = None, progress: bool = True):
    """Decode ``prompts`` (1-D LongTensors, in arrival order) greedily with each method, one
    request at a time; the suffix proposer keeps its global tree across the stream. Returns a
    DataFrame, one row per (request, method): label, tau, drafted, accepted, steps, new_tokens,
    wall_s, tokens_per_s. Every method's output is checked equal to plain decoding's."""
    import pandas as pd
    from tqdm.auto import tqdm

    options = options or {}
    labels = labels or [""] * len(prompts)
    proposers = _proposers(model, methods, options)
    rows = []
    for i, ids in enumerate(tqdm(prompts, desc="stream", disable=not progress)):
        ref = None
        for m in methods:
            out = generate(model, ids, proposers[m], max_new_tokens=max_new_tokens)
            if ref is None:
                ref = out.tokens.tolist()
            elif out.tokens.tolist() != ref:
                raise AssertionError(f"request {i}: {m} changed the greedy output")
            st = out.stats
            rows.append({"request": i, "label": labels[i], "method": m, "tau": st.tau, "drafted": st.drafted,
                         "accepted": st.accepted, "steps": st.steps, "new_tokens": st.new_tokens,
                         "wall_s": st.wall_time_s, "tokens_per_s": st.tokens_per_s})
    return pd.DataFrame(rows)


def summarize_stream(df, reference: str = "plain", by: str | None = None):
    """Per method (and per ``by`` column if given): mean τ, and speed against ``reference`` and
    τ/speed against n-gram, paired over requests (claims.Comparison with a bootstrap interval)."""
    import pandas as pd

    from .harness.claims import compare_paired

    groups = [((), df)] if by is None else list(df.groupby(by, sort=False))
    out = []
    for key, g in groups:
        wide = g.pivot_table(index="request", columns="method", values=["tau", "tokens_per_s"])
        for m in wide["tau"].columns:
            row = {"method": m, "tau": wide["tau"][m].mean(), "tokens_per_s": wide["tokens_per_s"][m].mean()}
            if by is not None:
                row[by] = key
            if m != reference:
                row["speedup"] = compare_paired(wide["tokens_per_s"][m], wide["tokens_per_s"][reference], unit="request")
            if m == "suffix" and "ngram" in wide["tau"].columns:
                row["tau_vs_ngram"] = compare_paired(wide["tau"][m], wide["tau"]["ngram"], tolerance=0.0, unit="request")
                row["speed_vs_ngram"] = compare_paired(wide["tokens_per_s"][m], wide["tokens_per_s"]["ngram"], unit="request")
            out.append(row)
    return pd.DataFrame(out)


def run_stream_served(model, prompts: list, methods=METHODS, max_new_tokens: int = 64, max_num_seqs: int = 4,
                      options: dict | None = None, **config):
    """Serve the whole stream at once through the scheduler, at most ``max_num_seqs`` requests in
    flight (each finished request's place goes to the next in arrival order). Returns one dict per
    method: tokens, wall_s, tokens_per_s, drafted, accepted, tau (tokens per decode step)."""
    options = options or {}
    out = []
    for m, proposer in _proposers(model, methods, options).items():
        result = serve(model, prompts, proposer, max_new_tokens=max_new_tokens, max_num_seqs=max_num_seqs, **config)
        metrics = result.metrics()
        tokens = sum(len(r.output) for r in result.requests)
        drafted = metrics.get("spec_decode_num_draft_tokens", 0)
        accepted = metrics.get("spec_decode_num_accepted_tokens", 0)
        steps = sum(r.row.stats.steps for r in result.requests)
        out.append({"method": m, "load": max_num_seqs, "tokens": tokens, "wall_s": result.wall_s,
                    "tokens_per_s": tokens / result.wall_s, "drafted": drafted, "accepted": accepted,
                    "tau": tokens / max(steps, 1), "outputs": [r.output for r in result.requests]})
    return out
