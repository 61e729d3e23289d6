"""Measurements for batched decoding: the cost surface T(B, n), throughput against batch size, the
speculation crossover, and batch-size-aware K. Each function returns a pandas DataFrame; the CLI
runs one or all of them and writes CSVs:

    python -m specdecode_ref.measure.batch_bench all --dtype bf16 --threads 2 --out batch_out
    python -m specdecode_ref.measure.batch_bench surface --batch-sizes 1,2,4,8,16,32 --max-n 9
    python -m specdecode_ref.measure.batch_bench throughput --batch-sizes 1,2,4,8,16,32 --max-new-tokens 64
    python -m specdecode_ref.measure.batch_bench speculation --proposers ngram,draft --batch-sizes 1,2,4,8,16,32
    python -m specdecode_ref.measure.batch_bench batch-k --proposers ngram,draft

Why these: a decode step streams all weights for a handful of tokens, so at batch 1 scoring k+1
tokens costs about one step and speculation is nearly free. A batch of B rows already fills the
step with B tokens; scoring B(k+1) tokens is no longer free (T(B, n) bends), so the speedup from
speculation falls with B and drops below 1 at some crossover batch size. The prediction: with
mean accepted length tau per row, a speculative step costs T(B, n) + draft time and buys tau
tokens per row, a plain step costs T(B, 1) and buys one, so

    predicted speedup(B) = tau * T(B, 1) / (T(B, n_step) + draft_s(B))

with n_step the step's width (the longest draft in the batch + 1: padding makes every row pay
for the longest). vLLM keeps a table of K per batch size for the same reason
(``vllm/v1/spec_decode/``; its scheduler budgets ``num_lookahead_tokens`` per request,
``vllm/v1/core/sched/scheduler.py``). Where a step's time goes: :func:`profile_generate_batch` times its parts (drafting, mask, target
forward, verification, rollback, ...) from outside the engine. Method as in bench.py: warm-up, medians of interleaved
repeats, ratios over absolute numbers, and a warning when the machine is busy. No figure here is
a pass/fail threshold.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

from ..analysis import expected_tokens_per_step
from ..batch import generate_batch
from ..ragged_cache import RaggedCache
from ..engine import eos_token_ids
from .harness import timing

BATCH_SIZES = (1, 2, 4, 8, 16, 32)
NS = tuple(range(1, 10))


def _timed(device, call):
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - t0


def _device(model):
    return next(model.parameters()).device


def busy_warning() -> str | None:
    """A warning line when other processes use the CPU (one second sampled), else None."""
    return timing.busy_machine_warning()


# --- T(B, n) ------------------------------------------------------------------------------------

@torch.inference_mode()
def measure_cost_surface(model, batch_sizes=BATCH_SIZES, ns=NS, context_len: int = 200, repeats: int = 5,
                         warmup: int = 1, seed: int = 0):
    """T(B, n): seconds of one target forward scoring n new tokens in each of B rows after a
    ``context_len``-token context per row, through the batched engine's own path (RaggedCache:
    4-D mask, per-row positions). Rounds go over every n in turn; the median is kept.

    Returns a DataFrame with columns B, n, time_s, relative (T(B, n) / T(1, 1)),
    per_row_token_ms (time / (B n)): where it bends is where batching stops being free.
    """
    import pandas as pd

    device = _device(model)
    vocab = model.get_input_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for b in batch_sizes:
        cache = RaggedCache(model, b)
        ctx = torch.randint(0, vocab, (b, context_len), generator=gen).tolist()
        new = torch.randint(0, vocab, (b, max(ns)), generator=gen).tolist()
        cache.forward(ctx, logits_to_keep=1)
        base = cache.num_slots
        samples = {n: [] for n in ns}
        for r in range(warmup + repeats):
            for n in ns:
                _, dt = _timed(device, lambda: cache.forward([row[:n] for row in new]))
                cache.truncate(base)
                if r >= warmup:
                    samples[n].append(dt)
        for n in ns:
            rows.append({"B": b, "n": n, "time_s": float(statistics.median(samples[n]))})
        del cache
    df = pd.DataFrame(rows)
    t11 = df[(df.B == min(batch_sizes)) & (df.n == min(ns))].time_s.iloc[0]
    df["relative"] = df.time_s / t11
    df["per_row_token_ms"] = df.time_s * 1e3 / (df.B * df.n)
    df.attrs.update(context_len=context_len, repeats=repeats, dtype=str(next(model.parameters()).dtype), device=str(device))
    return df


def non_decreasing_in_n(surface):
    """The surface with each batch size's curve made non-decreasing in n
    (``analysis.monotone_cost_curve``): scoring more tokens per row never does less work, so a dip
    is timing noise, and a K chosen or a crossover read off the raw surface would chase it.
    Returns a copy (relative and per_row_token_ms recomputed) with ``attrs["dips"]``, the number of
    (B, n) points the fit moved."""
    from ..analysis import monotone_cost_curve

    out = surface.sort_values(["B", "n"]).copy()
    moved = 0
    for b, g in out.groupby("B"):
        fitted = monotone_cost_curve(g.n.to_numpy(), g.time_s.to_numpy())
        moved += int((np.abs(fitted - g.time_s.to_numpy()) > 1e-12).sum())
        out.loc[g.index, "time_s"] = fitted
    first = out[(out.B == out.B.min()) & (out.n == out.n.min())].time_s
    out["relative"] = out.time_s / first.iloc[0] if len(first) else float("nan")  # T(B, n) / T(1, 1)
    out["per_row_token_ms"] = out.time_s * 1e3 / (out.B * out.n)
    out.attrs.update(surface.attrs, dips=moved)
    return out.reset_index(drop=True)


def surface_table(surface):
    """T(B, n) / T(1, 1) as a B x n table."""
    return surface.pivot(index="B", columns="n", values="relative")


def surface_time(surface, b: int, n: float) -> float:
    """T(b, n) in seconds, linear in n between measured points (clamped at the ends)."""
    sub = surface[surface.B == b].sort_values("n")
    if sub.empty:
        raise ValueError(f"batch size {b} is not in the measured surface")
    return float(np.interp(n, sub.n.to_numpy(), sub.time_s.to_numpy()))


# --- prompts ------------------------------------------------------------------------------------

def prompt_pool(tokenizer, kind: str = "input_grounded") -> list:
    """Chat-templated prompts: "input_grounded" (summarisation, rag_qa, rewrite, code: where n-gram
    drafting copies) or "chat" (the open-ended categories: where a draft model must guess)."""
    from ..models import chat_ids
    from .harness.workloads import INPUT_GROUNDED, OPEN_ENDED, load_workloads

    cats = {"input_grounded": INPUT_GROUNDED, "chat": OPEN_ENDED}[kind]
    return [chat_ids(tokenizer, item["messages"]) for items in load_workloads(list(cats)).values() for item in items]


def _batch(pool: list, b: int) -> list:
    return [pool[i % len(pool)] for i in range(b)]


# --- throughput: ours vs Hugging Face generate --------------------------------------------------

@torch.inference_mode()
def hf_generate_batch(model, prompts: list, max_new_tokens: int) -> list:
    """Hugging Face ``generate`` on the same batch, left-padded, with its attention_mask; returns
    each row's new tokens up to and including its first EOS."""
    device = _device(model)
    eos = eos_token_ids(model)
    pad = eos[0] if eos else 0
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = p
        mask[i, width - len(p):] = 1
    out = model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                         do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=pad)
    rows = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:cut])
    return rows


