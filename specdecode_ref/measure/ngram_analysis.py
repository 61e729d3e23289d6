"""Looking inside n-gram (prompt lookup) drafting: where drafts come from, and offline ablations.

Under greedy decoding a model-free proposer such as :class:`~specdecode_ref.proposers.NgramProposer`
cannot change *what* is generated, only how many target forwards it takes. So once the plain
greedy continuation of a prompt is known, every step of a speculative run can be replayed without
the model: draft from the committed context with ``proposer.lookup``, accept the longest prefix that
equals the continuation, emit one more token (recovered or bonus), repeat. :func:`replay_greedy`
follows the engine's step rule (``replay.chain_steps``: the same draft-length limit, the same SpecStats), which makes
ablations over k, min_n, max_n, ``occurrence`` and ``k_per_matched_token`` cost milliseconds instead
of minutes (:func:`run_ablation`; :func:`steps_frame` lists the replayed steps for group-bys). The replay is exact when the speculative run reproduces the continuation
token for token (fp32); in bf16 a near-tie can flip a token, and the replay then describes a run
that produced the plain text.

:func:`find_match` is the naive scan (O(context length x max_n) per step) that answers "which
earlier occurrence does the proposer copy from?". ``NgramProposer`` answers the same question from
an incrementally updated dictionary; the scan is kept here for teaching and to label each emitted
token with the context position it was copied from (``Replay.sources``).

Speed is modelled from a measured cost curve: a step that drafts n tokens costs V(n) = T(n+1)/T(1)
(from ``bench.measure_cost_curve`` via ``analysis.fit_cost_curve`` or
``analysis.verify_cost_from_curve``) plus the proposer's own time; a plain step costs 1.
Notebook 04 uses all of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from ..analysis import as_verify_cost
from ..engine import ACCEPTED, BONUS, RECOVERED, TARGET
from ..metrics import SpecStats
from ..proposers.base import DecodeState
from ..sampling import GREEDY
from .replay import chain_steps, leading_matches, step_cost
from .harness.workloads import INPUT_GROUNDED

GROUNDED, OPEN = "input-grounded", "open-ended"


@dataclass(frozen=True)
class Match:
    """The earlier occurrence of the context's suffix that a draft is copied from.

    ``tokens[start : end + 1]`` equals the last ``n`` tokens of the context; the draft copies the
    tokens from ``end + 1`` on. ``period = len(tokens) - 1 - end`` is the distance between the
    occurrence and the suffix: past the end of the context the copy repeats with that period.
    """

    n: int
    start: int
    end: int
    period: int

    def source(self, j: int) -> int:
        """Context index of the token copied as draft position ``j`` (0-based)."""
        return self.end + 1 + (j % self.period)


def find_match(tokens: Sequence[int], min_n: int = 1, max_n: int = 4, occurrence: str = "recent") -> Match | None:
    """The occurrence ``NgramProposer(min_n=..., max_n=..., occurrence=...)`` copies from, by brute force.

    Tries suffix lengths n = max_n down to min_n; for the first n whose suffix occurred earlier
    (an occurrence that ends before the last token, so it has a follower) returns the most
    recent ("recent") or the earliest ("first") such occurrence; None when nothing matches.
    Cost: O(len(tokens) * max_n) per call, the scan the proposer's index avoids.
    """
    if occurrence not in ("recent", "first"):
        raise ValueError(f"occurrence must be 'recent' or 'first', got {occurrence!r}")
    if not isinstance(min_n, int) or not isinstance(max_n, int) or min_n < 1 or max_n < min_n:
        raise ValueError(f"need integers 1 <= min_n <= max_n, got min_n={min_n!r}, max_n={max_n!r}")
    toks = list(tokens)
    length = len(toks)
    for n in range(min(max_n, length), min_n - 1, -1):
        suffix = toks[length - n:]
        ends = range(length - 2, n - 2, -1) if occurrence == "recent" else range(n - 1, length - 1)
        for end in ends:
            if toks[end - n + 1: end + 1] == suffix:
                return Match(n=n, start=end - n + 1, end=end, period=length - 1 - end)
    return None


@dataclass(frozen=True)
class ReplayStep:
    """One replayed verification step."""

    generated: int  # new tokens committed before the step (the prefill's token included)
    drafted: int  # draft length after the engine's budget limit (0: a plain step)
    accepted: int  # leading draft tokens equal to the greedy continuation
    emitted: int  # tokens the step commits (accepted + one target token, fewer at EOS)
    match: Match | None  # where the draft was copied from (None: no draft)


@dataclass
class Replay:
    """A greedy speculative run rebuilt from the plain continuation (see :func:`replay_greedy`)."""

    prompt_len: int
    tokens: list  # the new tokens (the continuation)
    stats: SpecStats
    steps: list  # ReplayStep per verification step
    token_kinds: list  # engine.TARGET / ACCEPTED / RECOVERED / BONUS per new token
    sources: list  # per new token: context index it was copied from (accepted drafts), else -1
    draft_time_s: float = 0.0  # time spent in proposer.lookup

    def cost(self, verify_cost: float | Callable[[int], float] = 1.0, draft_cost: float = 0.0) -> float:
        """Decode cost in units of one plain step T(1) (prefill excluded).

        verify_cost: V(n) = T(n+1)/T(1) for a step that drafts n tokens, a number (the same for
        every n >= 1) or a function of n (``analysis.verify_cost_from_curve``); a plain step costs 1.
        draft_cost: the proposer's cost per step (a lookup), also in units of T(1).
        """
        v = as_verify_cost(verify_cost)
        return sum(step_cost(s.drafted, v, c_step=draft_cost) for s in self.steps)

    def modelled_speedup(self, verify_cost: float | Callable[[int], float] = 1.0, draft_cost: float = 0.0) -> float:
        """Plain decoding's cost (one T(1) per token after the first) over this run's cost."""
        cost = self.cost(verify_cost, draft_cost)
        return (len(self.tokens) - 1) / cost if cost > 0 else float("nan")

    @property
    def copied_from_prompt(self) -> int:
        """Accepted tokens whose source lies in the prompt (not in the model's own earlier output)."""
        return sum(1 for s in self.sources if 0 <= s < self.prompt_len)


def replay_greedy(proposer, prompt: Sequence[int], continuation: Sequence[int],
                  max_new_tokens: int | None = None, track_sources: bool = True) -> Replay:
    """Replay greedy speculative decoding with a model-free ``proposer`` against a known continuation.

    proposer: anything with ``lookup(tokens) -> draft list`` and ``begin(state)`` (NgramProposer);
    its state is reset first. prompt: the prompt ids; continuation: the plain greedy output (new
    tokens only, the prefill's first token included). max_new_tokens: the generation budget the
    engine used (default: the continuation's length); drafts are cut to ``remaining - 1`` tokens
    exactly as in ``engine.generate``. A continuation shorter than the budget is taken to end at
    EOS: a draft that matches through its last token ends the run there.
    track_sources: also locate each draft with :func:`find_match` (a scan per drafting step) to fill
    ``steps[i].match`` and ``sources``; switch it off for fast ablations (then they are None / -1).

    The result's ``stats`` equal the engine's SpecStats whenever the engine's run produces this
    continuation (always in fp32 greedy decoding), apart from timing fields.
    """
    import time

    prompt = [int(t) for t in prompt]
    cont = [int(t) for t in continuation]
    if not prompt:
        raise ValueError("the prompt is empty")
    if not cont:
        raise ValueError("the continuation is empty: it must hold at least the prefill's token")
    total = len(cont)
    budget = total if max_new_tokens is None else int(max_new_tokens)
    if budget < total:
        raise ValueError(f"max_new_tokens={budget} is shorter than the continuation ({total} tokens)")
    ctx = prompt + cont[:1]
    state = DecodeState(target=None, sampling=GREEDY, generator=None, prompt_len=len(prompt), token_list=ctx)
    proposer.begin(state)
    stats = SpecStats(new_tokens=total)
    kinds, sources, steps = [TARGET], [-1], []
    min_n, max_n = getattr(proposer, "min_n", 1), getattr(proposer, "max_n", 4)
    occurrence = getattr(proposer, "occurrence", "recent")
    t_draft = 0.0

    def offer(generated: int):
        nonlocal t_draft
        t0 = time.perf_counter()
        draft = list(proposer.lookup(ctx))
        t_draft += time.perf_counter() - t0
        return len(draft), leading_matches(draft, cont, generated)

    for s in chain_steps(total, offer, budget):
        n, m = s.drafted, s.accepted
        ended = s.emitted == m  # accepted through the continuation's last token (EOS)
        match = find_match(ctx, min_n, max_n, occurrence) if n and track_sources else None
        kinds += [ACCEPTED] * m
        sources += [match.source(j) if match else -1 for j in range(m)]
        if not ended:
            kinds.append(TARGET if n == 0 else (BONUS if m == n else RECOVERED))
            sources.append(-1)
        stats.record_step(n, m, s.emitted)
        steps.append(ReplayStep(generated=s.generated, drafted=n, accepted=m, emitted=s.emitted, match=match))
        ctx.extend(cont[s.generated: s.generated + s.emitted])
    stats.draft_time_s = t_draft
    return Replay(prompt_len=len(prompt), tokens=cont, stats=stats, steps=steps, token_kinds=kinds,
                  sources=sources, draft_time_s=t_draft)


def steps_frame(replays: Sequence[Replay], labels: Sequence[dict] | None = None):
    """One row per replayed verification step, for group-bys (e.g. accepted tokens by match length).

    labels: one dict per replay whose items become columns (e.g. ``{"kind": ..., "prompt_id": ...}``).
    Columns: the labels, step, generated, drafted, accepted, emitted, match_n (0 without a draft or
    when sources were not tracked), copied_from_prompt (the draft's source lies in the prompt).
    """
    import pandas as pd

    if labels is not None and len(labels) != len(replays):
        raise ValueError(f"got {len(labels)} label dicts for {len(replays)} replays")
    rows = []
    for i, rep in enumerate(replays):
        extra = dict(labels[i]) if labels is not None else {}
        for j, s in enumerate(rep.steps):
            rows.append({**extra, "step": j, "generated": s.generated, "drafted": s.drafted,
                         "accepted": s.accepted, "emitted": s.emitted, "match_n": s.match.n if s.match else 0,
                         "copied_from_prompt": bool(s.match and s.match.end + 1 < rep.prompt_len)})
    return pd.DataFrame(rows)


def workload_kind(category: str) -> str:
    """"input-grounded" for categories whose answers copy the prompt, else "open-ended"."""
    return GROUNDED if category in INPUT_GROUNDED else OPEN


def items_from_benchmark(df, workloads: dict, tokenizer, method: str = "plain") -> list:
    """Prompt and continuation pairs for :func:`run_ablation` from a ``bench.run_benchmark`` frame.

    Takes the token ids of ``method`` (the plain greedy output) for every prompt of ``workloads``
    (the same dict the benchmark ran on; prompts are rebuilt with ``chat_ids``).
    Returns dicts ``{category, kind, prompt_id, prompt, continuation}``.
    """
    from ..models import chat_ids

    rows = df[df["method"] == method]
    if rows.empty:
        raise ValueError(f"the benchmark frame has no rows for method {method!r}")
    by_id = {r["prompt_id"]: r for _, r in rows.iterrows()}
    items = []
    for category, prompts in workloads.items():
        for item in prompts:
            if item["id"] not in by_id:
                raise ValueError(f"prompt {item['id']!r} is not in the benchmark frame")
            items.append({"category": category, "kind": workload_kind(category), "prompt_id": item["id"],
                          "prompt": chat_ids(tokenizer, item["messages"]).tolist(),
                          "continuation": list(by_id[item["id"]]["token_ids"])})
    return items


def _config_label(cfg: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in cfg.items())


def run_ablation(items: Iterable[dict], configs: Iterable[dict], verify_cost: float | Callable = 1.0,
                 draft_cost: float = 0.0, max_new_tokens: int | None = None, by: str = "category"):
    """Replay every NgramProposer configuration on every item; aggregate per group.

    items: dicts with ``prompt``, ``continuation`` and the grouping key ``by`` (e.g. from
    :func:`items_from_benchmark`: "category" or "kind"). configs: NgramProposer keyword dicts,
    e.g. ``{"k": 5, "min_n": 1, "max_n": 4}``. verify_cost / draft_cost: see :meth:`Replay.cost`.
    max_new_tokens: the budget the continuations were generated with (default: each one's length).

    Returns a pandas DataFrame, one row per (configuration, group), with the configuration's keys
    as columns, then ``config`` (a label), ``by``'s column, prompts, tokens, steps, drafted,
    accepted, tau (emitted / steps), acceptance_rate (accepted / drafted), draft_steps (share of
    steps that drafted anything), modelled_speedup (total plain cost / total replayed cost),
    per_position_acceptance (list).
    """
    import pandas as pd

    from ..proposers import NgramProposer

    items = list(items)
    configs = [dict(c) for c in configs]
    if not items:
        raise ValueError("no items to replay")
    if not configs:
        raise ValueError("no configurations given")
    rows = []
    for cfg in configs:
        proposer = NgramProposer(**cfg)
        groups: dict = {}
        for it in items:
            rep = replay_greedy(proposer, it["prompt"], it["continuation"], max_new_tokens, track_sources=False)
            g = groups.setdefault(it[by], {"stats": [], "plain": 0.0, "cost": 0.0, "draft_steps": 0})
            g["stats"].append(rep.stats)
            g["plain"] += len(rep.tokens) - 1
            g["cost"] += rep.cost(verify_cost, draft_cost)
            g["draft_steps"] += sum(1 for s in rep.steps if s.drafted)
        for key, g in groups.items():
            merged = SpecStats()
            for s in g["stats"]:
                merged = merged.merge(s)
            rows.append({**cfg, "config": _config_label(cfg), by: key, "prompts": len(g["stats"]),
                         "tokens": merged.new_tokens, "steps": merged.steps, "drafted": merged.drafted,
                         "accepted": merged.accepted, "tau": merged.mean_accepted_length,
                         "acceptance_rate": merged.acceptance_rate,
                         "draft_steps": g["draft_steps"] / merged.steps if merged.steps else 0.0,
                         "modelled_speedup": g["plain"] / g["cost"] if g["cost"] > 0 else float("nan"),
                         "per_position_acceptance": merged.per_position_acceptance})
    return pd.DataFrame(rows)


__all__ = ["Match", "find_match", "ReplayStep", "Replay", "replay_greedy", "steps_frame", "workload_kind",
           "items_from_benchmark", "run_ablation", "GROUNDED", "OPEN"]
