"""Which drafter for which prompt: per-prompt timings of every candidate, a router fitted to them,
and its speed against the best single drafter and the oracle, with intervals.

The data is a table of prompts, each with its router features (``proposers.router``: length,
self-repetition, the target's pooled hidden state) and the seconds and tokens of every candidate
on it, timed by ``bench.run_benchmark`` under ``measure.harness.protocol`` (methods interleaved per prompt, two
rounds, spikes re-timed; greedy, so every candidate emits the same tokens). Two tables: the benchmark prompts, which the router is fitted on,
and the held-out prompts (``workloads.load_heldout``), which nothing is tuned on and which the
figures are reported on.

Three ways to choose, scored on the same table:

* best single: the one candidate with the highest pooled speedup on the *fitting* prompts, used
  everywhere (what a deployment does when it picks one method);
* router: the fitted policy's choice per prompt;
* oracle: the fastest candidate of each prompt, known only after timing them all. Its speed is
  an upper bound, and a little optimistic: on a prompt where two candidates are within noise it
  picks whichever the noise favoured.

Speedups are pooled (total tokens over total seconds against plain decoding's); regret is how
much slower than the oracle, oracle speed / chooser's speed - 1. Intervals: a paired bootstrap
over prompts, stratified by category (``measure.harness.intervals``).

    python -m specdecode_ref.measure.routing measure --split benchmark   # timings (about 20 min, fp32 2-core CPU)
    python -m specdecode_ref.measure.routing fit                          # data/router.json
    python -m specdecode_ref.measure.routing measure --split heldout      # + the live router and bandit
    python -m specdecode_ref.measure.routing evaluate
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..proposers.router import PLAIN, TEXT_FEATURES, RouterPolicy, prompt_features
from .harness import protocol
from .harness.intervals import stratified_indices

#: The candidates a router chooses among: plain decoding and the shipped drafters that a router
#: can switch per request (early exit cannot: it verifies in the target's cache itself).
CANDIDATES = ("plain", "ngram", "draft", "eagle", "hydra-chain", "medusa")
#: Measured alongside the candidates but not routed to: suffix decoding keeps one cache across
#: requests, so its speed on a prompt depends on the prompts before it, not on the prompt alone.
MEASURED_ALSO = ("suffix",)
MEASURED_DIR = Path(__file__).resolve().parent.parent / "data" / "measured"
SPLITS = ("benchmark", "heldout")


def table_path(split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return MEASURED_DIR / f"routing_{split}.json"


def _workloads(split: str, per_category: int | None):
    from .harness.workloads import load_heldout, load_workloads

    return (load_workloads if split == "benchmark" else load_heldout)(None, per_category=per_category)


def measure(model, tokenizer, workloads: dict, methods: Sequence[str] = CANDIDATES, max_new_tokens: int = 48,
            repeats: int = protocol.ROUNDS, progress: bool = True, split: str = "benchmark") -> dict:
    """Time every method on every prompt under ``measure.harness.protocol`` and compute each prompt's router
    features. Returns the table (see the module docstring) as plain JSON-ready values.

    Each drafter runs at its fixed size (``proposers.default_k``), the size the router and the bandit
    draft with, so that a policy fitted on the table chooses among the drafters it will run. A name
    with ``@K`` (``measure.parallel``) sets the size itself."""
    from ..models import chat_ids
    from ..proposers import available_proposers, default_k
    from .harness import bench
    from .harness.claims import machine_line
    from .harness.timing import check_quiet

    methods = list(methods)
    if PLAIN not in methods:
        raise ValueError("plain decoding must be among the methods: speedups are relative to it")
    fixed = {m: default_k(m) for m in methods if m in available_proposers() and default_k(m) is not None}
    load = check_quiet(verbose=progress)
    df = bench.run_benchmark(model, tokenizer, methods, workloads, max_new_tokens=max_new_tokens, repeats=repeats,
                             progress=progress, k=fixed)
    not_exact = df[(df.identical == False) & (df.method != PLAIN)]  # noqa: E712
    prompts = []
    for cat, items in workloads.items():
        for item in items:
            rows = df[df.prompt_id == item["id"]].set_index("method")
            feats = prompt_features(model, chat_ids(tokenizer, item["messages"]))
            prompts.append({
                "id": item["id"], "category": cat, "prompt_tokens": int(rows["prompt_tokens"].iloc[0]),
                "features": {**{k: float(feats[k]) for k in TEXT_FEATURES},
                             "hidden": [round(float(x), 5) for x in feats["hidden"]]},
                "seconds": {m: float(rows.loc[m, "seconds"]) for m in methods},
                "tokens": {m: int(rows.loc[m, "tokens"]) for m in methods},
                "tau": {m: (None if rows.loc[m, "tau"] is None or rows.loc[m, "tau"] != rows.loc[m, "tau"]
                            else float(rows.loc[m, "tau"])) for m in methods},
                "prefill_s": {m: float(rows.loc[m, "stats"].prefill_time_s) for m in methods},
                "steps": {m: int(rows.loc[m, "stats"].steps) for m in methods},
                "emitted": {m: int(rows.loc[m, "stats"].emitted) for m in methods},
                "accepted_per_pos": {m: [int(x) for x in rows.loc[m, "stats"].accepted_per_position]
                                     for m in methods},
                "drafting_steps": {m: int(rows.loc[m, "stats"].drafting_steps) for m in methods},
                "drafted": {m: int(rows.loc[m, "stats"].drafted) for m in methods},
            })
    from ..metrics import merge_stats
    from ..serving.metrics import vllm_counters

    counters = {}
    for m in methods:
        stats = merge_stats(s for s in df[df.method == m]["stats"])
        k_run = df[df.method == m]["k"].dropna()
        counters[m] = {**{k.removeprefix("vllm:"): v for k, v in vllm_counters(stats).items()},
                       "num_speculative_tokens": int(k_run.iloc[0]) if len(k_run) else None,
                       "steps": int(stats.steps), "emitted": int(stats.emitted),
                       "draft_time_s": float(stats.draft_time_s), "target_time_s": float(stats.target_time_s),
                       "prefill_time_s": float(stats.prefill_time_s), "wall_time_s": float(stats.wall_time_s),
                       # drafting steps by draft length 1..K: n-gram and suffix often draft fewer than K
                       "draft_length_counts": _length_counts(stats.draft_lengths)}
    curve = bench.measure_cost_curve(model, ns=range(1, 18), context_len=256)
    return {"meta": {"split": split, "methods": methods, "max_new_tokens": int(max_new_tokens), "repeats": repeats,
                     "machine": machine_line(model), **protocol.record(load, protocol.t1_of({"counters": counters}),
                                                                         repeats),
                     "outputs_differ_from_plain": sorted(set(not_exact.prompt_id)),
                     "counters": counters, "cost_curve": curve},
            "prompts": prompts}


def _length_counts(lengths) -> list:
    """[K]: how many steps drafted 1, 2, ..., K tokens (steps that drafted nothing left out)."""
    lengths = [int(n) for n in lengths]
    return [lengths.count(n) for n in range(1, max(lengths, default=0) + 1)]


def load_table(split: str = "benchmark", path=None) -> dict:
    """A stored table (``data/measured/routing_<split>.json`` unless ``path``)."""
    p = Path(path) if path is not None else table_path(split)
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing: run `python -m specdecode_ref.measure.routing measure --split {split}`")
    return json.loads(p.read_text())


def as_bench_frame(table: dict, methods: Sequence[str] | None = None):
    """The table as ``bench.run_benchmark`` rows (category, prompt_id, method, tokens, seconds,
    emitted, steps, tau, ...), so ``bench.summarize`` gives its per-category speedups with intervals."""
    import pandas as pd

    methods = list(table["meta"]["methods"]) if methods is None else list(methods)
    _check_methods(table, methods)
    rows = []
    for p in table["prompts"]:
        for m in methods:
            rows.append({"category": p["category"], "prompt_id": p["id"], "method": m, "prompt_tokens": p["prompt_tokens"],
                         "tokens": p["tokens"][m], "seconds": p["seconds"][m],
                         "prefill_s": p.get("prefill_s", {}).get(m, float("nan")),
                         "tokens_per_s": p["tokens"][m] / p["seconds"][m], "tau": p["tau"][m],
                         "emitted": p.get("emitted", {}).get(m), "steps": p.get("steps", {}).get(m),
                         "drafted": p.get("drafted", {}).get(m),
                         "accepted": sum(p["accepted_per_pos"][m]) if "accepted_per_pos" in p else None,
                         "identical": p["id"] not in table["meta"].get("outputs_differ_from_plain", [])})
    df = pd.DataFrame(rows)
    for col in ("emitted", "steps", "drafted", "accepted"):
        df[col] = df[col].astype(float)
    return df


def with_method_from(table: dict, other: dict, method: str, name: str | None = None) -> dict:
    """A copy of ``table`` with ``method`` from ``other`` (a table of the same prompts, timed in
    another run) added as ``name`` (default: ``method``). Its seconds on each prompt are scaled by
    the two runs' plain-decoding times on that prompt, so its speedup over plain is the one its own
    run measured, now against this table's plain decoding; tokens, τ and prefill come as measured.
    Two runs' drift then enters only through the ratio of their plain timings, prompt by prompt, and
    two runs on different setups, or at speeds more than ``protocol.COMPARABLE_T1`` apart, are
    refused (``protocol.require_comparable``)."""
    import copy

    name = method if name is None else name
    _check_methods(other, [method, PLAIN])
    protocol.require_comparable(table["meta"], other["meta"])
    if name in table["meta"]["methods"]:
        raise ValueError(f"the table already has {name!r}")
    theirs = {p["id"]: p for p in other["prompts"]}
    missing = [p["id"] for p in table["prompts"] if p["id"] not in theirs]
    if missing:
        raise ValueError(f"the other table lacks {len(missing)} of this table's prompts, e.g. {missing[:3]}")
    out = copy.deepcopy(table)
    out["meta"]["methods"] = list(out["meta"]["methods"]) + [name]
    out["meta"].setdefault("added_from_other_runs", {})[name] = {"method": method, "date": other["meta"]["date"]}
    if method in other["meta"]["counters"]:
        out["meta"]["counters"][name] = other["meta"]["counters"][method]
    for p in out["prompts"]:
        q = theirs[p["id"]]
        p["seconds"][name] = q["seconds"][method] * p["seconds"][PLAIN] / q["seconds"][PLAIN]
        for key in ("tokens", "tau", "prefill_s", "steps", "emitted", "accepted_per_pos", "drafting_steps", "drafted"):
            if key in p and key in q:
                p[key][name] = q[key][method]
    return out


def features_of(table: dict) -> list:
    """Each prompt's features as ``RouterPolicy`` reads them (hidden as an array)."""
    return [{**p["features"], "hidden": np.asarray(p["features"]["hidden"], dtype=float)} for p in table["prompts"]]


