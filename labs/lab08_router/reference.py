"""Lab 8 with the reference package switched in: the same names as student.py, as thin adapters
over ``specdecode_ref.measure.routing`` (and its ridge-regression router, ``RouterPolicy``)."""
from __future__ import annotations

from specdecode_ref.measure import routing


def _rate(table: dict, choices) -> float:
    """Pooled tokens / seconds of per-prompt choices (routing.rates checks the method names)."""
    choices = list(choices)
    n = len(table["prompts"])
    if len(choices) != n:
        raise ValueError(f"{len(choices)} choices for {n} prompts")
    names = sorted(set(choices))
    tok, sec = routing.rates(table, names)
    col = [names.index(c) for c in choices]
    return float(tok[range(n), col].sum() / sec[range(n), col].sum())


def pooled_speedup(table: dict, choices) -> float:
    return _rate(table, choices) / _rate(table, [routing.PLAIN] * len(table["prompts"]))


def oracle_choices(table: dict, candidates) -> list:
    if not list(candidates):
        raise ValueError("no candidates to choose from")
    return routing.oracle_choices(table, list(candidates))


def regret(table: dict, choices, candidates) -> float:
    return _rate(table, oracle_choices(table, candidates)) / _rate(table, choices) - 1.0


def best_single(table: dict, candidates) -> str:
    if not list(candidates):
        raise ValueError("no candidates to choose from")
    return routing.best_single(table, list(candidates))


def fit_router(table: dict, candidates):
    return routing.fit(table, list(candidates))


def route(router, features: dict) -> str:
    return router(features)
