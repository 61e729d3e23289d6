"""Does acceptance decay as the context grows? Each drafter's acceptance on the same task with more
and more text before it.

The task is fixed: summarise one passage, the *last* document of the prompt. Only what comes before
it changes: 0, then more and more other documents (the benchmark's summarisation passages and
retrieval documents), so the context grows from a few hundred tokens to several thousand while the
answer stays about the same. What could make acceptance fall:

* a drafter trained on short chats (the shipped draft model, EAGLE's and Medusa's heads were
  distilled on prompts of a few hundred tokens) meets positions and attention spans it never saw;
* heads that read the target's last hidden state (Medusa, Hydra, EAGLE) inherit whatever the long
  context does to that state;
* prompt lookup gains: a longer prompt has more n-grams to copy, and also more wrong ones.

Acceptance is reported per drafter and context length as the first position's rate (drafts whose
first token was kept), the i.i.d. alpha (``analysis.estimate_alpha``) and tau. The steps of one
answer are not independent draws (a passage that is easy to copy is easy at every step), so the
intervals resample whole passages (a cluster bootstrap over targets), and :func:`decay` gives the
change from the shortest to the longest context with a paired t-interval over the same passages. A
binomial interval over steps would be several times too narrow.

    python -m specdecode_ref.measure.context_length --out specdecode_ref/data/measured/context_length.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Sequence

from ..analysis import estimate_alpha
from .harness import protocol

DRAFTERS = ("ngram", "draft", "eagle", "hydra-chain")
N_DOCS = (0, 2, 5, 11)
TARGETS = (0, 1, 2, 3, 4, 5)  # summarisation passages: each is one cluster of correlated steps
#: What the stored table holds instead of timings (``measure.harness.protocol.untimed``).
UNTIMED = ("acceptance counts of greedy decoding (deterministic, so one run per prompt and drafter is exact); "
           "no times are stored")
STORED = Path(__file__).resolve().parent.parent / "data" / "measured" / "context_length.json"


def _passages() -> tuple:
    """(summarisation passages without their instruction, retrieval prompts' documents)."""
    from .harness.workloads import load_workloads

    wl = load_workloads(["summarization", "rag_qa"])
    summ = [p["messages"][-1]["content"].split("\n\n", 1)[-1].strip() for p in wl["summarization"]]
    docs = [p["messages"][-1]["content"].rsplit("\n\n", 1)[0].strip() for p in wl["rag_qa"]]
    return summ, docs


def long_context_prompts(tokenizer, n_docs: Sequence[int] = N_DOCS, target: int = 0) -> list:
    """Chat prompts that end with the same request about passage ``target`` (a summarisation
    passage) after ``n`` other documents, for each n in ``n_docs``. Returns dicts n_docs, ids
    (LongTensor [L]), context_tokens."""
    from ..models import chat_ids

    summ, docs = _passages()
    if not 0 <= target < len(summ):
        raise ValueError(f"target must index one of the {len(summ)} summarisation passages, got {target!r}")
    fillers = [p for i, p in enumerate(summ) if i != target] + docs
    out = []
    for n in n_docs:
        if not isinstance(n, int) or n < 0 or n > len(fillers):
            raise ValueError(f"n_docs entries must be ints in 0..{len(fillers)}, got {n!r}")
        parts = [f"Document {i + 1}:\n{text}" for i, text in enumerate(fillers[:n] + [summ[target]])]
        request = "\n\n".join(parts) + f"\n\nSummarize Document {n + 1} in three sentences."
        ids = chat_ids(tokenizer, [{"role": "user", "content": request}])
        out.append({"n_docs": n, "ids": ids, "context_tokens": int(ids.numel())})
    return out


def acceptance_by_context(model, tokenizer, drafters: Sequence[str] = DRAFTERS, n_docs: Sequence[int] = N_DOCS,
                          targets: Sequence[int] = TARGETS, max_new_tokens: int = 48, k: int | None = None,
                          progress: bool = True):
    """Greedy decoding of every long-context prompt with every drafter (its shipped default k
    unless ``k``); one row per (drafter, target, n_docs): context_tokens, drafts, first_kept,
    accepted, drafted, tau, alpha, identical (output equal to plain decoding's)."""
    import pandas as pd
    from tqdm.auto import tqdm

    from ..engine import autoregressive_generate, generate
    from ..proposers import load_proposer

    proposers = {d: load_proposer(d, model) if k is None else load_proposer(d, model, k=k) for d in drafters}
    cases = [(t, c) for t in targets for c in long_context_prompts(tokenizer, n_docs, t)]
    rows = []
    bar = tqdm(total=len(cases) * (len(drafters) + 1), desc="context length", disable=not progress)
    for t, case in cases:
        plain = autoregressive_generate(model, case["ids"], max_new_tokens=max_new_tokens).tokens.tolist()
        bar.update(1)
        for name, proposer in proposers.items():
            out = generate(model, case["ids"], proposer, max_new_tokens=max_new_tokens)
            s = out.stats
            rows.append({"drafter": name, "target": t, "n_docs": case["n_docs"],
                         "context_tokens": case["context_tokens"], "drafts": s.drafting_steps,
                         "first_kept": s.accepted_per_position[0] if s.accepted_per_position else 0,
                         "accepted": s.accepted, "drafted": s.drafted, "steps": s.steps, "emitted": s.emitted,
                         "accepted_lengths": list(s.accepted_lengths), "draft_lengths": list(s.draft_lengths),
                         "identical": out.tokens.tolist() == plain})
            bar.update(1)
    bar.close()
    return pd.DataFrame(rows)


def _pooled(g) -> dict:
    """First-position rate and tau pooled over the rows of ``g`` (several passages)."""
    drafts = g.drafts.sum()
    return {"first_rate": g.first_kept.sum() / drafts if drafts else float("nan"),
            "tau": g.emitted.sum() / g.steps.sum()}


def _boot_targets(df, n_boot: int, seed: int):
    """Bootstrap resamples of the passages: [n_boot, n_targets] target ids drawn with replacement."""
    import numpy as np

    targets = np.array(sorted(df.target.unique()))
    rng = np.random.default_rng(seed)
    return rng.choice(targets, size=(n_boot, len(targets)), replace=True)


def summarize(df, n_boot: int = 1000, seed: int = 0):
    """Per drafter and n_docs, pooled over targets: mean context length, first-position rate with a
    95 % interval from resampling whole passages (NaN with a single passage), alpha, tau with its
    interval."""
    import numpy as np
    import pandas as pd

    draws = _boot_targets(df, n_boot, seed)
    rows = []
    for (name, n), g in df.groupby(["drafter", "n_docs"], sort=False):
        by_target = g.set_index("target")
        point = _pooled(g)
        acc = [a for xs in g.accepted_lengths for a in xs]
        dl = [d for xs in g.draft_lengths for d in xs]
        if draws.shape[1] > 1:
            boot = [_pooled(by_target.loc[list(idx)]) for idx in draws]
            f_lo, f_hi = np.nanquantile([b["first_rate"] for b in boot], [0.025, 0.975])
            t_lo, t_hi = np.quantile([b["tau"] for b in boot], [0.025, 0.975])
        else:
            f_lo = f_hi = t_lo = t_hi = float("nan")
        drafts = int(g.drafts.sum())
        rows.append({"drafter": name, "n_docs": n, "context_tokens": float(g.context_tokens.mean()),
                     "passages": int(g.target.nunique()), "drafts": drafts, "first_rate": point["first_rate"],
                     "first_lo": f_lo, "first_hi": f_hi,
                     "alpha": estimate_alpha(acc, dl) if drafts else float("nan"),
                     "tau": point["tau"], "tau_lo": t_lo, "tau_hi": t_hi, "all_identical": bool(g.identical.all())})
    return pd.DataFrame(rows)


def decay(df, n_boot: int = 1000, seed: int = 0):
    """Per drafter: the change of the first-position rate and of tau from the shortest context to the
    longest, on the same passages. change is the mean over passages of each passage's own change
    (its difficulty cancels); lo/hi a 95 % t-interval over passages (NaN below 3 passages: two
    clusters say nothing about a third); sd the passages' spread, from which
    ``passages_needed(sd, effect)`` sizes an experiment. A change whose interval excludes 0 is one
    the data resolve. ``n_boot`` and ``seed`` are kept for callers of the bootstrap version."""
    import numpy as np
    import pandas as pd
    from scipy import stats

    lo_n, hi_n = df.n_docs.min(), df.n_docs.max()
    rows = []
    for name, g in df.groupby("drafter", sort=False):
        short = g[g.n_docs == lo_n].set_index("target").sort_index()
        long = g[g.n_docs == hi_n].set_index("target").sort_index()
        shared = short.index.intersection(long.index)
        short, long = short.loc[shared], long.loc[shared]
        row = {"drafter": name, "from_tokens": float(short.context_tokens.mean()),
               "to_tokens": float(long.context_tokens.mean()), "passages": len(shared)}
        per = {"first_rate": long.first_kept / long.drafts - short.first_kept / short.drafts,
               "tau": long.emitted / long.steps - short.emitted / short.steps}
        for key, changes in per.items():
            x = changes.to_numpy(dtype=float)
            n = len(x)
            row[f"{key}_change"] = float(x.mean())
            sd = float(x.std(ddof=1)) if n > 1 else float("nan")
            half = stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n) if n >= 3 else float("nan")
            row[f"{key}_lo"], row[f"{key}_hi"], row[f"{key}_sd"] = x.mean() - half, x.mean() + half, sd
        rows.append(row)
    return pd.DataFrame(rows)


