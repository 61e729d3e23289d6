"""Our trained drafters served in vLLM: the same weights, the same prompts, both engines' counters.

A drafter trained here is only worth as much as the engine that serves it makes of it. This module
exports a drafter (``serving.export.export_drafter``), serves it with vLLM on this machine, one
request at a time, greedy and fp32, and decodes the same prompts with our engine and the same
weights. Per request it keeps both outputs (each equal to plain greedy decoding: drafts never
change a greedy output), both engines' counters, step by step, and both engines' drafts.

    drafts        verification steps that drafted (vLLM's ``num_drafts``)
    draft_tokens  tokens drafted                  (``num_draft_tokens``)
    accepted      drafted tokens kept             (``num_accepted_tokens``)
    mean acceptance length = 1 + accepted / drafts, acceptance rate = accepted / draft_tokens,
    per-position acceptance = accepted at draft position i / drafts (``num_accepted_tokens_per_pos``)

vLLM drafts k tokens at a request's last step whatever the budget and counts them; our engine cuts
a draft to what the step can still emit. vLLM's counters are read after every engine step
(``suffix_vllm.run_vllm_stream``, the same stepping job) and recounted within max_tokens, which is
what our engine counts (``suffix_vllm.recount``); "as reported" keeps vLLM's own figures.

Where the two differ, the drafts say why: ``drafts_differ`` counts the steps, while the two
sequences still agree, at which vLLM's draft is not ours, and ``first_step_differs`` the first step
whose (drafted, accepted) pair differs. A greedy draft is the argmax of the drafter's logits, so
two engines computing the same function can still part on a near-tie (different attention and
matrix-product code in fp32), and after that the contexts differ.

    python -m specdecode_ref.serving.served_drafters --drafters eagle3 medusa draft \\
        --per-category 2 --max-new-tokens 48 --out specdecode_ref/data/measured/served_drafters.json

"pard" (the parallel drafter) is served as vLLM's ``draft_model`` with ``parallel_drafting``: K − 1
copies of the export's ``pard_token`` after the committed tokens, K drafts from one forward.

The stored result (:func:`load_served`) lets notebooks 07 and 08 show the table without vLLM.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .suffix_vllm import (COUNTERS, SIDE_NAMES, SIDES, first_difference, load_stored, recount, run_vllm_stream,
                          steps_within)
from .suffix_vllm import UNTIMED
from .suffix_vllm import totals as _totals

DEFAULT_PATH = Path(__file__).resolve().parents[1] / "data" / "measured" / "served_drafters.json"
# vLLM's proposer class whose drafts are recorded (suffix_vllm._record_vllm_drafts): "eagle" is
# SpecDecodeBaseProposer, the base of EagleProposer and of DraftModelProposer (draft_model, and PARD:
# draft_model with parallel_drafting).
RECORD = {"draft": "eagle", "eagle": "eagle", "eagle3": "eagle", "medusa": "medusa", "pard": "eagle"}


def our_proposer(name: str, model, k: int, head=None):
    """Our proposer for the exported drafter ``name``, drafting as vLLM does: greedy chains of k
    tokens (Medusa: one token per head, the argmax over the full vocabulary, as the export; PARD:
    the argmax of each of k positions of one forward, over the full vocabulary).
    head: an EAGLE-3 head (FusedEagleHead or weights file) for "eagle3", the parallel drafter's
    weights file for "pard"; None: the shipped file."""
    if name == "draft":
        from ..proposers.draft_model import DraftModelProposer, load_draft_model

        return DraftModelProposer(load_draft_model(model), k=k)
    if name in ("eagle", "eagle3"):
        from ..proposers.eagle import EAGLE3_WEIGHTS, EagleProposer, load_eagle_head, load_eagle_weights

        if name == "eagle":
            return EagleProposer(model, load_eagle_head(model), k=k, draft_sampling="greedy")
        if head is None or not hasattr(head, "forward"):
            head = load_eagle_weights(model, EAGLE3_WEIGHTS if head is None else head)
        return EagleProposer(model, head, k=k, draft_sampling="greedy")
    if name == "medusa":
        from ..proposers.medusa import load_medusa_proposer

        return load_medusa_proposer(model, k=k, tree=False, reduced_vocab=False)
    if name == "pard":
        from ..proposers.parallel_draft import PARD_WEIGHTS, ParallelDraftProposer, load_parallel_draft

        draft = load_parallel_draft(model, PARD_WEIGHTS if head is None else head)
        return ParallelDraftProposer(draft, k=k, draft_vocab=None, draft_sampling="greedy")
    raise ValueError(f"no served comparison for {name!r}; choose from {sorted(RECORD)}")


def per_position(steps: list, k: int) -> dict:
    """Survival counts from per-step ``(drafted, accepted)`` pairs: ``drafts`` (steps that drafted),
    ``drafted[i]`` (steps whose draft reached position i) and ``accepted[i]`` (steps that kept
    position i), i < k, and ``rate[i]`` = accepted[i] / drafts, vLLM's per-position acceptance rate."""
    drafted, accepted = [0] * k, [0] * k
    drafts = 0
    for d, a in steps:
        if d <= 0:
            continue
        drafts += 1
        for i in range(min(d, k)):
            drafted[i] += 1
        for i in range(min(a, k)):
            accepted[i] += 1
    rate = [x / drafts if drafts else float("nan") for x in accepted]
    return {"drafts": drafts, "drafted": drafted, "accepted": accepted, "rate": rate}