def _check_methods(table: dict, names: Sequence[str]) -> None:
    have = set(table["meta"]["methods"])
    missing = [n for n in names if n not in have]
    if missing:
        raise ValueError(f"the table has no timings for {missing}; it has {sorted(have)}")


def rates(table: dict, names: Sequence[str]) -> tuple:
    """tokens [N, C] and seconds [N, C] of each named method on each prompt."""
    _check_methods(table, names)
    tok = np.array([[p["tokens"][n] for n in names] for p in table["prompts"]], dtype=float)
    sec = np.array([[p["seconds"][n] for n in names] for p in table["prompts"]], dtype=float)
    return tok, sec


def log_speedups(table: dict, candidates: Sequence[str] = CANDIDATES) -> np.ndarray:
    """[N, C]: log of each candidate's speedup over plain decoding on each prompt."""
    tok, sec = rates(table, list(candidates) + [PLAIN])
    rate = tok / sec
    return np.log(rate[:, :-1] / rate[:, -1:])


def fit(table: dict, candidates: Sequence[str] = CANDIDATES, n_components: int = 4, ridge: float = 1.0) -> RouterPolicy:
    """A :class:`RouterPolicy` fitted to a table's timings."""
    return RouterPolicy.fit(features_of(table), log_speedups(table, candidates), candidates,
                            n_components=n_components, ridge=ridge,
                            meta={"fitted_on": table["meta"]["split"], "machine": table["meta"]["machine"],
                                  "max_new_tokens": table["meta"]["max_new_tokens"], "date": table["meta"]["date"],
                                  "prompts": len(table["prompts"])})


