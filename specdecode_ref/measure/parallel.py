"""Parallel against sequential drafting, measured on the same prompts (notebook 13).

The sequential draft model (``draft``) pays one draft forward per drafted token; the parallel
drafter (``pard``), the same four layers adapted to mask tokens, pays one forward per step. Both
are timed at several K beside plain decoding by ``measure.routing.measure``, under the course's
timing protocol (``measure.harness.protocol``: interleaved per prompt, two rounds in alternating
order, spikes re-timed), 48 new tokens, greedy, with per-prompt timings, pooled counters and the
machine's cost curve::

    python -m specdecode_ref.measure.parallel --split benchmark --dtype fp32
    python -m specdecode_ref.measure.parallel --split heldout --dtype fp32

writes ``data/measured/parallel_<split>.json``. :func:`speedups` gives each method's pooled
speedup over plain decoding with a paired bootstrap interval (prompts resampled within their
category), :func:`per_position` the acceptance at each draft position, :func:`draft_costs` what
drafting cost per step, and :func:`best_k` the K at which each family is fastest.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from .harness.intervals import wilson
from .harness.protocol import decode_t1
from .routing import MEASURED_DIR, PLAIN, compare_choosers, evaluate, measure

SPLITS = ("benchmark", "heldout")
METHODS = ("plain", "draft@1", "draft@2", "draft@3", "pard@2", "pard@3", "pard@4")
FAMILIES = {"draft": "sequential draft model", "pard": "parallel drafter (PARD)"}


def table_path(split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return MEASURED_DIR / f"parallel_{split}.json"


def load_parallel_table(split: str = "benchmark", path=None) -> dict:
    """A stored table (``data/measured/parallel_<split>.json`` unless ``path``)."""
    p = Path(path) if path is not None else table_path(split)
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing: run `python -m specdecode_ref.measure.parallel --split {split}`")
    return json.loads(p.read_text())


def family_and_k(method: str) -> tuple:
    """("draft", 3) for "draft@3"; ("plain", 0) for plain decoding."""
    if method == PLAIN:
        return PLAIN, 0
    name, _, k = method.partition("@")
    if not k:
        raise ValueError(f"{method!r}: the parallel table names its methods name@K")
    return name, int(k)


def speedups(table: dict, n_boot: int = 2000, seed: int = 0):
    """Pooled speedup of every method over plain decoding with a 95 % paired bootstrap interval,
    τ (tokens per target forward) and the method's family and K. One row per method."""
    import pandas as pd

    methods = [m for m in table["meta"]["methods"] if m != PLAIN]
    n = len(table["prompts"])
    ev = evaluate(table, {m: [m] * n for m in methods}, n_boot=n_boot, seed=seed).set_index("chooser")
    rows = []
    for m in methods:
        c = table["meta"]["counters"][m]
        fam, k = family_and_k(m)
        rows.append({"method": m, "family": fam, "K": k, "speedup": ev.loc[m, "speedup"], "lo": ev.loc[m, "lo"],
                     "hi": ev.loc[m, "hi"], "tau": c["emitted"] / c["steps"]})
    return pd.DataFrame(rows)


def per_position(table: dict, method: str) -> dict:
    """Acceptance at each draft position of ``method``, pooled over prompts: ``survival`` s_i
    (drafts whose first i+1 tokens were all kept, over drafts; vLLM's per-position metric) and
    ``conditional`` a_i = s_i / s_{i-1} (kept at i given i-1 was kept), with the counts behind it
    (``reached``: drafts whose earlier positions were all kept; ``kept``: of those, kept here) and
    its 95 % Wilson interval (``lo``, ``hi``): a deep position is reached by few drafts, so its rate
    alone says little."""
    c = table["meta"]["counters"][method]
    drafts = c["spec_decode_num_drafts"]
    kept = np.asarray(c["spec_decode_num_accepted_tokens_per_pos"], dtype=int)
    reached = np.concatenate([[drafts], kept[:-1]]).astype(int)
    surv = kept / max(drafts, 1)
    cond = np.divide(kept, reached, out=np.full(len(kept), np.nan), where=reached > 0)
    bounds = np.array([wilson(int(k), int(n)) for k, n in zip(kept, reached)]).reshape(-1, 2)
    return {"survival": surv, "conditional": cond, "drafts": int(drafts), "reached": reached, "kept": kept,
            "lo": bounds[:, 0], "hi": bounds[:, 1]}