def measure_throughput(model, pool: list, batch_sizes=BATCH_SIZES, max_new_tokens: int = 64, repeats: int = 3,
                       with_hf: bool = True):
    """Plain batched decoding, ours against Hugging Face ``generate`` on the same batch, per B.

    Returns a DataFrame with one row per (B, method, repeat): tokens (new tokens of all rows),
    time_s, tokens_per_s, same_as_ours (HF's rows equal ours; bf16 near-ties may flip)."""
    import pandas as pd

    device = _device(model)
    generate_batch(model, _batch(pool, 2), max_new_tokens=4)  # warm-up
    if with_hf:
        hf_generate_batch(model, _batch(pool, 2), 4)
    rows = []
    for b in batch_sizes:
        prompts = _batch(pool, b)
        for r in range(repeats):
            res, dt = _timed(device, lambda: generate_batch(model, prompts, max_new_tokens=max_new_tokens))
            ours = [x.tokens.tolist() for x in res]
            n = sum(map(len, ours))
            rows.append({"B": b, "method": "ours", "repeat": r, "tokens": n, "time_s": dt, "tokens_per_s": n / dt,
                         "same_as_ours": True})
            if with_hf:
                hf, dt = _timed(device, lambda: hf_generate_batch(model, prompts, max_new_tokens))
                n = sum(map(len, hf))
                rows.append({"B": b, "method": "hf", "repeat": r, "tokens": n, "time_s": dt, "tokens_per_s": n / dt,
                             "same_as_ours": hf == ours})
    return pd.DataFrame(rows)