def compare_served(model, tokenizer, name: str, messages: list, *, k: int = 3, max_new_tokens: int = 48,
                   head=None, export_dir=None, model_dir=None, timeout: float = 1800) -> dict:
    """Export drafter ``name``, serve it in vLLM and decode the same ``messages`` with ours.

    messages: a list of chat messages (a string or a list of {role, content}) or of
    ``{"id", "messages", "category"}`` items. model: the embedded model in fp32. k: draft tokens
    per step (Medusa: its number of heads; PARD: at most its trained positions). head: for "eagle3"
    an EAGLE-3 head or weights file, for "pard" the parallel drafter's weights file (None: shipped).
    Returns ``{"meta", "rows", "totals", "per_position"}`` (JSON-ready; rows as :mod:`suffix_vllm`'s,
    so its ``summarize`` and ``request_table`` apply).
    """
    import tempfile

    from .. import chat_ids
    from ..engine import autoregressive_generate, generate
    from ..models import EMBEDDED, cache_dir
    from .export import export_drafter

    items = [m if isinstance(m, dict) and "messages" in m else {"messages": m} for m in messages]
    if not items:
        raise ValueError("messages is empty")
    prompts = [chat_ids(tokenizer, it["messages"]) for it in items]
    model_dir = cache_dir() / EMBEDDED if model_dir is None else model_dir
    with tempfile.TemporaryDirectory(prefix=f"specdecode-{name}-") as tmp:
        out = Path(export_dir) if export_dir is not None else Path(tmp) / name
        extra = {}
        if head is not None and name in ("eagle3", "pard"):
            extra = {"head" if name == "eagle3" else "path": head}
        out, config = export_drafter(name, out, k=None if name == "medusa" else k, target=model, **extra)
        k = config["num_speculative_tokens"]
        t0 = time.perf_counter()
        served = run_vllm_stream(model_dir, prompts, max_new_tokens, config, record=RECORD[name], timeout=timeout)
        vllm_s = time.perf_counter() - t0

    P = our_proposer(name, model, k, head)
    ours_drafts: list = []
    propose = P.propose

    def recording_propose(state):
        draft = propose(state)
        ours_drafts.append([int(t) for t in draft.tokens.tolist()])
        return draft

    P.propose = recording_propose  # the same object; only its drafts are written down
    rows, all_steps = [], {"ours": [], "vllm_within": []}
    t0 = time.perf_counter()
    try:
        for i, (it, ids, theirs) in enumerate(zip(items, prompts, served["requests"])):
            ours_drafts.clear()
            res = generate(model, ids, proposer=P, max_new_tokens=max_new_tokens)
            plain = autoregressive_generate(model, ids, max_new_tokens=max_new_tokens).tokens.tolist()
            st, ours_tokens = res.stats, res.tokens.tolist()
            counts = recount(theirs["steps"], max_new_tokens)
            counts["ours"] = {"drafts": st.drafting_steps, "draft_tokens": st.drafted, "accepted": st.accepted}
            ours_steps = [(int(d), int(a)) for d, a in zip(st.draft_lengths, st.accepted_lengths) if d > 0]
            vllm_steps = [s for s in steps_within(theirs["steps"], max_new_tokens) if s[0] > 0]
            differs = first_difference(ours_steps, vllm_steps)
            # Drafts side by side while both sequences agree (before the first differing step).
            agree = len(ours_steps) if differs is None else differs
            theirs_d = theirs.get("drafts", [])
            compared = min(agree, len(ours_drafts), len(theirs_d))
            differ = [j for j in range(compared) if ours_drafts[j][:ours_steps[j][0]] != theirs_d[j][:ours_steps[j][0]]]
            all_steps["ours"] += ours_steps
            all_steps["vllm_within"] += vllm_steps
            row = {"request": i, "family": it.get("category"), "id": it.get("id"), "prompt_tokens": int(ids.numel()),
                   "new_tokens_ours": len(ours_tokens), "new_tokens_vllm": len(theirs["tokens"]),
                   "same_output": ours_tokens == theirs["tokens"], "ours_plain": ours_tokens == plain,
                   "vllm_plain": theirs["tokens"] == plain}
            for side in SIDES:
                for c in COUNTERS:
                    row[f"{side}_{c}"] = int(counts[side][c])
            row.update(vllm_tail_cached=0, first_step_differs=differs, drafts_compared=compared,
                       drafts_differ=len(differ),
                       draft_differences=[[j, ours_drafts[j], theirs_d[j]] for j in differ],
                       ours_steps=[list(s) for s in ours_steps], vllm_steps=theirs["steps"],
                       vllm_tokens=theirs["tokens"])
            rows.append(row)
    finally:
        del P.propose
    ours_s = time.perf_counter() - t0
    tot = _totals(rows)
    tot.pop("vllm_tail_cached", None)
    pos = {side: per_position(steps, k) for side, steps in all_steps.items()}
    meta = {"drafter": name, "k": k, "dtype": "fp32", "sampling": "greedy", "max_new_tokens": int(max_new_tokens),
            "requests": len(rows), "speculative_config": {kk: v for kk, v in config.items() if kk != "model"},
            "ours": repr(P), "vllm_version": served.get("vllm_version"),
            "seconds": {"vllm_job": round(vllm_s, 1), "vllm_startup": round(served["startup_s"], 1),
                        "vllm_stream": round(served["total_s"], 1), "ours_with_plain": round(ours_s, 1)}}
    return {"meta": meta, "rows": rows, "totals": tot, "per_position": pos}


