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
``vllm/v1/core/sched/scheduler.py``). Method as in bench.py: warm-up, medians of interleaved
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
from ..batch import RaggedCache, generate_batch
from ..engine import eos_token_ids
from . import timing

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
    from .workloads import INPUT_GROUNDED, OPEN_ENDED, load_workloads

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
    acceptance rate, mean step width, draft seconds per step, and, when ``surface`` (from
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
                   "mean_width": float(np.mean(widths)), "draft_s_per_step": draft_s,
                   "same_as_plain": [x.tokens.tolist() for x in spec] == [x.tokens.tolist() for x in plain]}
            if surface is not None:
                t1 = surface_time(surface, b, 1)
                row["predicted"] = row["tau"] * t1 / (surface_time(surface, b, row["mean_width"]) + draft_s)
            rows.append(row)
    return pd.DataFrame(rows)


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

def choose_k_per_batch(surface, alpha: float, draft_s_per_token: dict | float = 0.0, ks=range(1, 9)):
    """K per batch size from the model: argmax over K of
    E[tokens | alpha, K] T(B, 1) / (T(B, K+1) + K c(B)), with T from the measured surface.

    alpha: per-row acceptance rate (measured); draft_s_per_token: seconds of one draft position at
    batch B (a dict B -> s, or one number; 0 for n-gram). Returns a DataFrame B, k, predicted."""
    import pandas as pd

    rows = []
    max_n = int(surface.n.max())
    for b in sorted(surface.B.unique()):
        c = draft_s_per_token.get(int(b), 0.0) if isinstance(draft_s_per_token, dict) else float(draft_s_per_token)
        t1 = surface_time(surface, int(b), 1)
        best = (1.0, 0)
        for kk in ks:
            if kk + 1 > max_n:
                break
            s = float(expected_tokens_per_step(alpha, kk)) * t1 / (surface_time(surface, int(b), kk + 1) + kk * c)
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

def _ints(text: str) -> list:
    return [int(x) for x in text.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdecode_ref.measure.batch_bench",
                                description="Batched decoding measurements (CSV files in --out).")
    p.add_argument("what", choices=["surface", "throughput", "speculation", "batch-k", "all"])
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
            alphas[name] = float(df.acceptance_rate.median())
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
