"""Timing harness: every decoding method on the same prompts, per-category tables and plots.

Why it is built this way:

* Every method decodes the same chat prompts in the same run, and results are reported as ratios
  to plain decoding: this machine is shared and noisy, absolute tokens/s drift between runs.
* Each method is warmed up once before its first timed run (first calls allocate, pick kernels,
  fill caches), then each prompt is timed ``repeats`` times and the median is kept. Methods are
  interleaved per prompt and repeat, so slow drift of the machine hits all methods alike.
* On CUDA the clock is read only after ``torch.cuda.synchronize`` (kernels run asynchronously).
* Hugging Face's own ``generate`` (plain, prompt lookup, assisted) runs on the same model and
  prompts, so the course's engine is compared with production code, not only with itself.
* Greedy speculative decoding must reproduce plain greedy decoding token for token; each row
  records whether it did (in bf16, near-tied logits can flip a token: that is measured, not hidden).
* Results are per workload category: prompt lookup wins on input-grounded tasks and not elsewhere.

Also the cost curve T(n): the time of one target forward scoring n new tokens after a cached
context. Decoding is memory-bound, so T(n) grows slowly with n: verifying k drafted tokens costs
about one plain step. Notebook 00 plots it; analysis.py turns it into a predicted speedup.

Run ``python -m specdecode_ref.measure.harness.bench --help``. From a notebook::

    from specdecode_ref import load_model
    from specdecode_ref.measure.harness import bench
    from specdecode_ref.measure.harness.workloads import load_workloads
    model, tok = load_model(dtype="fp32")
    df = bench.run_benchmark(model, tok, ["plain", "ngram"], load_workloads(per_category=2), 32)
    summary = bench.summarize(df); print(bench.format_tables(summary)); bench.plot_speedups(summary)

No timing figure here is ever a pass/fail threshold.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from functools import reduce
from pathlib import Path
from typing import Callable

import torch

from ... import decoder, kv
from ...engine import autoregressive_generate, eos_token_ids, generate
from ...metrics import SpecStats
from ...models import chat_ids
from ...proposers import StandAside, available_proposers, load_proposer
from . import protocol, timing
from .timing import measure_cost_curve  # re-exported: bench.measure_cost_curve
from .compare import first_mismatch  # re-exported: bench.first_mismatch
from .workloads import load_workloads

DEFAULT_K = 5  # prompt lookup's K when none is given; the default run pairs it with ngram@5
DEFAULT_METHODS = ("plain", f"ngram@{DEFAULT_K}", "hf", "hf-prompt-lookup")
REFERENCE = "plain"  # the baseline for speedups and for the token-identity check
OVERALL = "overall"  # category label of the all-prompts aggregate rows

# A method: fn(model, input_ids, max_new_tokens, k, **options) -> (token ids, seconds, SpecStats | None)
MethodFn = Callable[..., tuple]
METHODS: dict = {}


def register_method(name: str, fn: MethodFn | None = None):
    """Add a timing method under ``name`` (usable as a decorator).

    ``fn(model, input_ids, max_new_tokens, k, **options)`` decodes one 1-D prompt greedily and
    returns ``(new token ids as a list, seconds, SpecStats or None)``; it times only the decoding,
    with :func:`timed`. ``k`` may be None (the method's own default). ``options`` carries extras such
    as ``assistant_model`` or a prebuilt ``proposer``; ignore the ones you do not use.
    """
    def deco(f):
        METHODS[name] = f
        return f

    return deco(fn) if fn is not None else deco


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device, call: Callable):
    """Run ``call()`` and return ``(its result, seconds)``, synchronising CUDA around the clock."""
    device = torch.device(device)
    _sync(device)
    t0 = time.perf_counter()
    out = call()
    _sync(device)
    return out, time.perf_counter() - t0


@register_method("plain")
def run_plain(model, input_ids, max_new_tokens, k=None, **_):
    """The course engine's plain greedy decoding: one target forward per token (the baseline)."""
    res, dt = timed(_device(model), lambda: autoregressive_generate(model, input_ids, max_new_tokens=max_new_tokens))
    return res.tokens.tolist(), dt, res.stats


def run_spec(model, input_ids, max_new_tokens, k=None, proposer=None, proposer_name="ngram",
             proposer_kwargs=None, **_):
    """The course engine's speculative decoding with a proposer from ``load_proposer``.

    Pass a prebuilt ``proposer`` to reuse it across prompts (``prepare_method`` does): building a
    model-based drafter loads weights, which must stay outside the timed region.
    """
    if proposer is None:
        proposer = load_proposer(proposer_name, model, k=k, **(proposer_kwargs or {}))
    res, dt = timed(_device(model), lambda: generate(model, input_ids, proposer=proposer,
                                                      max_new_tokens=max_new_tokens))
    return res.tokens.tolist(), dt, res.stats


def hf_generate(model, input_ids, max_new_tokens, **generate_kwargs):
    """Hugging Face ``model.generate``, greedy, on a 1-D prompt; returns (new ids, seconds, None).

    temperature/top_p/top_k are set to None so a model's sampling defaults cannot switch greedy
    decoding off or trigger warnings; pad = EOS because the model defines no pad token.
    """
    device = _device(model)
    x = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1).to(device)
    eos = eos_token_ids(model)
    kwargs = dict(attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                  temperature=None, top_p=None, top_k=None)
    if eos:
        kwargs["pad_token_id"] = eos[0]
    kwargs.update(generate_kwargs)
    with torch.inference_mode():
        out, dt = timed(device, lambda: model.generate(x, **kwargs))
    return out[0, x.shape[1]:].tolist(), dt, None


