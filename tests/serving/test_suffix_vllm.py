"""Our suffix decoding beside vLLM's (``serving.suffix_vllm``).

The cheap tests read the committed measurement (``data/measured/suffix_vllm.json``) without vLLM:
the loader, the summary table and the arithmetic of recounting vLLM's counters within max_tokens.

The vLLM test runs the comparison itself on the first request of each family of the repeating
stream, 24 new tokens each: outputs equal on both sides (and equal to plain greedy decoding), and
once vLLM's counters are cut to max_tokens, acceptance rate and mean acceptance length within the
tolerances below of ours. Measured here (AMD EPYC, 2 cores, about 95 s): three requests agree on
every step; in the code request a tie between two equally frequent continuations goes to a token
the target takes in our tree and to another in Arctic's (step 16), so ours drafts 41 times, 50
tokens, 5 accepted, and vLLM within max_tokens 41, 49, 5: acceptance rate 0.100 against 0.102,
mean acceptance length 1.12 on both sides.
"""
import math

import pytest

from support import need_vllm

from specdecode_ref.serving import suffix_vllm as S
from specdecode_ref.serving import vllm_runner as V

# Allowed gap between ours and vLLM-within-max_tokens: ties may pick different draft tokens.
RATE_TOLERANCE = 0.05  # acceptance rate, absolute
LENGTH_TOLERANCE = 0.1  # mean acceptance length, absolute


def test_stored_comparison_loads_and_summarizes():
    result = S.load_vllm_comparison()
    meta, rows, totals = result["meta"], result["rows"], result["totals"]
    for key in ("cpu", "vllm_version", "date", "command", "max_new_tokens", "speculative_config"):
        assert meta.get(key), f"meta lacks {key}"
    assert len(rows) == totals["requests"] >= 8
    assert {r["family"] for r in rows} == {"email", "code", "sql", "steps"}
    assert all(r["same_output"] and r["ours_plain"] and r["vllm_plain"] for r in rows)

    table = S.summarize(result)
    assert list(table.side) == [S.SIDE_NAMES[s] for s in S.SIDES]
    for side in S.SIDES:
        line = table[table.side == S.SIDE_NAMES[side]].iloc[0]
        assert line.accepted == sum(r[f"{side}_accepted"] for r in rows) == totals[side]["accepted"]
        assert line.mean_acceptance_length == pytest.approx(1 + line.accepted / line.drafts)
        assert line.acceptance_rate == pytest.approx(line.accepted / line.draft_tokens)
    # vLLM as reported counts at least what fits within max_tokens; the recount is what ours counts
    assert totals["vllm"]["draft_tokens"] >= totals["vllm_within"]["draft_tokens"]
    assert totals["vllm"]["accepted"] >= totals["vllm_within"]["accepted"]
    by_family = S.summarize(result, by="family")
    assert set(by_family.family) == {"email", "code", "sql", "steps"} and len(by_family) == 4 * len(S.SIDES)
    assert "vllm_steps" not in S.request_table(result).columns


def test_stored_steps_recount_to_the_stored_counters():
    result = S.load_vllm_comparison()
    n = result["meta"]["max_new_tokens"]
    for r in result["rows"]:
        counts = S.recount(r["vllm_steps"], n)
        for side in ("vllm", "vllm_within"):
            assert counts[side] == {c: r[f"{side}_{c}"] for c in S.COUNTERS}
        assert sum(s[3] for s in r["vllm_steps"]) == r["new_tokens_vllm"] == len(r["vllm_tokens"])
        assert sum(d for d, _ in r["ours_steps"]) == r["ours_draft_tokens"]


def test_recount_cuts_the_last_step_to_the_budget():
    # [draft tokens, accepted, drafts, new tokens, tokens before]; max_tokens 6
    steps = [[0, 0, 0, 1, 0], [3, 2, 1, 3, 1], [5, 4, 1, 2, 4]]
    c = S.recount(steps, 6)
    assert c["vllm"] == {"drafts": 2, "draft_tokens": 8, "accepted": 6}
    assert c["vllm_within"] == {"drafts": 2, "draft_tokens": 4, "accepted": 3}  # last step: 6 - 4 - 1 = 1 counts
    assert c["tail_cached"] == 3  # 4 accepted + 1 target token sampled, 2 emitted
    assert S.recount([[0, 0, 0, 1, 0], [4, 0, 1, 1, 5]], 6)["vllm_within"]["drafts"] == 0  # no room left


def test_unknown_settings_are_refused():
    with pytest.raises(ValueError, match="unknown suffix settings"):
        S.suffix_settings({"depth": 3})
    ours, config = S.suffix_settings({"max_tree_depth": 16})
    assert ours["k"] == config["num_speculative_tokens"] == 16


@pytest.mark.vllm
@pytest.mark.vllm_extra
def test_vllm_suffix_counters_match_ours_within_max_tokens(embedded):
    from specdecode_ref.measure.harness.workloads import load_repeating

    need_vllm()
    ok, why = V.suffix_available()
    if not ok:
        if V.vllm_required():
            pytest.fail(f"{V.REQUIRE_ENV}=1 but vLLM's suffix decoding is not available: {why}")
        pytest.skip(why)
    model, tok = embedded
    result = S.compare_with_vllm(model, tok, load_repeating(per_family=1), max_new_tokens=24)
    rows, totals = result["rows"], result["totals"]
    print(S.request_table(result).to_string())
    print(S.summarize(result).to_string())
    assert len(rows) == 4
    for r in rows:
        assert r["same_output"], f"request {r['request']}: vLLM's output differs from ours"
        assert r["ours_plain"] and r["vllm_plain"], f"request {r['request']}: an output differs from plain greedy"
    ours, within = totals["ours"], totals["vllm_within"]
    assert ours["drafts"] > 0 and ours["accepted"] > 0
    assert abs(ours["acceptance_rate"] - within["acceptance_rate"]) <= RATE_TOLERANCE
    assert abs(ours["mean_acceptance_length"] - within["mean_acceptance_length"]) <= LENGTH_TOLERANCE
    assert totals["vllm"]["draft_tokens"] >= within["draft_tokens"]
    assert not math.isnan(totals["vllm"]["mean_acceptance_length"])
