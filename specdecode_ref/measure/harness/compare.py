"""Comparing methods on the same prompts: interleaved runs, per-method tables, decode rates, and a
look inside one speculative step.

The notebooks used to carry their own copies of these helpers; they live here once, tested:

    run_interleaved   time several proposers (and plain decoding) on the same prompts, every
                      method once per prompt before the next prompt, so drift of a shared machine
                      hits all methods alike (``bench.run_benchmark`` does the same for named methods)
    method_stats      one method's SpecStats from a ``bench.run_benchmark`` table, merged over prompts
    method_table      one row per method: τ, acceptance, drafting cost, speedup over the reference
    decode_speedup    the decode-phase speedup of one method over another (``timing.decode_rate`` ratio)
    first_mismatch    index of the first token where two outputs differ
    probe_step        the draft of the first speculative step and the target's probabilities over it,
                      from one run of the engine itself (for experiments on a single tree)

Speedups are ratios of runs taken in the same interleaved loop; never compare them across runs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...metrics import SpecStats, merge_stats
from ...sampling import GREEDY, SamplingParams, logits_to_probs
from . import protocol
from .timing import decode_rate

PLAIN = "plain"


def first_mismatch(a, b) -> int | None:
    """Index of the first position where token lists ``a`` and ``b`` differ; None if they are equal.

    A list that is a strict prefix of the other differs at the shorter one's length.
    """
    a, b = list(a), list(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def decode_speedup(stats: SpecStats, reference: SpecStats) -> float:
    """Decode-phase speedup of ``stats`` over ``reference`` (usually plain decoding, same prompts):
    the ratio of ``timing.decode_rate``, the phase τ / (k·c + V(k)) predicts."""
    return decode_rate(stats) / decode_rate(reference)


def run_interleaved(model, prompts, methods: dict, max_new_tokens: int = 48, warmup: int = 1,
                    repeats: int = 1, **generate_kwargs) -> dict:
    """Run every method on every prompt, interleaved per prompt; return ``{name: [GenerationResult]}``.

    prompts: a list of 1-D id tensors (or ``{id: tensor}``; the order is kept). methods:
    ``{name: proposer}``, with ``None`` for plain decoding (include one to have a baseline).
    warmup: short untimed generations per method before the first timed one. repeats: timed rounds
    per prompt under ``measure.harness.protocol``: interleaved, the methods in reverse order on every other
    round, a method whose rounds disagree re-timed, and the run with the median wall time (the lower
    middle one for an even count) kept (its tokens are the same in every round; a drafter that learns
    across requests repeats from its state before the prompt, not from its own first answer). Extra keyword arguments go to ``generate`` (sampling,
    seed, ...).
    """
    from ...engine import generate

    if not methods:
        raise ValueError("no methods given")
    if not isinstance(repeats, int) or repeats < 1 or not isinstance(warmup, int) or warmup < 0:
        raise ValueError("repeats must be an int >= 1 and warmup an int >= 0")
    prompt_list = list(prompts.values()) if isinstance(prompts, dict) else list(prompts)
    if not prompt_list:
        raise ValueError("no prompts given")
    for proposer in methods.values():
        for _ in range(warmup):
            generate(model, prompt_list[0], proposer=proposer, max_new_tokens=min(8, max_new_tokens),
                     **generate_kwargs)
    results = {name: [] for name in methods}
    for ids in prompt_list:
        runs = {name: [] for name in methods}
        # A drafter that remembers earlier requests (suffix decoding) would draft a repeat of this
        # prompt from its own earlier answer: before each repeat it forgets the earlier repeats, so
        # every repeat starts from its history before the prompt (the last one stays in the stream).
        marks = {name: p.history_mark() for name, p in methods.items()
                 if repeats > 1 and getattr(p, "learns_across_requests", False)}

        def run(name, proposer, again):
            if again and name in marks:
                proposer.forget_since(marks[name])
            runs[name].append(generate(model, ids, proposer=proposer, max_new_tokens=max_new_tokens,
                                       **generate_kwargs))

        for rep in range(repeats):  # measure/harness/protocol.py: interleaved rounds, alternating order
            for name in protocol.order_of(methods, rep):
                run(name, methods[name], rep > 0)

        def kept(rs):
            return rs[protocol.kept_index([r.stats.wall_time_s for r in rs])]

        for name, rs in runs.items():  # a method whose rounds disagree is re-timed (protocol rule 3)
            while repeats >= 2 and protocol.wants_another_round([r.stats.wall_time_s for r in rs]):
                run(name, methods[name], True)
        while repeats >= 2:  # ... and so is one whose kept run lies far above the prompt's other methods
            again = [n for n in protocol.outliers({n: kept(rs).stats.wall_time_s for n, rs in runs.items()})
                     if len(runs[n]) < protocol.MAX_ROUNDS]
            if not again:
                break
            for name in again:
                run(name, methods[name], True)
        for name, rs in runs.items():
            results[name].append(kept(rs))
    return results


def method_stats(df, method: str, category: str | None = None, prompt_ids=None) -> SpecStats:
    """One method's SpecStats from a ``bench.run_benchmark`` table, merged over its prompts
    (optionally one category, or the given prompt ids)."""
    part = df[df["method"] == method]
    if category is not None:
        part = part[part["category"] == category]
    if prompt_ids is not None:
        part = part[part["prompt_id"].isin(list(prompt_ids))]
    if part.empty:
        raise ValueError(f"no rows for method {method!r}" + (f" in category {category!r}" if category else ""))
    stats = [s for s in part["stats"] if s is not None]
    if not stats:
        raise ValueError(f"method {method!r} has no SpecStats (a Hugging Face method?)")
    return merge_stats(stats)


def results_from_benchmark(df, methods=None, prompt_ids=None) -> dict:
    """``{method: [SpecStats per prompt]}`` from a ``bench.run_benchmark`` table, in prompt order,
    the shape ``method_table`` takes."""
    if prompt_ids is not None:
        df = df[df["prompt_id"].isin(list(prompt_ids))]
    methods = list(dict.fromkeys(df["method"])) if methods is None else list(methods)
    return {m: list(df[df["method"] == m]["stats"]) for m in methods}


def _stats_list(runs) -> list:
    return [r.stats if hasattr(r, "stats") else r for r in runs]


def method_table(results: dict, reference: str = PLAIN, t1_s: float | None = None):
    """One row per method of ``results`` (``{name: [GenerationResult or SpecStats]}`` over the same
    prompts, e.g. from ``run_interleaved`` or ``results_from_benchmark``), as a pandas DataFrame.

    Columns: prompts, tokens, τ, acceptance rate, drafted and accepted per step, draft ms per step, tokens/s
    (end to end, summed over prompts), speedup (tokens/s over the reference's), decode speedup
    (decode phase only, see ``decode_rate``); with ``t1_s`` (one target forward, seconds) also
    c per step = drafting time per step / T(1).
    """
    import pandas as pd

    if reference not in results:
        raise ValueError(f"the reference {reference!r} is not among the methods {list(results)}")
    merged = {name: merge_stats(_stats_list(runs)) for name, runs in results.items()}
    ref = merged[reference]
    rows = {}
    for name, s in merged.items():
        steps = max(s.steps, 1)
        row = {
            "prompts": len(results[name]), "tokens": s.new_tokens, "τ": s.tau,
            "acceptance rate": s.acceptance_rate if s.drafted else float("nan"),
            "drafted per step": s.drafted / steps, "accepted per step": s.accepted / steps,
            "draft ms per step": 1e3 * s.draft_time_s / steps,
            "tokens/s": s.tokens_per_s, "speedup": s.tokens_per_s / ref.tokens_per_s,
            "decode speedup": decode_speedup(s, ref),
        }
        if t1_s is not None:
            row["c per step"] = s.draft_time_s / steps / t1_s
        rows[name] = row
    return pd.DataFrame(rows).T.astype(float).astype({"prompts": int, "tokens": int})


class _Captured(Exception):
    """Raised inside the engine once the first speculative step's target forward has run."""


@dataclass
class StepProbe:
    """What ``probe_step`` saw: the context, its root token, the draft and the target's view of it."""

    context: list  # committed ids before the step: the prompt and the root token
    root: int  # the last committed token (the prefill's token), the root of a tree draft
    draft: object  # the proposer's Draft (tokens, probs, parents)
    logits: torch.Tensor  # [1 + len(draft), V] the verification forward's logits (row 0: the root)
    probs: torch.Tensor  # the same, processed by the probe's sampling parameters (float32)


def probe_step(model, proposer, prompt_ids, sampling: SamplingParams | None = None, seed: int = 0) -> StepProbe:
    """Run the engine on ``prompt_ids`` until the first speculative step has been scored, and return
    that step's draft and the target's probabilities over it, without verifying.

    It is the engine's own step: ``generate`` prefills the prompt, emits its first token (the root),
    calls the proposer exactly as in a request and builds the verification forward (a tree
    attention mask for a tree draft); the forward's logits are captured with a hook and the run
    stops there. ``probs`` are the logits processed with ``sampling`` (default greedy: one-hot),
    so the verifiers of ``verify.py`` can be run on them many times, e.g. to test a rule's
    output distribution. The root is the target's first token after the prompt (greedy by
    default; with a sampling ``generate`` draws it with ``seed``).
    """
    from ...engine import generate

    sampling = GREEDY if sampling is None else sampling
    seen = {}
    original_propose = proposer.propose

    def propose(state):
        draft = original_propose(state)
        if "draft" not in seen and len(draft) > 0:
            seen["draft"], seen["context"] = draft, list(state.token_list)
        return draft

    def hook(module, args, kwargs, output):
        if "draft" in seen and "logits" not in seen:
            seen["logits"] = output.logits[0].detach()
            raise _Captured

    shadowed = proposer.__dict__.get("propose")
    proposer.propose = propose
    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        generate(model, prompt_ids, proposer=proposer, max_new_tokens=proposer.k + 2, sampling=sampling, seed=seed)
    except _Captured:
        pass
    finally:
        handle.remove()
        if shadowed is None:
            del proposer.propose  # back to the class's method
        else:
            proposer.propose = shadowed
    if "logits" not in seen:
        raise RuntimeError("the engine finished before a non-empty draft was scored (EOS right after "
                           "the prompt, or the proposer drafted nothing)")
    logits = seen["logits"]
    return StepProbe(context=seen["context"], root=seen["context"][-1], draft=seen["draft"], logits=logits,
                     probs=logits_to_probs(logits.float(), sampling))