@register_method("hf")
def run_hf(model, input_ids, max_new_tokens, k=None, **_):
    """Hugging Face greedy ``generate``: the production baseline on the same model."""
    return hf_generate(model, input_ids, max_new_tokens)


@register_method("hf-prompt-lookup")
def run_hf_prompt_lookup(model, input_ids, max_new_tokens, k=None, **_):
    """Hugging Face prompt lookup decoding (``prompt_lookup_num_tokens=k``), the n-gram counterpart."""
    return hf_generate(model, input_ids, max_new_tokens, prompt_lookup_num_tokens=DEFAULT_K if k is None else k)


@register_method("hf-assisted")
def run_hf_assisted(model, input_ids, max_new_tokens, k=None, assistant_model=None, **_):
    """Hugging Face assisted generation with a separate draft model (``assistant_model=``).

    With ``k`` the assistant drafts at most k tokens per step (constant schedule), so it can be
    compared with the engine's draft-model proposer at the same K; like every HF schedule it still
    stops a draft early once the draft's top probability falls below
    ``assistant_confidence_threshold``. Without ``k`` the assistant's generation config decides; a
    "heuristic" schedule there would carry K over between calls, making repeats depend on each other.
    """
    if assistant_model is None:
        raise ValueError("method 'hf-assisted' needs a draft model: pass assistant_model=... "
                         "(CLI: --assistant-model NAME_OR_PATH)")
    cfg = assistant_model.generation_config
    saved = (cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule)
    if k is not None:
        cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = int(k), "constant"
    try:
        return hf_generate(model, input_ids, max_new_tokens, assistant_model=assistant_model)
    finally:
        cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = saved


def parse_method(spec: str) -> tuple:
    """``"ngram"`` -> ("ngram", None); ``"ngram@3"`` -> ("ngram", 3): a per-method K, so one run can
    compare several K on the same prompts."""
    name, _, k = spec.partition("@")
    name = name.strip()
    if not k:
        return name, None
    try:
        kk = int(k)
    except ValueError:
        raise ValueError(f"bad method {spec!r}: the part after '@' must be an integer K") from None
    if kk < 1:
        raise ValueError(f"bad method {spec!r}: K must be >= 1")
    return name, kk


def available_methods() -> list:
    """Registered timing methods plus every proposer name (run through the engine's spec path)."""
    return sorted(set(METHODS) | set(available_proposers()))


def prepare_method(spec: str, model, k: int | None = None, **options) -> Callable:
    """Return ``runner(input_ids, max_new_tokens) -> (ids, seconds, stats)`` for one method.

    spec: a name from :data:`METHODS`, or any ``load_proposer`` name (the method is then the
    engine's speculative decoding with that proposer, built once here), optionally ``name@K``.
    k: default K when the spec does not give one (None = the method's own default).
    options: passed to the method (e.g. ``assistant_model``; ``proposer_kwargs`` for proposers).
    """
    name, spec_k = parse_method(spec)
    k = spec_k if spec_k is not None else k
    if name in METHODS:
        fn = METHODS[name]
    else:
        # Any proposer name works; load_proposer gives the clear error for planned ones.
        if name not in available_proposers():
            try:
                load_proposer(name)
            except ValueError:
                raise ValueError(f"unknown method {name!r}; available: {available_methods()}") from None
        proposer_kwargs = options.pop("proposer_kwargs", None) or {}
        proposer = load_proposer(name, model, k=k, **proposer_kwargs)
        options = dict(options, proposer=proposer)
        k = 0 if isinstance(proposer, StandAside) else proposer.k  # 0: plain decoding predicted faster here

        def fn(model, input_ids, max_new_tokens, k=None, **opts):
            if getattr(opts["proposer"], "learns_across_requests", False):
                # Suffix decoding remembers earlier outputs: a repeat of a prompt would draft its own
                # previous answer. Every timed call starts with an empty history instead.
                opts = dict(opts, proposer=load_proposer(name, model, k=k, **proposer_kwargs))
            return run_spec(model, input_ids, max_new_tokens, k=k, **opts)

    def runner(input_ids, max_new_tokens):
        return fn(model, input_ids, max_new_tokens, k, **options)

    runner.method, runner.k = spec, k
    return runner


