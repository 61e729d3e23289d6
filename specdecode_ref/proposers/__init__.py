"""Proposers (drafters) and ``load_proposer``, the one entry point that builds them by name."""
from __future__ import annotations

import logging
import os

from .base import DRAFT_SAMPLING, DecodeState, Draft, Proposer, StandAside, StepOutcome, resolve_draft_sampling
from .draft_model import DraftModelProposer
from .eagle import EagleProposer
from .early_exit import EarlyExitProposer
from .medusa import MedusaProposer
from .ngram import NgramProposer
from .parallel_draft import ParallelDraftProposer
from .shipped import shipped_vocab
from .suffix import SuffixProposer


def _ngram(target, k, draft_sampling=None, **kwargs):
    # Tuned on the benchmark suite (notebook 04): a match of n tokens drafts up to 2n tokens, so
    # doubtful 1-gram matches cost little verify time while long matches draft up to k = 8.
    # Copied tokens come with no distribution: q is one-hot, "greedy" is the only drafting mode.
    resolve_draft_sampling(draft_sampling, "greedy", can_sample=False, who="the n-gram proposer")
    kwargs.setdefault("k_per_matched_token", 2)
    return NgramProposer(k=k, **kwargs)


def _draft(target, k, reduced_vocab: bool = True, **kwargs):
    # The shipped 4-layer distilled draft (notebook 05); reduced_vocab drafts among the 8,192 most
    # frequent answer tokens (vocab.py), which cuts the draft's vocabulary projection ~9x.
    from .draft_model import load_draft_model

    return DraftModelProposer(load_draft_model(target), k=k, draft_vocab=shipped_vocab(reduced_vocab), **kwargs)


def _draft_full_vocab(target, k, **kwargs):
    return _draft(target, k, reduced_vocab=False, **kwargs)


def _early_exit(target, k, exit_layer=None, reduced_vocab: bool = True, **kwargs):
    # The target's first layers + a shipped exit adapter, sharing and reusing the KV cache (notebook 06).
    from .early_exit import load_adapter

    adapter = load_adapter(target, exit_layer)
    return EarlyExitProposer(target, adapter, k=k, draft_vocab=shipped_vocab(reduced_vocab), **kwargs)


def _medusa(target, k, **kwargs):
    # Medusa-1 heads on the target's last hidden state (notebook 07): a tree of k nodes derived from
    # the heads' measured accuracies (shipped in the weights' metadata); tree=False drafts a chain.
    from .medusa import load_medusa_proposer

    return load_medusa_proposer(target, k=k, **kwargs)


def _medusa_chain(target, k, **kwargs):
    return _medusa(target, k, tree=False, **kwargs)


def _hydra(target, k, **kwargs):
    # Hydra heads (notebook 07): Medusa's heads made sequentially dependent, each reading the tokens
    # drafted before it on its path; a tree of k nodes by default, tree=False drafts a chain.
    from .medusa import load_hydra_proposer

    return load_hydra_proposer(target, k=k, **kwargs)


def _hydra_chain(target, k, **kwargs):
    return _hydra(target, k, tree=False, **kwargs)


def _pard(target, k, tree: bool = False, **kwargs):
    # The parallel drafter (notebook 13): the draft model adapted to draft k tokens in ONE forward
    # from k - 1 mask tokens (PARD); tree=True takes a Medusa-style tree of k nodes from the
    # per-position top candidates of that one forward.
    from .parallel_draft import load_pard_proposer

    return load_pard_proposer(target, k=k, tree=tree, **kwargs)


def _pard_tree(target, k, **kwargs):
    return _pard(target, k, tree=True, **kwargs)


def _eagle(target, k, tree: bool = False, reduced_vocab: bool = True, **kwargs):
    # The shipped EAGLE head (notebook 08): one decoder layer drafting the target's next feature;
    # a chain by default, tree=True for an EAGLE-2-style dynamic tree (k = its node budget).
    from .eagle import load_eagle_proposer

    return load_eagle_proposer(target, k=k, tree=tree, reduced_vocab=reduced_vocab, **kwargs)


def _eagle_tree(target, k, **kwargs):
    return _eagle(target, k, tree=True, **kwargs)


def _eagle3(target, k, tree: bool = False, **kwargs):
    # The EAGLE-3 head in vLLM's layout (notebook 08, section 10): fused low/middle/high features,
    # its own draft vocabulary; trained here on a CPU-sized corpus, exported weight for weight.
    from .eagle import EAGLE3_WEIGHTS, load_eagle_proposer

    return load_eagle_proposer(target, k=k, tree=tree, path=EAGLE3_WEIGHTS, **kwargs)