def best_single(table: dict, candidates: Sequence[str] = CANDIDATES) -> str:
    """The candidate with the highest pooled speedup on this table."""
    tok, sec = rates(table, candidates)
    return list(candidates)[int(np.argmax(tok.sum(0) / sec.sum(0)))]


def oracle_choices(table: dict, candidates: Sequence[str] = CANDIDATES) -> list:
    """The fastest candidate of each prompt (after the fact)."""
    tok, sec = rates(table, candidates)
    return [list(candidates)[i] for i in np.argmax(tok / sec, axis=1)]


def choose(policy: Callable, table: dict) -> list:
    """``policy``'s choice for each prompt of the table (a RouterPolicy or any function of the
    features dict; it may also read ``features["category"]``)."""
    out = []
    for p, f in zip(table["prompts"], features_of(table)):
        out.append(policy({**f, "category": p["category"]}))
    return out


def _strata(table: dict) -> list:
    """Row indices of each category's prompts (the bootstrap resamples within each)."""
    cats = np.array([p["category"] for p in table["prompts"]])
    return [np.flatnonzero(cats == c) for c in dict.fromkeys(cats.tolist())]


def _pooled(tok, sec, idx_rows, cols) -> np.ndarray:
    """Pooled rate of per-prompt column choices: sum of chosen tokens / sum of chosen seconds, for
    each bootstrap row of prompt indices [B, N]."""
    t = tok[idx_rows, cols[idx_rows]]
    s = sec[idx_rows, cols[idx_rows]]
    return t.sum(-1) / s.sum(-1)