def summarize_throughput(df):
    """Median tokens/s per (B, method), and ours / HF and ours(B) / ours(1)."""
    med = df.groupby(["B", "method"]).tokens_per_s.median().unstack("method")
    if "hf" in med:
        med["ours_over_hf"] = med["ours"] / med["hf"]
    med["ours_over_b1"] = med["ours"] / med["ours"].iloc[0]
    return med


# --- where one batched step's time goes ---------------------------------------------------------

#: The parts of a decode step that :func:`profile_generate_batch` times, in the order of a step.
STEP_PARTS = ("draft", "layout", "mask", "forward", "verify", "rollback", "compact", "retire", "other")


class StepProfiler:
    """Times the parts of ``generate_batch``'s steps from outside the engine (``with`` block).

    Inside the block, the engine's own functions are wrapped by timers (and put back on exit), so
    ``batch.py`` carries no profiling code and runs exactly as without it; the timers cost a few
    microseconds per call against milliseconds per step. Parts, per run:

    * draft: the batch proposer's begin, propose and on_verified (n-gram lookups per row, or the
      draft model's forwards);
    * layout: left-padding the rows' new tokens and their positions (``RaggedCache.layout``);
    * mask: the 4-D attention mask over the cache (``ragged_attention_mask``, and
      ``ragged_tree_attention_mask`` when rows hold trees);
    * forward: the target model itself, scoring every row's ``[last] + draft`` (padded to the widest);
    * verify: ``verify_rows`` (chain rows) and ``verify_tree_row`` (tree rows); rollback:
      ``RaggedCache.rollback`` and ``discard`` (tree nodes off the path) of the target; compact:
      ``maybe_compact`` (the check, and the gather when it runs); retire: finished rows leaving the
      batch (target and drafter caches);
    * other: the rest of the step loop (bookkeeping per row: appending tokens, counters, EOS).

    The first target forward (the prefill of every prompt) is kept apart in ``prefill_s``. One
    record per decode forward in ``forwards``: active rows, width (the widest row's new tokens)
    and the mean row's new tokens.
    """

    def __init__(self, model):
        self.model = model
        self.device = _device(model)
        self.reset()

    def reset(self) -> None:
        self.parts = {p: 0.0 for p in STEP_PARTS if p != "other"}
        self.prefill_s = 0.0
        self.forwards: list = []
        self._in_target_forward = False
        self._prefill_done = False

    def _clock(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _timer(self, part: str, fn, target_only: bool = False):
        prof = self

        def timed(*args, **kwargs):
            if target_only and not (args and getattr(args[0], "model", None) is prof.model):
                return fn(*args, **kwargs)
            t0 = prof._clock()
            try:
                return fn(*args, **kwargs)
            finally:
                if prof._prefill_done:
                    prof.parts[part] += prof._clock() - t0
        return timed

    def __enter__(self):
        from .. import batch, ragged_cache

        prof = self
        self._saved = [(batch, "verify_rows", batch.verify_rows), (batch, "verify_tree_row", batch.verify_tree_row),
                       (batch, "_retire", batch._retire),
                       (ragged_cache, "ragged_attention_mask", ragged_cache.ragged_attention_mask),
                       (ragged_cache, "ragged_tree_attention_mask", ragged_cache.ragged_tree_attention_mask)]
        for cls_attr in ("forward", "layout", "rollback", "discard", "maybe_compact"):
            self._saved.append((batch.RaggedCache, cls_attr, getattr(batch.RaggedCache, cls_attr)))
        real_forward, real_mask = batch.RaggedCache.forward, ragged_cache.ragged_attention_mask
        real_tree_mask = ragged_cache.ragged_tree_attention_mask

        def forward(cache, rows_ids, *args, **kwargs):
            if cache.model is not prof.model or prof._in_target_forward:
                return real_forward(cache, rows_ids, *args, **kwargs)
            before = (prof.parts["layout"], prof.parts["mask"])
            prof._in_target_forward = True
            t0 = prof._clock()
            try:
                return real_forward(cache, rows_ids, *args, **kwargs)
            finally:
                dt = prof._clock() - t0
                prof._in_target_forward = False
                if not prof._prefill_done:
                    prof.prefill_s += dt
                    prof._prefill_done = True
                else:
                    inner = prof.parts["layout"] - before[0] + prof.parts["mask"] - before[1]
                    prof.parts["forward"] += dt - inner
                    lens = [len(r) for r in rows_ids]
                    prof.forwards.append({"rows": len(lens), "width": max(lens), "mean_new": float(np.mean(lens)),
                                          "forward_s": dt - inner})

        def masker(real):
            def mask(*args, **kwargs):
                if not prof._in_target_forward:
                    return real(*args, **kwargs)
                return prof._timer("mask", real)(*args, **kwargs)
            return mask

        batch.verify_rows = self._timer("verify", batch.verify_rows)
        batch.verify_tree_row = self._timer("verify", batch.verify_tree_row)
        batch._retire = self._timer("retire", batch._retire)
        ragged_cache.ragged_attention_mask = masker(real_mask)
        ragged_cache.ragged_tree_attention_mask = masker(real_tree_mask)
        batch.RaggedCache.forward = forward
        batch.RaggedCache.layout = self._timer("layout", batch.RaggedCache.layout, target_only=True)
        batch.RaggedCache.rollback = self._timer("rollback", batch.RaggedCache.rollback, target_only=True)
        batch.RaggedCache.discard = self._timer("rollback", batch.RaggedCache.discard, target_only=True)
        batch.RaggedCache.maybe_compact = self._timer("compact", batch.RaggedCache.maybe_compact, target_only=True)
        return self

    def __exit__(self, *exc):
        for owner, name, value in reversed(self._saved):
            setattr(owner, name, value)
        return False

    def wrap_proposer(self, proposer):
        """Time ``proposer``'s batch drafting (begin, propose, on_verified) as the "draft" part.
        Returns a function that undoes the wrapping."""
        if proposer is None:
            return lambda: None
        make = proposer.batch_proposer
        prof = self

        def batch_proposer():
            bp = make()
            for name in ("begin", "propose", "on_verified"):
                setattr(bp, name, prof._timer("draft", getattr(bp, name)))
            return bp

        proposer.batch_proposer = batch_proposer
        return lambda: proposer.__dict__.pop("batch_proposer", None)


def profile_generate_batch(model, prompts: list, proposer=None, **kwargs):
    """``generate_batch`` with its decode steps timed part by part (:class:`StepProfiler`).

    Returns (results, profile): ``profile`` is a dict with ``total_s`` (wall time of the call),
    ``prefill_s``, ``decode_s`` (total - prefill), ``steps`` (decode forwards), one entry per part
    of :data:`STEP_PARTS` in seconds over the whole run ("other" is what the parts leave of
    decode_s), and ``forwards`` (a list of dicts: rows, width, mean_new, forward_s per step).
    The results are those of ``generate_batch`` with the same arguments.
    """
    prof = StepProfiler(model)
    undo = prof.wrap_proposer(proposer)
    try:
        with prof:
            results, total = _timed(_device(model), lambda: generate_batch(model, prompts, proposer=proposer, **kwargs))
    finally:
        undo()
    out = {"total_s": total, "prefill_s": prof.prefill_s, "decode_s": total - prof.prefill_s,
           "steps": len(prof.forwards), **prof.parts}
    out["other"] = max(out["decode_s"] - sum(prof.parts.values()), 0.0)
    out["forwards"] = prof.forwards
    return results, out


def surface_time_at(surface, rows: float, n: float) -> float:
    """T(rows, n) in seconds for any number of active rows: linear in n (as :func:`surface_time`)
    and linear in B between the measured batch sizes (clamped at the ends). A batch shrinks as
    rows finish, so most steps run with a B that was not measured."""
    bs = np.array(sorted(int(b) for b in surface.B.unique()), dtype=float)
    times = np.array([surface_time(surface, int(b), n) for b in bs])
    return float(np.interp(rows, bs, times))


def run_policies(model, pool: list, batch_sizes, policies: dict, max_new_tokens: int = 16, make_proposer=None,
                 rows: int | None = None, proposer_for: dict | None = None):
    """Profiled runs of ``generate_batch`` at each batch size, one run per policy, interleaved.

    ``policies``: label -> K at batch size B (a function of B, or an int; 0 means plain decoding).
    ``make_proposer(k)`` builds the proposer (default: n-gram with draft length k);
    ``proposer_for`` maps a label to its own ``make_proposer`` (to set a tree beside a chain).
    A policy whose proposer and K at B equal an earlier policy's reuses that run.

    Which rows decode at batch size B:

    * ``rows=None``: one batch, ``pool[0..B-1]`` (cycled), so B = 1 is a single prompt;
    * ``rows=N``: the first N prompts in successive batches of B (N a multiple of every B), so
      every batch size decodes the same N prompts and a per-row comparison has N pairs at every
      B. The policies run interleaved batch by batch, in alternating order (the timing protocol's
      rules 1 and 2), and a (B, policy) row sums its batches.

    Returns a DataFrame, one row per (B, policy): k, tokens, total_s, prefill_s, decode_s, steps,
    the parts of :data:`STEP_PARTS` (seconds), forwards (per step: rows, width, mean_new,
    forward_s), row_decode_s (per row: its last token's time minus its batch's prefill),
    accepted_lengths and draft_lengths (all rows' steps), accepted_by_row and drafted_by_row (the
    same, one list per row), and tokens_by_row (to compare outputs).
    """
    import pandas as pd

    from ..proposers import NgramProposer
    from .harness.protocol import order_of

    make_proposer = make_proposer or (lambda k: NgramProposer(k=k))
    factories = {label: (proposer_for or {}).get(label, make_proposer) for label in policies}
    if rows is not None:
        if rows > len(pool) or any(rows % b for b in batch_sizes):
            raise ValueError(f"rows={rows} must be at most the pool's {len(pool)} prompts and a multiple of every "
                             f"batch size {tuple(batch_sizes)}")
    generate_batch(model, _batch(pool, 2), proposer=make_proposer(2), max_new_tokens=4)  # warm-up
    out, turn = [], 0
    for b in batch_sizes:
        chunks = [_batch(pool, b)] if rows is None else [pool[i:i + b] for i in range(0, rows, b)]
        ks = {label: int(policy(b) if callable(policy) else policy) for label, policy in policies.items()}
        key = {label: (0 if ks[label] == 0 else id(factories[label]), ks[label]) for label in policies}
        runs: dict = {}
        for prompts in chunks:
            done = set()
            for label in order_of(policies, turn):
                if key[label] in done:
                    continue
                k = ks[label]
                proposer = factories[label](k) if k > 0 else None
                res, prof = profile_generate_batch(model, prompts, proposer=proposer, max_new_tokens=max_new_tokens)
                done.add(key[label])
                runs.setdefault(key[label], []).append((res, prof))
            turn += 1
        for label in policies:
            parts = runs[key[label]]
            record = {"k": ks[label], "tokens": sum(len(r.tokens) for res, _ in parts for r in res)}
            for field in ("total_s", "prefill_s", "decode_s", "steps", *STEP_PARTS):
                record[field] = sum(prof[field] for _, prof in parts)
            by_row = [r for res, _ in parts for r in res]
            record.update(forwards=[f for _, prof in parts for f in prof["forwards"]],
                          row_decode_s=[r.stats.wall_time_s - prof["prefill_s"] for res, prof in parts for r in res],
                          accepted_by_row=[list(r.stats.accepted_lengths) for r in by_row],
                          drafted_by_row=[list(r.stats.draft_lengths) for r in by_row],
                          tokens_by_row=[r.tokens.tolist() for r in by_row])
            record.update(accepted_lengths=sum(record["accepted_by_row"], []),
                          draft_lengths=sum(record["drafted_by_row"], []))
            out.append({"B": b, "policy": label, **record})
    return pd.DataFrame(out)


def predicted_decode_s(surface, forwards: list, overhead_s: float = 0.0) -> float:
    """A run's decode time predicted from the cost surface: the sum over its recorded steps of
    T(active rows, width), the widest row's new tokens (every row pays for it), plus
    ``overhead_s`` (the measured time outside the target forward, if it is to be included)."""
    return sum(surface_time_at(surface, f["rows"], f["width"]) for f in forwards) + overhead_s


# --- speculation on vs off per B ------------------------------------------------------------------

def _make_proposer(name: str, model, k: int | None):
    from ..proposers import NgramProposer, load_proposer

    if name == "ngram":
        return NgramProposer(k=k or 5)
    return load_proposer(name, model, k=k)


def _step_widths(results) -> list:
    """Per batch step: the longest draft among the rows still active, + 1 (the forward's width)."""
    steps = max(len(r.stats.draft_lengths) for r in results)
    return [1 + max((r.stats.draft_lengths[i] for r in results if i < len(r.stats.draft_lengths)), default=0)
            for i in range(steps)]


def measure_speculation(model, pool: list, proposer: str = "ngram", batch_sizes=BATCH_SIZES, k: int | None = None,
                        max_new_tokens: int = 64, repeats: int = 3, surface=None):
    """Speculation on vs off at each batch size, with the prediction from T(B, n).

    One row per (B, repeat): plain and speculative tokens/s on the same prompts (interleaved),
    speedup, and from the speculative run: tau (emitted tokens per row-step, mean over rows),
    acceptance rate (accepted / drafted, vLLM's counter), alpha (accepted / tested, the i.i.d.
    estimate that the formulas take), mean step width, draft seconds per step, and, when ``surface`` (from
    :func:`measure_cost_surface`, same dtype) is given, predicted = tau T(B,1) / (T(B, width) + draft_s).
    """
    import pandas as pd

    device = _device(model)
    generate_batch(model, _batch(pool, 2), proposer=_make_proposer(proposer, model, k), max_new_tokens=4)
    rows = []
    for b in batch_sizes:
        prompts = _batch(pool, b)
        for r in range(repeats):
            plain, t_plain = _timed(device, lambda: generate_batch(model, prompts, max_new_tokens=max_new_tokens))
            prop = _make_proposer(proposer, model, k)
            spec, t_spec = _timed(device, lambda: generate_batch(model, prompts, proposer=prop, max_new_tokens=max_new_tokens))
            n_plain = sum(len(x.tokens) for x in plain)
            n_spec = sum(len(x.tokens) for x in spec)
            steps = sum(x.stats.steps for x in spec)
            emitted = sum(x.stats.emitted for x in spec)
            drafted = sum(x.stats.drafted for x in spec)
            widths = _step_widths(spec)
            draft_s = max(x.stats.draft_time_s for x in spec) / max(len(widths), 1)
            row = {"B": b, "proposer": proposer, "k": prop.k, "repeat": r,
                   "plain_tokens_per_s": n_plain / t_plain, "spec_tokens_per_s": n_spec / t_spec,
                   "speedup": (n_spec / t_spec) / (n_plain / t_plain),
                   "tau": emitted / steps if steps else 1.0,
                   "acceptance_rate": sum(x.stats.accepted for x in spec) / drafted if drafted else 0.0,
                   "alpha": _alpha_of(spec),
                   "mean_width": float(np.mean(widths)), "draft_s_per_step": draft_s,
                   "same_as_plain": [x.tokens.tolist() for x in spec] == [x.tokens.tolist() for x in plain]}
            if surface is not None:
                t1 = surface_time(surface, b, 1)
                row["predicted"] = row["tau"] * t1 / (surface_time(surface, b, row["mean_width"]) + draft_s)
            rows.append(row)
    return pd.DataFrame(rows)


def _alpha_of(results) -> float:
    """The i.i.d. acceptance rate of a run: accepted / positions tested (analysis.estimate_alpha), not
    accepted / drafted, which counts the never-tested drafts after a rejection as failures."""
    from ..analysis import estimate_alpha

    acc = [a for r in results for a in r.stats.accepted_lengths]
    dra = [d for r in results for d in r.stats.draft_lengths]
    return estimate_alpha(acc, dra) if sum(dra) else 0.0


def crossover(df, column: str = "speedup") -> float | None:
    """The batch size where the median ``column`` crosses 1 (log-linear interpolation between the
    measured sizes), or None when it never drops below 1 in the measured range."""
    med = df.groupby("B")[column].median().sort_index()
    bs, s = med.index.to_numpy(dtype=float), med.to_numpy()
    for i in range(1, len(bs)):
        if s[i - 1] >= 1.0 > s[i]:
            f = (s[i - 1] - 1.0) / (s[i - 1] - s[i])
            return float(np.exp(np.log(bs[i - 1]) + f * (np.log(bs[i]) - np.log(bs[i - 1]))))
    if len(s) and s[0] < 1.0:
        return float(bs[0])
    return None


# --- batch-size-aware K -------------------------------------------------------------------------

def choose_k_per_batch(surface, alpha: float, draft_s_per_token: dict | float = 0.0, ks=range(1, 9),
                       plain_overhead_s: dict | float = 0.0, spec_overhead_s: dict | float = 0.0):
    """K per batch size from the model: argmax over K of
    E[tokens | alpha, K] (T(B, 1) + o_plain(B)) / (T(B, K+1) + K c(B) + o_spec(B)), with T from the
    measured surface.

    alpha: per-row acceptance rate (measured; the i.i.d. estimate, analysis.estimate_alpha);
    draft_s_per_token: seconds of one draft position at batch B (a dict B -> s, or one number; 0
    for n-gram); plain_overhead_s / spec_overhead_s: seconds per step outside the target forward
    (mask, verification, rollback, bookkeeping) of a plain and of a speculative step (dict or
    number; default 0: the forward alone). Returns a DataFrame B, k, predicted."""
    import pandas as pd

    def at(value, b):
        return value.get(int(b), 0.0) if isinstance(value, dict) else float(value)

    rows = []
    max_n = int(surface.n.max())
    for b in sorted(surface.B.unique()):
        c = at(draft_s_per_token, b)
        t1 = surface_time(surface, int(b), 1) + at(plain_overhead_s, b)
        best = (1.0, 0)
        for kk in ks:
            if kk + 1 > max_n:
                break
            s = float(expected_tokens_per_step(alpha, kk)) * t1 / (surface_time(surface, int(b), kk + 1) + kk * c
                                                                  + at(spec_overhead_s, b))
            if s > best[0]:  # ties keep the smaller K (0 = plain decoding)
                best = (s, kk)
        rows.append({"B": int(b), "k": best[1], "predicted": best[0]})
    return pd.DataFrame(rows)


def measure_batch_aware_k(model, pool: list, proposer: str, k_table, fixed_k: int, max_new_tokens: int = 64,
                          repeats: int = 3):
    """Tokens/s with K chosen per batch size (``k_table``: DataFrame B, k; k = 0 means plain)
    against one fixed K for every B, plain decoding as the common reference."""
    import pandas as pd

    device = _device(model)
    rows = []
    for _, t in k_table.iterrows():
        b, kb = int(t.B), int(t.k)
        prompts = _batch(pool, b)
        for r in range(repeats):
            plain, t_plain = _timed(device, lambda: generate_batch(model, prompts, max_new_tokens=max_new_tokens))
            base = sum(len(x.tokens) for x in plain) / t_plain
            for label, kk in (("batch_aware", kb), ("fixed", fixed_k)):
                prop = _make_proposer(proposer, model, kk) if kk > 0 else None
                res, dt = _timed(device, lambda: generate_batch(model, prompts, proposer=prop, max_new_tokens=max_new_tokens))
                tps = sum(len(x.tokens) for x in res) / dt
                rows.append({"B": b, "proposer": proposer, "policy": label, "k": kk, "repeat": r,
                             "tokens_per_s": tps, "speedup_over_plain": tps / base})
    return pd.DataFrame(rows)


# --- CLI ----------------------------------------------------------------------------------------

# --- one batch against the same prompts one at a time ---------------------------------------------

def batch_against_one_at_a_time(model, prompts: list, max_new_tokens: int = 48, repeats: int = 3):
    """Plain decoding of the same ``prompts`` (1-D LongTensors, mixed lengths welcome) one request
    at a time (``generate`` per prompt) and as one batch (``generate_batch``), repeats interleaved.

    Returns a DataFrame, one row per repeat: tokens, alone_s, batch_s, speedup (batch tokens/s over
    one-at-a-time tokens/s), the batch's prefill_s and the parts of its decode steps
    (:data:`STEP_PARTS`), and the padding it paid: prefill_padding (share of the padded prefill's
    positions that are padding, B x longest prompt against the prompts' total).
    """
    import pandas as pd

    from ..engine import generate

    device = _device(model)
    generate_batch(model, prompts[:2], max_new_tokens=4)  # warm-up
    generate(model, prompts[0], max_new_tokens=4)
    lens = [len(p) for p in prompts]
    rows = []
    for r in range(repeats):
        alone, alone_s = _timed(device, lambda: [generate(model, p, max_new_tokens=max_new_tokens) for p in prompts])
        t0 = time.perf_counter()
        res, prof = profile_generate_batch(model, prompts, max_new_tokens=max_new_tokens)
        batch_s = time.perf_counter() - t0
        n_alone, n_batch = sum(len(x.tokens) for x in alone), sum(len(x.tokens) for x in res)
        rows.append({"repeat": r, "B": len(prompts), "tokens": n_batch, "alone_s": alone_s, "batch_s": batch_s,
                     "speedup": (n_batch / batch_s) / (n_alone / alone_s),
                     "same_tokens": [x.tokens.tolist() for x in alone] == [x.tokens.tolist() for x in res],
                     "prefill_padding": 1 - sum(lens) / (len(lens) * max(lens)),
                     **{key: prof[key] for key in ("prefill_s", "decode_s", "steps", *STEP_PARTS)}})
    return pd.DataFrame(rows)


def _ints(text: str) -> list:
    return [int(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdecode_ref.measure.batch_bench",
                                description="Batched decoding measurements (CSV files in --out).")
    p.add_argument("what", choices=["surface", "throughput", "alone", "speculation", "batch-k", "all"])
    p.add_argument("--batch-sizes", type=_ints, default=list(BATCH_SIZES), help="default: 1,2,4,8,16,32")
    p.add_argument("--max-n", type=int, default=9, help="largest n of T(B, n) (default: %(default)s)")
    p.add_argument("--context-len", type=int, default=200, help="context of T(B, n) (default: %(default)s)")
    p.add_argument("--proposers", default="ngram,draft", help="ngram on input-grounded prompts, draft on chat")
    p.add_argument("--k", type=int, default=None, help="draft length for speculation (default: the proposer's)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-hf", action="store_true", help="skip Hugging Face generate in the throughput run")
    p.add_argument("--out", default="batch_out")
    return p


POOL_FOR = {"ngram": "input_grounded", "draft": "chat", "draft-fullvocab": "chat"}


def main(argv=None) -> int:
    import pandas as pd

    from ..models import load_model

    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if (w := busy_warning()):
        print(w, file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    model, tok = load_model(device=args.device, dtype=args.dtype)
    pd.set_option("display.width", 160)
    proposers = [x for x in args.proposers.split(",") if x]
    bs = args.batch_sizes
    surface = None
    surface_path = os.path.join(args.out, "cost_surface.csv")
    if args.what in ("surface", "all"):
        surface = measure_cost_surface(model, bs, range(1, args.max_n + 1), args.context_len, args.repeats)
        surface.to_csv(surface_path, index=False)
        print("T(B, n) / T(1, 1):\n", surface_table(surface).round(2), "\n")
    elif os.path.exists(surface_path):
        surface = pd.read_csv(surface_path)
    if args.what in ("throughput", "all"):
        df = measure_throughput(model, prompt_pool(tok, "chat"), bs, args.max_new_tokens, args.repeats, not args.no_hf)
        df.to_csv(os.path.join(args.out, "throughput.csv"), index=False)
        print("plain batched decoding, tokens/s (median):\n", summarize_throughput(df).round(2), "\n")
    if args.what in ("alone", "all"):
        # The same chat prompts of mixed lengths (40-80 tokens) decoded as one batch and one at a time.
        prompts = [p for p in prompt_pool(tok, "chat") if 40 <= len(p) <= 80][: max(bs)]
        df = batch_against_one_at_a_time(model, prompts, args.max_new_tokens, args.repeats)
        df.to_csv(os.path.join(args.out, "batch_vs_alone.csv"), index=False)
        print(f"B = {len(prompts)} plain, one batch against one request at a time (prompts of "
              f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens):\n",
              df[["speedup", "prefill_padding", "prefill_s", "decode_s", *STEP_PARTS]].round(3).to_string(), "\n")
    alphas, draft_cost = {}, {}
    if args.what in ("speculation", "batch-k", "all"):
        for name in proposers:
            pool = prompt_pool(tok, POOL_FOR.get(name, "chat"))
            df = measure_speculation(model, pool, name, bs, args.k, args.max_new_tokens, args.repeats, surface)
            df.to_csv(os.path.join(args.out, f"speculation_{name}.csv"), index=False)
            cols = ["speedup"] + (["predicted"] if "predicted" in df else []) + ["tau", "acceptance_rate", "mean_width"]
            print(f"speculation ({name}) vs plain, median per B:\n", df.groupby("B")[cols].median().round(3))
            print(f"crossover measured: {crossover(df)}; predicted: "
                  f"{crossover(df, 'predicted') if 'predicted' in df else 'needs the surface'}\n")
            alphas[name] = float(df.alpha.median())  # accepted / tested: the alpha of the i.i.d. formula
            draft_cost[name] = {int(b): float(g.draft_s_per_step.median()) / int(g.k.iloc[0])
                                for b, g in df.groupby("B")}
    if args.what in ("batch-k", "all"):
        if surface is None:
            raise SystemExit(f"batch-k needs the cost surface: run `surface` first (reads {surface_path})")
        for name in proposers:
            c = 0.0 if name == "ngram" else draft_cost[name]
            table = choose_k_per_batch(surface[surface.B.isin(bs)], alphas[name], c)
            fixed = args.k or _make_proposer(name, model, None).k
            df = measure_batch_aware_k(model, prompt_pool(tok, POOL_FOR.get(name, "chat")), name, table, fixed,
                                       args.max_new_tokens, args.repeats)
            df.to_csv(os.path.join(args.out, f"batch_k_{name}.csv"), index=False)
            print(f"K per batch size ({name}, alpha {alphas[name]:.2f}):\n", table.round(3).to_string(index=False))
            print(df.groupby(["B", "policy"]).speedup_over_plain.median().unstack().round(3), "\n")
    print(f"saved CSVs in {args.out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