def _suffix(target, k, draft_sampling=None, **kwargs):
    # Suffix decoding (notebook 11) with vLLM's defaults: trees 24 tokens deep, up to 10,000 earlier
    # requests remembered, a draft of up to one token per matched token. Like n-gram drafts, its
    # tokens are copied, so q is one-hot and "greedy" is its only drafting mode.
    resolve_draft_sampling(draft_sampling, "greedy", can_sample=False, who="the suffix proposer")
    return SuffixProposer(k=k, **kwargs)


def _candidates(names, target, candidate_kwargs, plain: str) -> dict:
    """{name: proposer} for a chooser's candidates, each at its fixed size unless candidate_kwargs
    gives one (None for plain decoding)."""
    extra = candidate_kwargs or {}
    return {n: None if n == plain else load_proposer(n, target, **{"k": _REGISTRY[n][1], **extra.get(n, {})})
            for n in names}


def _router(target, k, policy=None, candidate_kwargs=None):
    # A drafter chosen per request by a policy fitted to this machine's per-prompt timings
    # (notebook 12; refit with ``python -m specdecode_ref.measure.routing``).
    from .router import PLAIN, RouterPolicy, RouterProposer, shipped_policy
    if k is not None:
        raise ValueError("the router drafts with each candidate's own k: pass no k (set it in candidate_kwargs)")
    policy = shipped_policy() if policy is None else policy
    if isinstance(policy, (str, os.PathLike)):
        policy = RouterPolicy.from_json(policy)
    names = getattr(policy, "candidates", None)
    if not names:
        raise ValueError("policy must list its candidates (a RouterPolicy, or a path to one saved with to_json)")
    # Each candidate at the fixed size the policy's timings were taken at (measure.routing), not at
    # the size this machine would choose alone: the policy learned what those drafters do.
    return RouterProposer(_candidates(names, target, candidate_kwargs, PLAIN), policy)


def _bandit(target, k, candidates=("plain", "ngram", "draft", "eagle"), probe_steps: int = 3, candidate_kwargs=None):
    # Tries every candidate for probe_steps steps of each request, keeps the fastest (notebook 12).
    from .router import PLAIN, BanditRouter
    if k is not None:
        raise ValueError("the bandit drafts with each candidate's own k: pass no k (set it in candidate_kwargs)")
    # Each candidate drafts at its fixed size: a candidate sized for this machine could stand aside,
    # and the bandit would then probe plain decoding twice.
    return BanditRouter(_candidates(candidates, target, candidate_kwargs, PLAIN), probe_steps=probe_steps)


# name -> (builder(target, k, **kwargs), fixed k). load_proposer(name, model) does not draft with
# these numbers when it can size the draft for the machine at hand (sizing.machine_draft_size: each
# drafter's measured tau and drafting time per size, data/measured/draft_sizes.json, against this
# machine's cost curve T(n)). They are what it falls back to when it cannot: no target to time, a
# target other than the embedded model (the table's acceptances are that model's), keyword
# arguments that change what the drafter drafts, or SPECDECODE_DRAFT_SIZES=fixed. They are also the
# sizes the stored routing tables timed, so the router builds its candidates at them.
_REGISTRY = {
    "ngram": (_ngram, 8),
    "draft": (_draft, 1),
    "draft-fullvocab": (_draft_full_vocab, 1),
    "early-exit": (_early_exit, 1),
    "medusa": (_medusa, 8),
    "medusa-chain": (_medusa_chain, 3),
    "hydra": (_hydra, 8),
    "hydra-chain": (_hydra_chain, 3),
    "pard": (_pard, 2),  # fastest K of the parallel drafter on the benchmark (notebook 13)
    "pard-tree": (_pard_tree, 8),
    "eagle": (_eagle, 2),
    "eagle-tree": (_eagle_tree, 16),
    "eagle3": (_eagle3, 2),
    "suffix": (_suffix, 24),
    "router": (_router, None),  # k: each candidate's own
    "bandit": (_bandit, None),
}


#: keyword arguments that leave a drafter as the size table measured it (greedy drafting: a sampled
#: draft accepts less, so draft_sampling="sample" is not among them)
_SIZING_NEUTRAL = frozenset()
_SAID = set()  # (name, size) pairs whose choice has been logged in this process


def _machine_size(key: str, target, kwargs: dict, batch_size: int = 1):
    """The draft size predicted fastest for ``key`` on this machine (``sizing.DraftSize``), or None
    when the stored table does not describe what would be built (see the note on _REGISTRY)."""
    if os.environ.get("SPECDECODE_DRAFT_SIZES", "machine").strip().lower() == "fixed":
        return None
    if target is None or set(kwargs) - _SIZING_NEUTRAL:
        return None
    from ..sizing import machine_draft_size, stored_draft_sizes
    from .shipped import is_embedded_target

    if not is_embedded_target(target):
        return None
    table = stored_draft_sizes()
    if key not in table.get("drafters", {}):
        return None
    return machine_draft_size(key, target, table, batch_size=batch_size)