def evaluate(table: dict, choosers: dict, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0,
             picked: dict | None = None, candidates: Sequence[str] | None = None):
    """Pooled speedup over plain decoding of each chooser, and its regret to the oracle, with
    paired bootstrap intervals (prompts resampled within each category).

    choosers: name -> list of per-prompt method names (a method of the table; e.g. from
    :func:`choose`, ``[best] * N``, or ``["bandit"] * N`` for a method timed live). The oracle over
    ``CANDIDATES`` present in the table is added. Returns a DataFrame: chooser, speedup, lo, hi,
    regret, regret_lo, regret_hi, and the share of prompts where it picked the oracle's choice.
    picked: for a chooser timed live (its column is its own method, e.g. ``"router"``), the
    candidate it chose on each prompt; without it that chooser's oracle agreement is NaN (unknown),
    not 0. candidates: the methods the oracle chooses among (default: ``CANDIDATES`` present in
    the table; pass more when a chooser may pick a method the router never had).
    """
    import pandas as pd

    n = len(table["prompts"])
    methods = list(table["meta"]["methods"])
    cands = [c for c in (CANDIDATES if candidates is None else candidates) if c in methods]
    tok, sec = rates(table, methods)
    col = {m: i for i, m in enumerate(methods)}
    oracle = oracle_choices(table, cands)
    choosers = {**choosers, "oracle": oracle}
    picks = {}
    for name, ch in choosers.items():
        if len(ch) != n:
            raise ValueError(f"{name}: {len(ch)} choices for {n} prompts")
        unknown = sorted(set(ch) - set(methods))
        if unknown:
            raise ValueError(f"{name} chose {unknown}, which the table has no timings for")
        picks[name] = np.array([col[m] for m in ch])
    idx = stratified_indices(_strata(table), n_boot, np.random.default_rng(seed))
    everything = np.arange(n)[None]
    plain = np.full(n, col[PLAIN])
    base, base_b = _pooled(tok, sec, everything, plain)[0], _pooled(tok, sec, idx, plain)
    orc, orc_b = _pooled(tok, sec, everything, picks["oracle"])[0], _pooled(tok, sec, idx, picks["oracle"])
    tail = (1 - confidence) / 2
    rows = []
    for name, cols in picks.items():
        r, r_b = _pooled(tok, sec, everything, cols)[0], _pooled(tok, sec, idx, cols)
        s_lo, s_hi = np.quantile(r_b / base_b, [tail, 1 - tail])
        g_lo, g_hi = np.quantile(orc_b / r_b - 1, [tail, 1 - tail])
        chosen = (picked or {}).get(name)
        if chosen is not None:
            if len(chosen) != n:
                raise ValueError(f"picked[{name!r}]: {len(chosen)} choices for {n} prompts")
            agreement = float(np.mean([a == b for a, b in zip(chosen, oracle)]))
        elif all(m in cands for m in choosers[name]):
            agreement = float(np.mean(cols == picks["oracle"]))
        else:  # a live method's column: which candidate it ran is not in the table
            agreement = float("nan")
        rows.append({"chooser": name, "speedup": r / base, "lo": s_lo, "hi": s_hi, "regret": orc / r - 1,
                     "regret_lo": g_lo, "regret_hi": g_hi, "oracle_agreement": agreement})
    return pd.DataFrame(rows)