def draft_costs(table: dict) -> "object":
    """What drafting cost per drafting step and per drafted token, in units of the run's own
    one-token target forward T(1) (plain decoding's decode steps): the sequential draft's cost
    grows with K, the parallel drafter's stays about one forward."""
    import pandas as pd

    counters = table["meta"]["counters"]
    base = counters[PLAIN]
    t1 = decode_t1(base)
    rows = []
    for m in table["meta"]["methods"]:
        if m == PLAIN:
            continue
        c = counters[m]
        fam, k = family_and_k(m)
        per_step = c["draft_time_s"] / max(c["spec_decode_num_drafts"], 1)
        rows.append({"method": m, "family": fam, "K": k, "draft ms / step": 1e3 * per_step,
                     "draft / T(1) per step": per_step / t1,
                     "draft / T(1) per token": per_step / t1 / (c["spec_decode_num_draft_tokens"]
                                                             / max(c["spec_decode_num_drafts"], 1))})
    return pd.DataFrame(rows)


def best_k(speedup_table) -> dict:
    """family -> the row of its fastest K (by pooled speedup)."""
    out = {}
    for fam, rows in speedup_table.groupby("family"):
        out[fam] = rows.loc[rows.speedup.idxmax()]
    return out


def compare_methods(table: dict, a: str, b: str, n_boot: int = 2000, seed: int = 0) -> tuple:
    """Method a's pooled speed over method b's on the same prompts, with a paired bootstrap
    interval (prompts resampled within categories): (ratio, lo, hi)."""
    n = len(table["prompts"])
    return compare_choosers(table, [a] * n, [b] * n, n_boot=n_boot, seed=seed)


def forward_costs(target, draft, pard, context: list, ks: Sequence[int] = (1, 2, 3, 4), repeats: int = 15):
    """What drafting K tokens costs each way, timed here after ``context`` (a list of ids), in
    milliseconds (median of ``repeats``): the target's one-token forward T(1), the sequential draft's
    K one-token forwards, and the parallel drafter's ONE forward over the last token and K − 1 masks.
    Both drafters run with the full vocabulary projection on the last K positions' logits only."""
    import time

    import pandas as pd
    import torch

    from .. import kv
    from ..proposers.parallel_draft import masked_embedding

    device = next(target.parameters()).device

    def cached(model, ids):
        cache = kv.new_cache(model)
        with torch.no_grad():
            model(input_ids=torch.tensor([ids], device=device), past_key_values=cache, use_cache=True)
        return cache

    def timed(fn):
        for _ in range(3):  # warm-up: the first calls of a shape pay for allocations
            fn()
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        return 1e3 * float(np.median(out))

    prefix, last = context[:-1], context[-1]
    caches = {"target": cached(target, prefix), "draft": cached(draft, prefix), "pard": cached(pard, prefix)}
    n0 = len(prefix)

    @torch.no_grad()
    def one(model, cache, ids, keep):
        model(input_ids=torch.tensor([ids], device=device), past_key_values=cache, use_cache=True,
              logits_to_keep=keep)
        kv.crop_to(cache, n0)

    @torch.no_grad()
    def sequential(k):
        cache = caches["draft"]
        for i in range(k):
            draft(input_ids=torch.tensor([[last]], device=device), past_key_values=cache, use_cache=True,
                  logits_to_keep=1)
        kv.crop_to(cache, n0)

    mask = masked_embedding(pard).mask_ids(max(ks) - 1)
    t1 = timed(lambda: one(target, caches["target"], [last], 1))
    rows = []
    for k in ks:
        rows.append({"K": k, "T(1) ms": t1, "sequential ms": timed(lambda: sequential(k)),
                     "parallel ms": timed(lambda: one(pard, caches["pard"], [last] + mask[: k - 1], k))})
    out = pd.DataFrame(rows).set_index("K")
    out["sequential / T(1)"] = out["sequential ms"] / out["T(1) ms"]
    out["parallel / T(1)"] = out["parallel ms"] / out["T(1) ms"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdecode_ref.measure.parallel",
                                description="Time the parallel drafter and the sequential draft model at several K "
                                            "beside plain decoding, on the same prompts.")
    p.add_argument("--split", choices=SPLITS, default="benchmark")
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated (default: {','.join(METHODS)})")
    p.add_argument("--per-category", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None)
    p.add_argument("--out", default=None, help="default: data/measured/parallel_<split>.json")
    args = p.parse_args(argv)
    from ..models import load_model

    model, tok = load_model(dtype=args.dtype)
    methods = [x.strip() for x in args.methods.split(",")]
    from .harness.workloads import load_heldout, load_workloads

    workloads = (load_workloads if args.split == "benchmark" else load_heldout)(None, per_category=args.per_category)
    table = measure(model, tok, workloads, methods,
                    max_new_tokens=args.max_new_tokens, split=args.split)
    out = Path(args.out) if args.out else table_path(args.split)
    out.write_text(json.dumps(table, indent=None, separators=(",", ":")))
    print(f"saved {out} ({len(table['prompts'])} prompts, {len(methods)} methods)")
    return 0


__all__ = ["SPLITS", "METHODS", "FAMILIES", "table_path", "load_parallel_table", "family_and_k", "speedups",
           "per_position", "draft_costs", "best_k", "compare_methods", "forward_costs", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