def _effective_k(spec: str, runner) -> int | None:
    name, _ = parse_method(spec)
    if name in ("plain", "hf"):
        return None
    if name == "hf-prompt-lookup" and runner.k is None:
        return DEFAULT_K
    return runner.k


def run_benchmark(model, tokenizer, methods=DEFAULT_METHODS, workloads: dict | None = None,
                  max_new_tokens: int = 128, repeats: int = 1, k: int | None = None, warmup: int = 1,
                  progress: bool = True, reference: str = REFERENCE, assistant_model=None,
                  method_options: dict | None = None):
    """Time every method on every prompt; return a pandas DataFrame with one row per (prompt, method).

    methods: names (see :func:`available_methods`; ``name@K`` sets K for one entry).
    workloads: ``{category: [{"id", "messages"}, ...]}`` from ``load_workloads`` (None = all 56).
    repeats: timed rounds per prompt, the methods in reverse order on every other round; with two
    or more, a method whose rounds disagree is re-timed and the run with the median time is kept
    (``measure.harness.protocol``). warmup: short untimed
    generations per method before its first timed run. k: drafted tokens per step (None = each
    method's default; a dict ``{method: k}`` sets it per method). reference: the method whose tokens the ``identical`` column compares with.
    method_options: ``{method: {option: value}}`` passed to that method (e.g. proposer_kwargs).

    Columns: category, prompt_id, method, k, prompt_tokens, tokens, seconds, tokens_per_s, tau,
    acceptance_rate, drafted, accepted, steps, emitted, identical, first_mismatch, times_s,
    token_ids, stats (the SpecStats object, None for HF methods; not saved to files).
    """
    import pandas as pd
    from tqdm.auto import tqdm

    methods = [methods] if isinstance(methods, str) else list(methods)
    if not methods:
        raise ValueError(f"no methods given; choose from {available_methods()}")
    if len(set(methods)) != len(methods):
        raise ValueError(f"methods repeat: {methods}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an int >= 1, got {repeats!r}")
    if not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
    workloads = load_workloads() if workloads is None else workloads
    prompts = [(cat, item) for cat, items in workloads.items() for item in items]
    if not prompts:
        raise ValueError("the workloads hold no prompts")

    device = _device(model)
    method_options = method_options or {}
    runners = {}
    for m in methods:
        opts = dict(method_options.get(m, {}))
        if assistant_model is not None:
            opts.setdefault("assistant_model", assistant_model)
        runners[m] = prepare_method(m, model, k=k.get(m) if isinstance(k, dict) else k, **opts)
    warmed = set()
    rows = []
    bar = tqdm(total=len(prompts) * len(methods), desc="bench", unit="run", disable=not progress,
               dynamic_ncols=True)
    try:
        for cat, item in prompts:
            ids = chat_ids(tokenizer, item["messages"], device=device)
            runs = {m: [] for m in methods}  # (tokens, seconds, stats) per round

            def run(m):
                bar.set_postfix_str(f"{m} | {item['id']}", refresh=False)
                if m not in warmed:
                    for _ in range(warmup):
                        runners[m](ids, min(8, max_new_tokens))
                    warmed.add(m)
                toks, secs, stats = runners[m](ids, max_new_tokens)
                runs[m].append((toks, float(secs), stats))

            for r in range(repeats):  # measure/harness/protocol.py: interleaved rounds, alternating order
                for m in protocol.order_of(methods, r):
                    run(m)
            for m in methods:  # a method whose rounds disagree is re-timed (protocol rule 3)
                while repeats >= 2 and protocol.wants_another_round([t for _, t, _ in runs[m]]):
                    run(m)
                bar.update(1)
            while repeats >= 2:  # ... and so is one whose kept run lies far above the prompt's other methods
                kept = {m: runs[m][protocol.kept_index([t for _, t, _ in runs[m]])][1] for m in methods}
                again = [m for m in protocol.outliers(kept) if len(runs[m]) < protocol.MAX_ROUNDS]
                if not again:
                    break
                for m in again:
                    run(m)
            ref_tokens = runs[reference][0][0] if reference in runs else None
            for m in methods:
                times_m = [t for _, t, _ in runs[m]]
                toks, secs, stats = runs[m][protocol.kept_index(times_m)]
                mismatch = None if ref_tokens is None else first_mismatch(toks, ref_tokens)
                rows.append({
                    "category": cat, "prompt_id": item["id"], "method": m, "k": _effective_k(m, runners[m]),
                    "prompt_tokens": int(ids.numel()), "tokens": len(toks), "seconds": secs,
                    "tokens_per_s": len(toks) / secs if secs > 0 else float("nan"),
                    "prefill_s": float(stats.prefill_time_s) if stats is not None else float("nan"),
                    "tau": stats.mean_accepted_length if stats is not None else None,
                    "acceptance_rate": stats.acceptance_rate if stats is not None and stats.drafted else None,
                    "drafted": stats.drafted if stats is not None else None,
                    "accepted": stats.accepted if stats is not None else None,
                    "steps": stats.steps if stats is not None else None,
                    "emitted": stats.emitted if stats is not None else None,
                    "identical": None if ref_tokens is None else toks == ref_tokens,
                    "first_mismatch": mismatch,
                    "times_s": times_m, "token_ids": list(toks), "stats": stats,
                })
    finally:
        bar.close()
    df = pd.DataFrame(rows)
    for col in ("k", "drafted", "accepted", "steps", "emitted", "first_mismatch"):
        df[col] = df[col].astype("Int64")  # whole numbers with missing values (HF methods, no K)
    return df


