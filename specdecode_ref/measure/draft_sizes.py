"""What each shipped drafter does at each draft size, measured once on the benchmark prompts: the
table ``load_proposer`` sizes drafts from (``sizing.size_for``, with the cost curve of the machine
it runs on).

Why a table and not a rule of thumb: the best size is tau(s) / step(s), and the two halves live in
different places. tau(s), the expected tokens per decode step, belongs to the drafter and the text
(measured here, greedy, so it is the same on every machine up to rounding). step(s) belongs to the
machine: the target's forward scoring the draft, T(n), is measured where the drafter runs (the
cached cost curve); the drafter's own time and the engine's bookkeeping per step are measured here,
in seconds of this run, and scaled to another machine by the ratio of the two machines' one-token
forward, T(1) there over T(1) here.

Per drafter and size s, the table keeps
    tau        tokens per decode step (steps that drafted nothing emit the target's one token)
    widths     {n: share of decode steps whose verify scored n positions} (a chain of k: k + 1;
               prompt lookup and suffix decoding draft only when they find a match, and then
               min(L, s) tokens)
    draft_s    the drafter's seconds per decode step
    overhead_s the engine's seconds per decode step outside the target and the drafter

How the sizes are covered:
* chains (draft model, early exit, EAGLE's chain, the heads' chains) run once at their longest
  size: a chain drafted greedily at k' < k is the first k' tokens of the k-token draft, so the
  per-position survivals of that run give tau at every shorter k (``serving.advisor.AcceptanceProfile``).
  That is exact when acceptance does not depend on where a step starts; at k' a step that keeps all
  k' drafts starts the next one inside a run of agreements, which the k-run's steps never do, so
  regular runs make the estimate a little high and bursty ones a little low (the held-out check
  times the chosen sizes themselves). The drafter's time is charged per drafted token, with no
  fixed part per step, which undercharges a short chain a little;
* a parallel drafter (PARD) drafts every position in one forward: its time is charged per drafting
  step, whatever k;
* lookups (n-gram, suffix) run at their longest size; a shorter one drafts min(L, k) of the same
  matches (``AcceptanceProfile.draft_lengths``);
* trees run at every node budget in ``TREE_BUDGETS``: a smaller tree is not a prefix of a larger
  one, so each is measured.

    python -m specdecode_ref.measure.draft_sizes                     # the table: about 17 minutes on the 2-core course CPU
    python -m specdecode_ref.measure.draft_sizes check --split heldout  # chosen sizes vs plain, unseen prompts
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

from .harness import protocol

#: name -> (how its sizes are covered, the sizes it is run at)
CHAINS = {"draft": 8, "draft-fullvocab": 4, "early-exit": 8, "eagle": 8, "eagle3": 8, "medusa-chain": 3,
          "hydra-chain": 3}
PARALLEL = {"pard": 4}  # the trained positions: one forward drafts at most that many (3 masks + 1)
LOOKUPS = {"ngram": 8, "suffix": 24}
TREE_BUDGETS = (1, 2, 3, 4, 6, 8, 16)
TREES = ("medusa", "hydra", "eagle-tree", "pard-tree")
#: sizes a lookup is offered at (a longer one is asked of it only when a match is that long)
LOOKUP_SIZES = {"ngram": tuple(range(1, 9)), "suffix": (1, 2, 3, 4, 6, 8, 12, 16, 24)}

TABLE = Path(__file__).resolve().parent.parent / "data" / "measured" / "draft_sizes.json"


def _run_names() -> list:
    runs = ["plain"]
    runs += [f"{n}@{k}" for n, k in {**CHAINS, **PARALLEL, **LOOKUPS}.items()]
    runs += [f"{n}@{b}" for n in TREES for b in TREE_BUDGETS]
    return runs


def _entry(tau: float, widths: dict, draft_s: float, overhead_s: float) -> dict:
    return {"tau": float(tau), "widths": {str(int(n)): float(w) for n, w in sorted(widths.items()) if w > 0},
            "draft_s": float(draft_s), "overhead_s": float(overhead_s)}


def _decode_t1(stats) -> float:
    """Plain decoding's seconds per decode step in a run (its T(1), prefill left out)."""
    return (stats.target_time_s - stats.prefill_time_s) / stats.steps


def _per_step(stats) -> tuple:
    """(drafter seconds, engine seconds outside target and drafter) per decode step of pooled stats."""
    steps = max(stats.steps, 1)
    outside = stats.wall_time_s - stats.target_time_s - stats.draft_time_s
    return stats.draft_time_s / steps, max(0.0, outside) / steps