def _say_once(key: str, choice) -> None:
    if (key, choice.size) not in _SAID:
        _SAID.add((key, choice.size))
        logging.getLogger(__name__).info("load_proposer(%r): %s", key, choice.describe())


def available_proposers() -> list:
    return sorted(_REGISTRY)


def default_k(name: str) -> int | None:
    """The fixed k ``load_proposer(name)`` falls back to when it cannot size the draft for the
    machine (None: the router's and bandit's candidates keep their own); see ``sizing.machine_draft_size``
    for the size it chooses when it can."""
    key = name.lower().replace("_", "-")
    if key not in _REGISTRY:
        raise ValueError(f"unknown proposer {name!r}; available: {available_proposers()}")
    return _REGISTRY[key][1]


def register_proposer(name: str, builder, default_k: int) -> None:
    """Make ``load_proposer(name, ...)`` build proposers with ``builder(target, k, **kwargs)``."""
    _REGISTRY[name] = (builder, default_k)


def load_proposer(name: str, target=None, k: int | None = None, batch_size: int = 1, **kwargs) -> Proposer:
    """Build a proposer by name: "ngram", "draft", "draft-fullvocab", "early-exit", "medusa",
    "medusa-chain", "hydra", "hydra-chain", "pard", "pard-tree", "eagle", "eagle-tree", "eagle3", "suffix", and the drafters that
    choose among them per request, "router" and "bandit" (see ``available_proposers()``).

    Model-based proposers load their shipped weights for the embedded model and need ``target``.

    k=None sizes the draft for this machine: the k (or tree node budget) with the highest predicted
    tokens per second, from the drafter's measured acceptance and drafting time per size and this
    machine's cost curve T(n), measured once and cached (``sizing.machine_draft_size``). When plain
    decoding is predicted faster than every size, the drafter stands aside (``StandAside``: it
    drafts nothing). ``repr(proposer)`` and ``proposer.sizing`` say what was chosen and why; the
    choice is logged once. ``batch_size``: size the draft for steps of that many requests (a
    batch's forward is steeper, so the size that pays shrinks; ``generate_batch`` and the scheduler
    draft with the proposer's k as built). An explicit ``k`` always wins. Without a target to time, for another
    target model, or with keyword arguments that change what is drafted, the fixed ``default_k`` is
    used (also under ``SPECDECODE_DRAFT_SIZES=fixed``).
    ``draft_sampling="sample"|"greedy"`` (see ``DRAFT_SAMPLING``) picks how chain drafters choose
    tokens when the request samples; deterministic drafters (n-gram, trees) accept only "greedy".
    """
    key = name.lower().replace("_", "-")
    if key not in _REGISTRY:
        raise ValueError(f"unknown proposer {name!r}; available: {available_proposers()}")
    builder, fixed_k = _REGISTRY[key]
    if isinstance(k, str):
        raise ValueError(f"k must be an int >= 1, or None to size the draft for this machine, got {k!r} "
                         "(serving.advisor.load_fitted sizes a chain from the advisor's stored counters)")
    sizing = _machine_size(key, target, kwargs, batch_size) if k is None and fixed_k is not None else None
    size = (sizing.size or fixed_k) if sizing is not None else fixed_k
    proposer = builder(target, size if k is None else k, **kwargs)
    if target is not None:
        proposer.check_compatible(target)
        _follow_target_backend(proposer, target)
    if sizing is not None:
        _say_once(key, sizing)
        proposer = StandAside(proposer, sizing) if sizing.size == 0 else proposer
        proposer.sizing = sizing
    return proposer


def _follow_target_backend(proposer: Proposer, target) -> None:
    """Run a drafter's own networks (a draft model, Medusa/EAGLE heads) on the target's backend
    (backend.py), so that choosing the backend in ``load_model`` chooses it for the whole step."""
    import torch

    from ..backend import apply_backend, backend_of

    kind = backend_of(target)
    if kind not in ("fast", "eager"):
        return
    for value in vars(proposer).values():
        if isinstance(value, torch.nn.Module) and value is not target and backend_of(value) != kind:
            apply_backend(value, kind)


__all__ = ["Proposer", "Draft", "DecodeState", "StepOutcome", "DRAFT_SAMPLING", "resolve_draft_sampling",
           "NgramProposer", "SuffixProposer", "DraftModelProposer", "ParallelDraftProposer", "EarlyExitProposer", "MedusaProposer", "EagleProposer", "load_proposer",
           "available_proposers", "default_k", "register_proposer", "StandAside"]