def _row_stats(row) -> SpecStats | None:
    """The row's SpecStats (rebuilt from its counters when read back from a file)."""
    stats = row.get("stats") if hasattr(row, "get") else None
    if isinstance(stats, SpecStats):
        return stats
    import pandas as pd

    steps = row.get("steps")
    if steps is None or pd.isna(steps):  # an HF method: no counters
        return None
    return SpecStats(drafted=int(row["drafted"]), accepted=int(row["accepted"]), steps=int(steps),
                     emitted=int(row["emitted"]), new_tokens=int(row["tokens"]))


def _aggregate(group) -> dict:
    tokens = int(group["tokens"].sum())
    seconds = float(group["seconds"].sum())
    stats = [s for s in (_row_stats(r) for _, r in group.iterrows()) if s is not None]
    merged = reduce(SpecStats.merge, stats) if stats and len(stats) == len(group) else None
    ident = group["identical"].dropna()
    return {
        "prompts": int(len(group)), "tokens": tokens, "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else float("nan"),
        "tau": merged.mean_accepted_length if merged is not None else float("nan"),
        "acceptance_rate": merged.acceptance_rate if merged is not None and merged.drafted else float("nan"),
        "identical": float(ident.astype(bool).mean()) if len(ident) else float("nan"),
    }