def passages_needed(sd: float, effect: float, power: float = 0.8, confidence: float = 0.95) -> int:
    """Passages a paired experiment needs to detect a change of ``effect`` with the given power, when
    passages' changes spread with standard deviation ``sd`` (normal approximation)."""
    import math

    from scipy import stats

    if not (sd >= 0 and effect > 0):
        raise ValueError(f"sd must be >= 0 and effect > 0, got {sd!r}, {effect!r}")
    z = stats.norm.ppf(1 - (1 - confidence) / 2) + stats.norm.ppf(power)
    return max(3, math.ceil((z * sd / effect) ** 2))


def load_stored(path=None):
    """The stored measurement (``STORED``) as a DataFrame of :func:`acceptance_by_context` rows,
    and its meta (machine, date, settings)."""
    import pandas as pd

    p = Path(path) if path is not None else STORED
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing: run `python -m specdecode_ref.measure.context_length`")
    data = json.loads(p.read_text())
    return pd.DataFrame(data["rows"]), data["meta"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdecode_ref.measure.context_length",
                                description="Each drafter's acceptance as the context grows (same task, more text before it).")
    p.add_argument("--drafters", default=",".join(DRAFTERS))
    p.add_argument("--n-docs", default=",".join(map(str, N_DOCS)))
    p.add_argument("--targets", default=",".join(map(str, TARGETS)))
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default=None)
    p.add_argument("--out", default=str(STORED))
    args = p.parse_args(argv)
    from ..models import load_model
    from .harness.claims import machine_line

    model, tok = load_model(dtype=args.dtype)
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]  # noqa: E731
    df = acceptance_by_context(model, tok, [d.strip() for d in args.drafters.split(",")], ints(args.n_docs),
                               ints(args.targets), args.max_new_tokens)
    print(summarize(df).round(3).to_string(index=False))
    print(decay(df).round(3).to_string(index=False))
    meta = {"machine": machine_line(model), "date": time.strftime("%Y-%m-%d"), "max_new_tokens": args.max_new_tokens,
            "n_docs": ints(args.n_docs), "targets": ints(args.targets), **protocol.untimed(UNTIMED)}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": json.loads(df.to_json(orient="records"))}))
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