def derived_sizes(stats, sizes: Sequence[int], parallel: bool = False) -> dict:
    """{size: entry} for a chain or lookup drafter run once at its longest size (``stats`` pooled).
    tau(s) = 1 + f (s_0 + ... + s_{s-1}); widths from the draft lengths min(L, s); the drafter's time
    per drafted token (per drafting step when ``parallel``)."""
    from ..serving.advisor import AcceptanceProfile

    profile = AcceptanceProfile.from_stats(stats)
    f = profile.drafting_share
    overhead = _per_step(stats)[1]
    per_token = stats.draft_time_s / max(stats.drafted, 1)
    per_drafting_step = stats.draft_time_s / max(stats.drafting_steps, 1)
    out = {}
    for s in sizes:
        lengths, weights = profile.draft_lengths(s)
        widths = {1: 1.0 - f}
        for m, w in zip(lengths, weights):
            widths[int(m) + 1] = widths.get(int(m) + 1, 0.0) + f * float(w)
        mean_len = float((lengths * weights).sum())
        draft_s = f * per_drafting_step if parallel else f * mean_len * per_token
        out[str(s)] = _entry(profile.tokens_per_decode_step(s), widths, draft_s, overhead)
    return out


def measured_size(stats) -> dict:
    """The entry of a drafter run at the size it is used at (trees): everything as measured."""
    draft_s, overhead = _per_step(stats)
    steps = max(stats.steps, 1)
    widths: dict = {}
    for n in stats.draft_lengths:
        widths[int(n) + 1] = widths.get(int(n) + 1, 0.0) + 1.0 / steps
    widths[1] = widths.get(1, 0.0) + max(0.0, 1.0 - sum(widths.values()))
    return _entry(stats.emitted / steps, widths, draft_s, overhead)


def measure(model, tokenizer, per_category: int = 1, max_new_tokens: int = 48, repeats: int = 2,
            progress: bool = True) -> dict:
    """Run every drafter at the sizes above on the benchmark prompts (greedy, methods interleaved per
    prompt in alternating order, ``repeats`` rounds, the median round kept) and build the table."""
    from tqdm.auto import tqdm

    from ..metrics import merge_stats
    from ..models import chat_ids
    from ..proposers import load_proposer
    from ..sizing import SIZING_NS, machine_cost_curve
    from .harness.claims import machine_line
    from .harness.compare import run_interleaved
    from .harness.timing import sample_load
    from .harness.workloads import load_workloads

    load = sample_load()
    prompts = {item["id"]: chat_ids(tokenizer, item["messages"])
               for items in load_workloads(per_category=per_category).values() for item in items}
    methods = {}
    for spec in _run_names():
        name, _, k = spec.partition("@")
        methods[spec] = None if name == "plain" else load_proposer(name, model, k=int(k))
    pooled = {m: [] for m in methods}
    for pid, ids in tqdm(prompts.items(), desc="draft sizes", unit="prompt", disable=not progress):
        runs = run_interleaved(model, {pid: ids}, methods, max_new_tokens=max_new_tokens, warmup=0,
                               repeats=repeats)
        for m, rs in runs.items():
            pooled[m].extend(r.stats for r in rs)
    stats = {m: merge_stats(v) for m, v in pooled.items()}
    plain = stats["plain"]
    t1 = _decode_t1(plain)
    drafters = {}
    for name, k in {**CHAINS, **PARALLEL}.items():
        drafters[name] = {"kind": "chain", "sizes": derived_sizes(stats[f"{name}@{k}"], range(1, k + 1),
                                                                  parallel=name in PARALLEL)}
    for name, k in LOOKUPS.items():
        drafters[name] = {"kind": "lookup", "sizes": derived_sizes(stats[f"{name}@{k}"], LOOKUP_SIZES[name])}
    for name in TREES:
        drafters[name] = {"kind": "tree", "sizes": {str(b): measured_size(stats[f"{name}@{b}"]) for b in TREE_BUDGETS}}
    return {"meta": {"machine": machine_line(model), "split": "benchmark", "per_category": per_category,
                     "prompts": list(prompts), "max_new_tokens": max_new_tokens,
                     **protocol.record(load, t1, repeats), "plain_overhead_s": _per_step(plain)[1],
                     # this machine's T(1) on its sizing curve: the reference another machine's curve is scaled by
                     "curve_t1_s": machine_cost_curve(model, ns=SIZING_NS).cost(1)},
            "drafters": drafters}