def summary_table(results: dict):
    """One row per (drafter, side): drafts, draft tokens, accepted, mean acceptance length,
    acceptance rate, the per-position rates, and how many requests had equal outputs.
    results: ``{drafter: compare_served(...)}`` or what :func:`load_served` returns."""
    import pandas as pd

    out = []
    for name, r in results.get("drafters", results).items():
        t = r["totals"]
        for side in SIDES:
            line = {"drafter": name, "side": SIDE_NAMES[side], **{c: t[side][c] for c in COUNTERS},
                    **{kk: t[side][kk] for kk in ("mean_acceptance_length", "acceptance_rate")}}
            if side in r["per_position"]:
                line["per_position"] = [round(x, 3) for x in r["per_position"][side]["rate"]]
            line["same_output"] = f"{t['same_output']}/{t['requests']}"
            out.append(line)
    return pd.DataFrame(out)


def mal_ratio(result: dict) -> float:
    """vLLM's mean acceptance length (within max_tokens) over ours: 1.0 is the same acceptance."""
    t = result["totals"]
    return t["vllm_within"]["mean_acceptance_length"] / t["ours"]["mean_acceptance_length"]


def load_served(path=None) -> dict:
    """The stored comparison (default ``data/measured/served_drafters.json``): ``{"meta",
    "drafters": {name: {"meta", "rows", "totals", "per_position"}}}``. No vLLM needed."""
    return load_stored(DEFAULT_PATH if path is None else path, "specdecode_ref.serving.served_drafters")


def main(argv=None) -> dict:
    import argparse
    import datetime
    import shlex

    from ..measure.harness.protocol import untimed

    parser = argparse.ArgumentParser(prog="python -m specdecode_ref.serving.served_drafters",
                                     description="Our trained drafters served in vLLM beside our engine.")
    parser.add_argument("--drafters", nargs="+", default=["eagle3", "medusa", "draft"], choices=sorted(RECORD))
    parser.add_argument("--per-category", type=int, default=2, help="benchmark prompts per category")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--k", type=int, default=3,
                        help="draft tokens per step (Medusa: its heads; PARD: at most its trained positions)")
    parser.add_argument("--eagle3", default=None, help="EAGLE-3 weights file (default: the shipped one)")
    parser.add_argument("--pard", default=None, help="parallel drafter weights file (default: the shipped one)")
    parser.add_argument("--out", default=str(DEFAULT_PATH))
    args = parser.parse_args(argv)

    import torch

    from ..models import load_model
    from ..measure.harness.claims import cpu_name
    from ..measure.harness.workloads import load_workloads

    t0 = time.perf_counter()
    model, tok = load_model(dtype="fp32", device="cpu")
    messages = [{"category": c, "id": p["id"], "messages": p["messages"]}
                for c, ps in load_workloads(None, per_category=args.per_category).items() for p in ps]
    results = {}
    for name in args.drafters:
        print(f"{name}: exporting, serving in vLLM, decoding with ours ...", flush=True)
        results[name] = compare_served(model, tok, name, messages, k=args.k, max_new_tokens=args.max_new_tokens,
                                       head={"eagle3": args.eagle3, "pard": args.pard}.get(name))
    meta = {"cpu": cpu_name(), "torch": torch.__version__, "date": datetime.date.today().isoformat(),
            "per_category": args.per_category, "prompts": len(messages), "max_new_tokens": args.max_new_tokens,
            "command": "python -m specdecode_ref.serving.served_drafters " + " ".join(
                shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
            "seconds": round(time.perf_counter() - t0, 1), **untimed(UNTIMED)}
    stored = {"meta": meta, "drafters": results}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(stored, f, indent=1)
        f.write("\n")
    print(summary_table(stored).to_string(index=False))
    print(f"written to {out} in {meta['seconds']} s")
    return stored


if __name__ == "__main__":
    main()