def summarize(df, reference: str = REFERENCE, intervals: bool = True, n_boot: int = 2000, seed: int = 0):
    """Aggregate per (category, method) and over all prompts (category ``"overall"``).

    tokens_per_s = total tokens / total seconds (long outputs weigh more, as in a server);
    speedup = tokens_per_s / the reference's in the same category; tau and acceptance_rate from the
    merged SpecStats (HF methods: NaN); identical = fraction of prompts whose output equals the
    reference's token for token. With ``intervals`` (and every method on every prompt): 95 %
    paired bootstrap intervals speedup_lo/hi and tau_lo/hi, and time per output token (vLLM's TPOT:
    prefill left out) at the median, 90th and 99th percentile over prompts (``measure.harness.intervals``).
    """
    import pandas as pd

    if df.empty:
        raise ValueError("no benchmark rows to summarize")
    methods = list(dict.fromkeys(df["method"]))
    rows = []
    groups = [(c, df[df["category"] == c]) for c in dict.fromkeys(df["category"])] + [(OVERALL, df)]
    for cat, part in groups:
        block = {m: _aggregate(part[part["method"] == m]) for m in methods if (part["method"] == m).any()}
        base = block.get(reference, {}).get("tokens_per_s", float("nan"))
        for m, agg in block.items():
            rows.append({"category": cat, "method": m, **agg, "speedup": agg["tokens_per_s"] / base})
    cols = ["category", "method", "prompts", "tokens", "seconds", "tokens_per_s", "speedup", "tau",
            "acceptance_rate", "identical"]
    out = pd.DataFrame(rows)[cols]
    if intervals and reference in set(df["method"]):
        from .intervals import bootstrap_summary

        extra = ["speedup_lo", "speedup_hi", "tau_lo", "tau_hi", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms"]
        boot = bootstrap_summary(df, reference=reference, n_boot=n_boot, seed=seed)
        out = out.merge(boot[["category", "method"] + extra], on=["category", "method"], how="left")
    return out


def _fmt(x, spec):
    return "-" if x is None or x != x else format(x, spec)


def format_tables(summary) -> str:
    """One aligned plain-text table per category, then the overall table."""
    formats = {"tokens_per_s": ".1f", "speedup": ".2f", "tau": ".2f", "acceptance_rate": ".2f",
               "identical": ".2f", "seconds": ".2f"}
    headers = {"tokens_per_s": "tok/s", "speedup": "speedup", "tau": "tau", "acceptance_rate": "accept",
               "identical": "identical", "seconds": "seconds", "prompts": "prompts", "tokens": "tokens",
               "method": "method"}
    cols = ["method", "prompts", "tokens", "seconds", "tokens_per_s", "speedup", "tau", "acceptance_rate",
            "identical"]
    cats = [c for c in dict.fromkeys(summary["category"]) if c != OVERALL]
    cats += [OVERALL] if (summary["category"] == OVERALL).any() else []
    has_ci = {"speedup_lo", "speedup_hi", "tpot_p50_ms"} <= set(summary.columns)
    if has_ci:  # the interval beside the speedup, and the per-token latency percentiles
        cols = cols[:cols.index("speedup") + 1] + ["speedup_ci"] + cols[cols.index("speedup") + 1:] + \
            ["tpot_p50_ms", "tpot_p99_ms"]
        headers = {**headers, "speedup_ci": "95% CI", "tpot_p50_ms": "ms/tok p50", "tpot_p99_ms": "p99"}
        formats = {**formats, "tpot_p50_ms": ".1f", "tpot_p99_ms": ".1f"}
    out = []
    for cat in cats:
        part = summary[summary["category"] == cat]
        cells = [[headers[c] for c in cols]]
        for _, r in part.iterrows():
            ci = "-" if not has_ci or r["speedup_lo"] != r["speedup_lo"] or r["method"] == REFERENCE else \
                f"[{r['speedup_lo']:.2f}, {r['speedup_hi']:.2f}]"
            cells.append([ci if c == "speedup_ci" else _fmt(r[c], formats[c]) if c in formats else str(r[c])
                          for c in cols])
        widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
        lines = ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths)))
                 for row in cells]
        title = f"== {cat} ==" if cat != OVERALL else "== overall (all prompts) =="
        out.append("\n".join([title, lines[0], "-" * len(lines[0])] + lines[1:]))
    return "\n\n".join(out)


def pyplot():
    """matplotlib.pyplot, on the headless Agg backend outside Jupyter."""
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules and not os.environ.get("MPLBACKEND"):
        matplotlib.use("Agg")  # headless runs; inside Jupyter the inline backend is already chosen
    import matplotlib.pyplot as plt

    return plt


def speedup_matrix(summary, reference: str = REFERENCE):
    """Speedups as a table: one row per method (the reference left out), one column per category
    (``overall`` last), NaN where a method did not run on a category."""
    import pandas as pd

    methods = [m for m in dict.fromkeys(summary["method"]) if m != reference]
    cats = [c for c in dict.fromkeys(summary["category"]) if c != OVERALL]
    cats += [OVERALL] if (summary["category"] == OVERALL).any() else []
    table = summary.pivot_table(index="method", columns="category", values="speedup", aggfunc="first")
    return table.reindex(index=methods, columns=cats).astype(float) if methods else pd.DataFrame(columns=cats)