def check(model, tokenizer, workloads: dict, split: str, max_new_tokens: int = 48, repeats: int = 2,
          names: Sequence[str] | None = None, progress: bool = True) -> dict:
    """Time every drafter at the size ``load_proposer`` chooses here, and at its old fixed size
    where that differs, against plain decoding on ``workloads`` (prompts the table was not measured
    on), and set each beside its prediction (``sizing.size_for``).

    Returns per method: the size, predicted and measured decode-phase speedup over plain decoding
    (the prediction models the decode phase; the prefill is the same for every method), its paired
    bootstrap interval over prompts, the end-to-end speedup and interval, and the error
    measured / predicted - 1 (its sign says which way the model errs); for an old fixed size,
    ``chosen_over_fixed``: the chosen size's decode speed over it, paired by prompt, with its interval.
    """
    from ..proposers import StandAside, default_k, load_proposer
    from ..sizing import machine_draft_size, stored_draft_sizes
    from .harness import bench
    from .harness.claims import machine_line
    from ..metrics import merge_stats
    from .harness.intervals import OVERALL, bootstrap_summary
    from .harness.timing import sample_load

    table = stored_draft_sizes()
    names = list(names or table["drafters"])
    load = sample_load()
    methods, predicted, sizes = ["plain"], {}, {}
    for name in names:
        choice = machine_draft_size(name, model, table)
        p = load_proposer(name, model)
        size = 0 if isinstance(p, StandAside) else p.k
        methods.append(name)
        predicted[name], sizes[name] = choice.speedup, size
        old = default_k(name)  # the fixed size load_proposer drafted with before it sized drafts
        if old is not None and old != size:
            row = next((r for r in choice.table if r.size == old), None)
            methods.append(f"{name}@{old}")
            sizes[f"{name}@{old}"] = old
            predicted[f"{name}@{old}"] = None if row is None else row.tokens_per_s / choice.plain_tokens_per_s
    df = bench.run_benchmark(model, tokenizer, methods, workloads, max_new_tokens=max_new_tokens, repeats=repeats,
                             progress=progress)
    wrong = sorted(set(df[(df.identical == False) & (df.method != "plain")].method))  # noqa: E712
    if wrong:
        raise AssertionError(f"greedy output differs from plain decoding for {wrong}")
    decode = df.assign(seconds=df.seconds - df.prefill_s)
    both = {"decode": bootstrap_summary(decode), "end_to_end": bootstrap_summary(df)}
    out = {}
    for m in methods[1:]:
        row = {key: s[(s.category == OVERALL) & (s.method == m)].iloc[0] for key, s in both.items()}
        pred = predicted[m]
        out[m] = {"size": sizes[m], "predicted": pred, "tau": float(row["decode"].tau),
                  "decode": [float(row["decode"].speedup), float(row["decode"].speedup_lo), float(row["decode"].speedup_hi)],
                  "end_to_end": [float(row["end_to_end"].speedup), float(row["end_to_end"].speedup_lo),
                                 float(row["end_to_end"].speedup_hi)],
                  "error": None if pred is None else float(row["decode"].speedup) / pred - 1.0}
        name, _, fixed = m.partition("@")
        if fixed:  # the chosen size against the old fixed one, paired by prompt
            pair = bootstrap_summary(decode[decode.method.isin([name, m])], reference=m)
            r = pair[(pair.category == OVERALL) & (pair.method == name)].iloc[0]
            out[m]["chosen_over_fixed"] = [float(r.speedup), float(r.speedup_lo), float(r.speedup_hi)]
    plain = merge_stats(df[df.method == "plain"].stats)
    t1 = _decode_t1(plain)
    return {"meta": {"machine": machine_line(model), "split": split, "prompts": int(df.prompt_id.nunique()),
                     "max_new_tokens": max_new_tokens, **protocol.record(load, t1, repeats),
                     "intervals": "paired bootstrap over prompts, stratified by category"},
            "methods": out}


def load_check(split: str = "heldout") -> dict:
    """The stored result of ``check`` (``data/measured/draft_sizes_check_<split>.json``)."""
    p = TABLE.with_name(f"draft_sizes_check_{split}.json")
    if not p.exists():
        raise FileNotFoundError(f"{p} is missing: run `python -m specdecode_ref.measure.draft_sizes check --split {split}`")
    return json.loads(p.read_text())


def _size_words(name: str, size: int) -> str:
    from .harness.claims import plural

    if size == 0:
        return "standing aside (drafting nothing)"
    if name in LOOKUPS:  # a lookup drafts what follows its match, so its size is a cap, not a length
        return f"at up to {plural(size, 'drafted token')} per step"
    return "at " + (plural(size, "node") if name in TREES else f"{plural(size, 'token')} per step")


