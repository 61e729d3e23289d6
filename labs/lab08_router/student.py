"""Lab 8 — which drafter for which prompt. Fill in the six functions below (numpy only).

No drafter is fastest on every prompt: prompt lookup wins where the answer copies the prompt, a
draft model or EAGLE on open text, and on some prompts plain decoding beats them all. A *router*
picks one candidate per prompt, before decoding starts, from features that cost nothing next to
decoding. This lab scores choosers on measured timings and asks you for a router of your own.

A timing table is a dict (``specdecode_ref.measure.routing.load_table("benchmark")``)::

    {"meta": {"split": "benchmark", "methods": ["plain", "ngram", ...], ...},
     "prompts": [{"id": "code-0", "category": "code", "prompt_tokens": 412,
                  "features": {"log_prompt_tokens": 6.02, "self_copy_rate": 0.31,
                               "repeated_trigrams": 0.12, "distinct_tokens": 0.55,
                               "hidden": [576 floats]},
                  "seconds": {"plain": 4.1, "ngram": 2.9, ...},   # wall time of each method
                  "tokens":  {"plain": 48, "ngram": 48, ...},     # tokens it generated
                  "tau":     {"plain": 1.0, "ngram": 2.4, ...},   # tokens per verification step
                  ...}, ...]}

Every method of ``meta["methods"]`` was timed on every prompt. A method's *speed* on a prompt is
its tokens / seconds there. "plain" (no drafting) is always timed: speedups are relative to it.
``choices`` is a list with one method name per prompt, in the order of ``table["prompts"]``.
``candidates`` is a list of method names the choosers may pick from (the table may time more
methods than that, e.g. the held-out table also times the live "router" and "bandit", which are
not candidates).
"""
from __future__ import annotations

import numpy as np


def pooled_speedup(table: dict, choices) -> float:
    """The pooled speedup of per-prompt ``choices`` over plain decoding on the same prompts:

        (sum of the chosen methods' tokens / sum of their seconds)
        / (sum of plain's tokens / sum of plain's seconds)

    Sums run over every prompt of the table, each prompt contributing the tokens and seconds of
    the method chosen for it. This is NOT the mean of the per-prompt speedups: a long prompt
    weighs more than a short one, as it does on a real server.

    choices: a list or tuple of method names, one per prompt. Raise ValueError when its length
    differs from the number of prompts, or when it names a method the table has no timings for
    (not in ``table["meta"]["methods"]``). Returns a Python float; all "plain" gives 1.0.
    """
    raise NotImplementedError("pooled_speedup: total tokens / total seconds, against plain's")


def oracle_choices(table: dict, candidates) -> list:
    """For each prompt, the candidate with the highest speed (tokens / seconds) on it.

    Known only after timing every candidate on the prompt: an upper bound for any router.
    Speed, not tau: a method that verifies many tokens per step can still be slow when its
    drafting is expensive. Ties (exactly equal speed) go to the candidate that comes first in
    ``candidates``. Only ``candidates`` may be chosen, whatever else the table timed.

    Returns a list of method names, one per prompt. Raise ValueError for an empty
    ``candidates`` or a candidate the table has no timings for.
    """
    raise NotImplementedError("oracle_choices: the fastest candidate of each prompt")


def regret(table: dict, choices, candidates) -> float:
    """How much slower ``choices`` are than the oracle over ``candidates``, pooled:

        regret = oracle's pooled speed / the choices' pooled speed - 1

    (pooled speed as in :func:`pooled_speedup`; plain's rate cancels). 0 for the oracle's own
    choices, 0.25 for a chooser whose pooled speed is 80 % of the oracle's. A ratio, not a
    difference of speedups. ``choices`` may name any method the table timed; errors as in
    :func:`pooled_speedup` and :func:`oracle_choices`. Returns a Python float.
    """
    raise NotImplementedError("regret: oracle speed / chooser speed - 1")


def best_single(table: dict, candidates) -> str:
    """The one candidate with the highest pooled speedup when used on every prompt of the table.

    Pooled as in :func:`pooled_speedup` (not the mean of per-prompt speedups). Ties go to the
    candidate that comes first in ``candidates``. Raise ValueError for an empty ``candidates``
    or a candidate the table has no timings for.
    """
    raise NotImplementedError("best_single: the candidate with the highest pooled speedup")


def fit_router(table: dict, candidates):
    """Fit your router on a timing table (the benchmark table) and return it: any object you
    like (a dict of arrays, a class instance, ...); :func:`route` receives it back.

    Use only ``table`` (features and timings) and ``candidates``; the router may choose only
    among ``candidates`` (a list of method names the table timed, for example all six
    ``routing.CANDIDATES``, or a subset such as ["plain", "ngram", "draft"]) and never a method
    outside it, even when the table times one that is faster (the held-out table's "router" and
    "bandit" columns are what the course's own routers did live: they are not candidates).
    Each prompt's features are in ``prompt["features"]`` (four text features and "hidden", the
    target's last hidden state averaged over the prompt, a list of floats) and its category in
    ``prompt["category"]``.

    It must be deterministic and fast (the grader fits it several times; a few seconds at most).

    Graded by its regret to the oracle (:func:`regret`) on the held-out prompts, which it never
    sees, computed from their stored timings, with the six candidates. The bands are set
    against two choosers fitted on the benchmark table: the best single candidate (the same
    method for every prompt) and the course's reference router (``routing.fit``: a ridge
    regression of each candidate's log speedup on the text features and a few principal
    components of the hidden state; it does not use the category):

      * faster than plain decoding on the held-out prompts (the visible test, 4 points);
      * regret at most 1.5 times the best single candidate's (2 points);
      * regret at most the best single candidate's (3 points);
      * regret at most halfway from the best single candidate's down to the reference
        router's (6 points, the largest item). It lies below the best single candidate's own
        regret, so a router that picks the same method for every prompt cannot reach it.

    The bands follow from the tables shipped with the lab (which candidate is the best single one,
    and both choosers' held-out regrets); the notebook computes and prints them.
    """
    raise NotImplementedError("fit_router: fit your router on the benchmark table")


def route(router, features: dict) -> str:
    """Your router's choice for one prompt: the name of one candidate it was fitted with.

    router: what :func:`fit_router` returned.
    features: the prompt's features as a request sees them: the four text features
    ("log_prompt_tokens", "self_copy_rate", "repeated_trigrams", "distinct_tokens", floats),
    "hidden" (a numpy array, the pooled hidden state) and "category" (a str; it may be a
    category the benchmark table does not have, and then too a candidate must come back). Do not
    modify it. Returns a str, always one of the candidates given to :func:`fit_router`.
    """
    raise NotImplementedError("route: pick a candidate for one prompt")