def compare_choosers(table: dict, a: Sequence[str], b: Sequence[str], n_boot: int = 2000, seed: int = 0):
    """Chooser A's pooled speed over chooser B's on the same prompts, with a paired interval:
    (ratio, lo, hi)."""
    methods = list(table["meta"]["methods"])
    tok, sec = rates(table, methods)
    ca = np.array([methods.index(m) for m in a])
    cb = np.array([methods.index(m) for m in b])
    idx = stratified_indices(_strata(table), n_boot, np.random.default_rng(seed))
    whole = np.arange(len(table["prompts"]))[None]
    ratio = _pooled(tok, sec, whole, ca)[0] / _pooled(tok, sec, whole, cb)[0]
    lo, hi = np.quantile(_pooled(tok, sec, idx, ca) / _pooled(tok, sec, idx, cb), [0.025, 0.975])
    return float(ratio), float(lo), float(hi)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdecode_ref.measure.routing",
                                description="Per-prompt timings of every drafter, a router fitted to them, and its "
                                            "regret to the oracle.")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="time every candidate on every prompt of a split")
    m.add_argument("--split", choices=SPLITS, default="benchmark")
    m.add_argument("--methods", default=None, help="comma-separated (default: the candidates; on the held-out "
                                                   "split also the live router and bandit)")
    m.add_argument("--per-category", type=int, default=None)
    m.add_argument("--max-new-tokens", type=int, default=48)
    m.add_argument("--dtype", choices=["fp32", "bf16"], default=None)
    m.add_argument("--out", default=None, help="default: data/measured/routing_<split>.json")
    f = sub.add_parser("fit", help="fit the router on a table and save it")
    f.add_argument("--train", default=None, help="default: the stored benchmark table")
    f.add_argument("--out", default=None, help="default: data/router.json (what load_proposer('router') uses)")
    e = sub.add_parser("evaluate", help="router, best single, bandit and oracle on the held-out table")
    e.add_argument("--train", default=None)
    e.add_argument("--test", default=None)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "measure":
        from ..models import load_model

        model, tok = load_model(dtype=args.dtype)
        methods = [x.strip() for x in args.methods.split(",")] if args.methods else \
            list(CANDIDATES) + list(MEASURED_ALSO) + (["router", "bandit"] if args.split == "heldout" else [])
        table = measure(model, tok, _workloads(args.split, args.per_category), methods,
                        max_new_tokens=args.max_new_tokens, split=args.split)
        out = Path(args.out) if args.out else table_path(args.split)
        out.write_text(json.dumps(table, indent=None, separators=(",", ":")))
        print(f"saved {out} ({len(table['prompts'])} prompts, {len(methods)} methods)")
        return 0
    from ..proposers.router import SHIPPED_POLICY

    train = load_table("benchmark", args.train)
    if args.command == "fit":
        policy = fit(train)
        out = Path(args.out) if args.out else SHIPPED_POLICY
        policy.to_json(out)
        print(f"saved {out}: candidates {policy.candidates}, fitted on {len(train['prompts'])} prompts")
        return 0
    test = load_table("heldout", args.test)
    policy = fit(train)
    choosers = {"router (offline)": choose(policy, test), f"best single ({best_single(train)})":
                [best_single(train)] * len(test["prompts"])}
    for live in ("router", "bandit"):
        if live in test["meta"]["methods"]:
            choosers[f"{live} (live)"] = [live] * len(test["prompts"])
    print(evaluate(test, choosers).round(3).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