def describe_check(check: dict, name: str) -> str:
    """A sentence on drafter ``name`` in a stored check: its decode speed over plain decoding at the
    size chosen there, with interval, beside its prediction; and, when the old fixed size differs,
    that size's speed and the chosen size's speed over it, paired by prompt, with the word its
    interval supports."""
    from .harness.claims import interval_bounds, times, verdict_of

    rows = check["methods"]
    if name not in rows:
        raise KeyError(f"the check holds no {name!r}; it has {sorted(rows)}")
    r = rows[name]
    d = r["decode"]
    text = (f"`{name}` {_size_words(name, r['size'])} ran at {times(d[0])} plain decoding's decode speed "
            f"(95 % interval {interval_bounds(d[1], d[2])}×; predicted {times(r['predicted'])})")
    fixed = next((m for m in rows if m.startswith(f"{name}@")), None)
    if fixed is None:
        return text + "."
    f, (ratio, lo, hi) = rows[fixed], rows[fixed]["chosen_over_fixed"]
    word = {"better": "faster than", "worse": "slower than", "level": "level with"}[verdict_of(lo, hi)]
    chosen = "the chosen size" if r["size"] else "standing aside"
    return (text + f", against {times(f['decode'][0])} ({interval_bounds(f['decode'][1], f['decode'][2])}×) "
            f"{_size_words(name, f['size'])}, the old fixed size: {chosen} is {word} it, {times(ratio)} "
            f"(95 % interval {interval_bounds(lo, hi)}×, paired by prompt).")


def resolution_words(check: dict, names: Sequence[str]) -> str:
    """What a stored check's prompts can resolve: half the width of the widest interval that
    :func:`describe_check` prints for ``names`` (each chosen size, the old fixed size, and the paired
    ratio between them), so that a notebook says how fine a difference its stored figures can tell apart,
    rather than asserting that they are enough."""
    from .harness.claims import pct

    rows = check["methods"]
    spans = []
    for n in names:  # every interval describe_check prints for these drafters
        spans.append(rows[n]["decode"][1:3])
        fixed = next((m for m in rows if m.startswith(f"{n}@")), None)
        if fixed is not None:
            spans += [rows[fixed]["decode"][1:3], rows[fixed]["chosen_over_fixed"][1:3]]
    half = max((hi - lo) / 2 for lo, hi in spans)
    return (f"Its {check['meta']['prompts']} prompts pin the figures above to about ±{pct(half)} (half the widest "
            "interval printed): a difference smaller than that is beyond this check, and far beyond a live run on a "
            "few prompts.")


def load_table(path=None) -> dict:
    p = Path(path) if path is not None else TABLE
    return json.loads(p.read_text())


def main(argv: Sequence[str] | None = None) -> int:
    from ..models import load_model
    from .harness.timing import start_timed_cli
    from .harness.workloads import load_heldout, load_workloads

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="?", choices=("measure", "check"), default="measure",
                    help="measure: the size table; check: the chosen sizes against plain decoding on unseen prompts")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--split", choices=("heldout", "benchmark"), default="heldout",
                    help="check: held-out prompts, or the benchmark prompts after the ones the table measured")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--names", default=None,
                    help="check: only these drafters (comma-separated); their rows replace those in the stored check")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    start_timed_cli()
    model, tok = load_model()
    if args.what == "measure":
        result = measure(model, tok, per_category=args.per_category, max_new_tokens=args.max_new_tokens,
                         repeats=args.repeats)
        out = Path(args.out or TABLE)
    else:
        if args.split == "heldout":
            workloads = load_heldout(per_category=args.per_category)
        else:  # the prompts after those measure() used
            used = load_table()["meta"]["per_category"]
            workloads = {c: items[used:used + args.per_category]
                         for c, items in load_workloads(per_category=used + args.per_category).items()}
        names = None if args.names is None else [n.strip() for n in args.names.split(",") if n.strip()]
        result = check(model, tok, workloads, args.split, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                       names=names)
        out = Path(args.out or TABLE.with_name(f"draft_sizes_check_{args.split}.json"))
        if names and out.exists():  # re-timed drafters replace their rows; the run that timed them is recorded
            stored = json.loads(out.read_text())
            stored["methods"] = {m: r for m, r in stored["methods"].items() if m.split("@")[0] not in names}
            stored["methods"].update(result["methods"])
            stored.setdefault("retimed", []).append({"drafters": names, **result["meta"]})
            result = stored
        for m, r in result["methods"].items():
            pred = "  n/a" if r["predicted"] is None else f"{r['predicted']:.2f}"
            err = "" if r["error"] is None else f"{r['error']:+.1%}"
            print(f"{m:18s} size {r['size']:2d}  predicted {pred}  decode {r['decode'][0]:.2f} "
                  f"[{r['decode'][1]:.2f}, {r['decode'][2]:.2f}]  end-to-end {r['end_to_end'][0]:.2f} "
                  f"[{r['end_to_end'][1]:.2f}, {r['end_to_end'][2]:.2f}]  error {err}")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