def plot_speedups(summary, path=None, reference: str = REFERENCE, ax=None):
    """A heat map of the speedup over ``reference``: methods down, categories across (``overall``
    last, set apart by a line), each cell annotated with its value.

    Colours diverge at 1.0 (red: slower than the reference, blue: faster), so a glance shows where
    a method pays. The figure stays readable for many methods and categories (about 1,000 px wide
    for 8 categories at dpi 120). Returns the matplotlib Figure; saves a PNG to ``path``.
    """
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    plt = pyplot()
    table = speedup_matrix(summary, reference)
    methods, cats = list(table.index), list(table.columns)
    if ax is None:
        width = min(11.5, 2.6 + 0.85 * max(1, len(cats)))
        height = min(9.0, 1.4 + 0.45 * max(1, len(methods)))
        fig, ax = plt.subplots(figsize=(width, height))
    else:
        fig = ax.figure
    values = table.to_numpy(dtype=float) if len(methods) else np.full((1, len(cats)), np.nan)
    finite = values[np.isfinite(values)]
    lo = min(0.9, float(finite.min()) if finite.size else 0.9)
    hi = max(1.1, float(finite.max()) if finite.size else 1.1)
    norm = TwoSlopeNorm(vmin=lo, vcenter=1.0, vmax=hi)
    im = ax.imshow(np.ma.masked_invalid(values), cmap="RdBu", norm=norm, aspect="auto")
    bounds = None
    if {"speedup_lo", "speedup_hi"} <= set(summary.columns):
        bounds = {(r["method"], r["category"]): (r["speedup_lo"], r["speedup_hi"]) for _, r in summary.iterrows()}
    for i in range(values.shape[0]):
        for j in range(values.shape[1]):
            v = values[i, j]
            if np.isfinite(v):
                dark = abs(norm(v) - 0.5) > 0.3
                lo_hi = bounds.get((methods[i], cats[j])) if bounds else None
                if lo_hi is None or not np.isfinite(lo_hi[0]):
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=9,
                            color="white" if dark else "black")
                    continue
                # the value, its 95 % interval under it; "≈" and a dashed frame when it contains 1
                level = lo_hi[0] <= 1.0 <= lo_hi[1]
                ax.text(j, i - 0.12, ("≈" if level else "") + f"{v:.2f}", ha="center", va="center", fontsize=9,
                        color="white" if dark else "black", fontweight="normal" if level else "bold")
                ax.text(j, i + 0.22, f"{lo_hi[0]:.2f}–{lo_hi[1]:.2f}", ha="center", va="center", fontsize=6.5,
                        color="white" if dark else "black")
                if level:
                    ax.add_patch(plt.Rectangle((j - 0.46, i - 0.46), 0.92, 0.92, fill=False, ls="--", lw=0.8,
                                               ec="0.35"))
    ax.set_xticks(range(len(cats)))
    ax.set_xticklabels(cats, rotation=30, ha="right", fontsize=9)
    ax.set_yticks(range(len(methods)))
    ax.set_yticklabels(methods, fontsize=9)
    if OVERALL in cats and len(cats) > 1:
        ax.axvline(len(cats) - 1.5, color="black", lw=1.5)
    ax.set_title(f"Speedup over {reference} (tokens/s ratio; 1.00 = as fast)"
                 + ("\nunder each value its 95 % paired bootstrap interval; ≈ and a dashed frame: it contains 1"
                    if bounds else ""), fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.02, label="speedup")
    if path is not None:
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    return fig


def format_cost_curve(curve: dict) -> str:
    """A small text table of T(n) in ms and T(n)/T(first n)."""
    lines = [f"cost curve: {curve.get('context_len', '?')}-token context, {curve.get('dtype', '')} "
             f"on {curve.get('device', '')}, median of {curve.get('repeats', '?')}",
             f"{'n':>3}  {'T(n) ms':>8}  {'T(n)/T(' + str(curve['ns'][0]) + ')':>9}"]
    for n, t, rel in zip(curve["ns"], curve["times_s"], curve["relative"]):
        lines.append(f"{n:>3}  {t * 1e3:>8.1f}  {rel:>9.2f}")
    return "\n".join(lines)


