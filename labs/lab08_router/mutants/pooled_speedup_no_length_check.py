"""Mutant: pooled_speedup zips the choices with the prompts without checking their number, so a
short list silently scores only the first prompts.

caught by: test_pooled_speedup_refuses_bad_choices, test_pooled_speedup_single_prompt_and_tuples
"""
from __future__ import annotations

from specdecode_ref.grading import one_mistake

patch = one_mistake(globals())


@patch
def pooled_speedup(table, choices):
    unknown = set(choices) - set(table["meta"]["methods"])
    if unknown:
        raise ValueError(f"the table has no timings for {sorted(unknown)}")
    pairs = list(zip(table["prompts"], choices))  # BUG: no check that there is one choice per prompt
    if not pairs:
        return 1.0
    chosen = sum(p["tokens"][c] for p, c in pairs) / sum(p["seconds"][c] for p, c in pairs)
    plain = sum(p["tokens"]["plain"] for p, _ in pairs) / sum(p["seconds"]["plain"] for p, _ in pairs)
    return float(chosen / plain)