def plot_cost_curve(curve: dict, ax=None, path=None):
    """Plot T(n) in ms (left axis) and T(n)/T(1) (right axis, same line); returns the Figure."""
    plt = pyplot()
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 4))
    else:
        fig = ax.figure
    ns, ms = curve["ns"], [t * 1e3 for t in curve["times_s"]]
    t1 = ms[0]
    ax.plot(ns, ms, "o-", label="measured T(n)")
    ax.axhline(t1, color="grey", lw=1, ls=":", label=f"T({ns[0]}) = {t1:.1f} ms")
    ax.set_xlabel("new tokens scored in one forward (n)")
    ax.set_ylabel("forward time (ms)")
    ax.set_ylim(0, max(ms) * 1.15)
    ax.xaxis.get_major_locator().set_params(integer=True)
    sec = ax.secondary_yaxis("right", functions=(lambda y: y / t1, lambda r: r * t1))
    sec.set_ylabel(f"T(n) / T({ns[0]})")
    ax.set_title(f"Cost of one target forward after a {curve.get('context_len', '?')}-token context "
                 f"({curve.get('dtype', '')}, {curve.get('device', '')})", fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def save_results(df, summary, out_dir, curve: dict | None = None, config: dict | None = None) -> dict:
    """Write results.json (config, per-prompt rows, summary, cost curve), per_prompt.csv,
    summary.csv and speedups.png (+ cost_curve.png) into ``out_dir``; return the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = df.drop(columns=["stats"], errors="ignore")
    paths = {"json": out / "results.json", "per_prompt_csv": out / "per_prompt.csv",
             "summary_csv": out / "summary.csv", "speedups_png": out / "speedups.png"}
    payload = {"config": config or {}, "per_prompt": json.loads(rows.to_json(orient="records")),
               "summary": json.loads(summary.to_json(orient="records")), "cost_curve": curve}
    paths["json"].write_text(json.dumps(payload, indent=1))
    rows.drop(columns=["token_ids"], errors="ignore").to_csv(paths["per_prompt_csv"], index=False)
    summary.to_csv(paths["summary_csv"], index=False)
    plt = pyplot()
    plt.close(plot_speedups(summary, paths["speedups_png"]))
    if curve is not None:
        paths["cost_curve_png"] = out / "cost_curve.png"
        plt.close(plot_cost_curve(curve, path=paths["cost_curve_png"]))
    return {k: str(v) for k, v in paths.items()}


def _csv(text: str) -> list:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m specdecode_ref.measure.harness.bench",
        description="Time decoding methods on the same chat prompts; per-category tables, JSON/CSV and plots.")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="comma-separated; registered methods or proposer names, NAME@K sets K for one "
                        f"(default: %(default)s; available: {', '.join(available_methods())})")
    p.add_argument("--prompt-set", choices=["benchmark", "heldout"], default="benchmark",
                   help="the benchmark prompts, or the held-out prompts nothing in the package was tuned on "
                        "(report those separately; default: %(default)s)")
    p.add_argument("--categories", default=None, help="comma-separated workload categories (default: all)")
    p.add_argument("--per-category", type=int, default=8, help="prompts per category (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="default: %(default)s")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per prompt, median kept (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=1,
                   help="short untimed generations per method before its first timed run (default: %(default)s)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None,
                   help="model dtype (default: the model default, bf16 on CPUs with native bf16)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: CUDA when present)")
    p.add_argument("--backend", choices=["auto", "fast", "eager"], default=None,
                   help="the target's kernels (specdecode_ref.backend; default: auto, the fast backend where it runs)")
    p.add_argument("--k", type=int, default=None,
                   help="drafted tokens per step for every speculative method (default: each method's own: "
                        f"prompt lookup {DEFAULT_K}, proposers their load_proposer default, hf-assisted HF's "
                        "schedule); NAME@K in --methods sets it for one method")
    p.add_argument("--model", default=None, help="HF id or local path of the target (default: the embedded model)")
    p.add_argument("--assistant-model", default=None, help="draft model (HF id or path) for method hf-assisted; default for the "
                   "embedded target: the shipped distilled draft")
    p.add_argument("--out", default="bench_out", help="output directory (default: %(default)s/)")
    p.add_argument("--cost-curve", action=argparse.BooleanOptionalAction, default=True,
                   help="also measure the cost curve T(n) (default: on)")
    p.add_argument("--max-n", type=int, default=16, help="largest n of the cost curve (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def busy_machine_warning() -> str | None:
    """A warning line when other processes already load the CPUs, else None (see
    :func:`specdecode_ref.measure.harness.timing.check_quiet`, which samples CPU use for a second)."""
    return timing.busy_machine_warning()


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from ...models import load_model

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    methods = _csv(args.methods)
    try:
        for m in methods:
            name, _ = parse_method(m)
            if name not in available_methods():
                try:
                    load_proposer(name)  # a planned proposer: "not in this version yet"
                except ValueError:
                    raise ValueError(f"unknown method {name!r}; available: {available_methods()}") from None
        if args.prompt_set == "heldout":
            from .workloads import load_heldout

            workloads = load_heldout(args.categories, per_category=args.per_category)
        else:
            workloads = load_workloads(args.categories, per_category=args.per_category)
    except (ValueError, NotImplementedError) as e:
        raise SystemExit(f"error: {e}") from None
    model, tokenizer = load_model(args.model, device=args.device, dtype=args.dtype, backend=args.backend)
    assistant = None
    if args.assistant_model is not None:
        assistant, _ = load_model(args.assistant_model, device=_device(model), dtype=model.dtype)
    elif any(parse_method(m)[0] == "hf-assisted" for m in methods):
        from ...proposers.draft_model import load_draft_model
        from ...proposers.shipped import is_embedded_target

        if not is_embedded_target(model):
            raise SystemExit("method hf-assisted needs --assistant-model NAME_OR_PATH")
        assistant = load_draft_model(model)  # the shipped distilled draft: the same one as method "draft"
    config = {
        "methods": methods, "prompt_set": args.prompt_set, "categories": list(workloads), "per_category": args.per_category,
        "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "warmup": args.warmup, "k": args.k,
        "model": args.model or "smollm2-135m-instruct", "assistant_model": args.assistant_model,
        "dtype": str(model.dtype).replace("torch.", ""), "device": str(_device(model)),
        "backend": __import__("specdecode_ref.backend", fromlist=["backend_of"]).backend_of(model),
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": __import__("transformers").__version__, "python": platform.python_version(),
        "machine": platform.machine(), "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    print(f"target {config['model']} ({config['dtype']}, {config['device']}, {config['backend']} backend, "
          f"{config['threads']} threads); "
          f"methods {', '.join(methods)}; {sum(map(len, workloads.values()))} prompts; "
          f"max_new_tokens {args.max_new_tokens}; repeats {args.repeats}", flush=True)
    if _device(model).type == "cpu" and (warning := busy_machine_warning()):
        print(warning, file=sys.stderr, flush=True)
    df = run_benchmark(model, tokenizer, methods, workloads, max_new_tokens=args.max_new_tokens,
                       repeats=args.repeats, k=args.k, warmup=args.warmup, progress=not args.no_progress,
                       assistant_model=assistant)
    summary = summarize(df)
    print()
    print(format_tables(summary))
    curve = None
    if args.cost_curve:
        curve = measure_cost_curve(model, ns=range(1, args.max_n + 1))
        print()
        print(format_cost_curve(curve))
    paths = save_results(df, summary, args.out, curve=curve, config=config)
    print()
    print("saved: " + ", ".join(paths.values()))
    return 0



@torch.inference_mode()
def measure_draft_cost(proposer, context_len: int = 256, repeats: int = 15, warmup: int = 3, seed: int = 0) -> float:
    """Median seconds of one drafting forward of a ``DraftModelProposer``: one new token after a
    cached ``context_len``-token context, through the draft's layers and its vocabulary projection
    (full, or the reduced draft vocabulary when the proposer has one), exactly the call ``propose``
    makes k times per step. Divide by ``measure_cost_curve``'s T(1) at the same context length for
    the c of the speedup formula. The proposer's cache is replaced; call ``begin`` before reusing it.
    """
    if not isinstance(repeats, int) or repeats < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ValueError("repeats must be an int >= 1 and warmup an int >= 0")
    model = proposer.model
    device = _device(model)
    vocab = model.get_input_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(seed)
    context = torch.randint(0, vocab, (context_len,), generator=gen).tolist()
    new = torch.randint(0, vocab, (1,), generator=gen).tolist()
    proposer.cache = kv.new_cache(model)
    proposer._logits(context)
    samples = []
    for r in range(warmup + repeats):
        _, dt = timed(device, lambda: proposer._logits(new))
        kv.crop_to(proposer.cache, context_len)
        if r >= warmup:
            samples.append(dt)
    proposer.cache = None
    return float(statistics.median(samples))


@torch.inference_mode()
def draft_greedy_matches(proposer, prompt_ids, continuation) -> list:
    """For a ``DraftModelProposer`` and a continuation the target produced greedily after
    ``prompt_ids``: ``matches[j]`` = whether the draft's greedy token after prompt + continuation[:j]
    equals continuation[j] (``matches[0]``, the prefill's token, is always False). One teacher-forced
    forward of the draft, over its draft vocabulary when it has one. Feed the result to
    ``measure.replay.replay_greedy_chain`` to get the engine's counters for any k without decoding again.
    """
    model = proposer.model
    device = _device(model)
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long).reshape(-1).to(device)
    cont = torch.as_tensor(continuation, dtype=torch.long).reshape(-1).to(device)
    if cont.numel() < 2:
        return [False] * int(cont.numel())
    x = torch.cat([prompt, cont[:-1]])[None]
    h = decoder.last_hidden(model, x)[0][0, prompt.numel():]  # predicts cont[1:]
    head = getattr(proposer, "head", None)
    if head is None:
        pred = model.get_output_embeddings()(h).argmax(-1)
    else:
        pred = head.to_token(head.logits(h).argmax(-1))
    return [False] + (pred == cont[1:]).tolist()


if __name__ == "__main__":
    sys.exit(main())
