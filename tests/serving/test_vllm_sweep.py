"""vLLM's load sweep is lossless: with n-gram speculation on, two requests served at loads 1 and 2
(each finished request's place refilled at once) give, in fp32 and greedy, exactly the tokens of
plain greedy decoding in our engine. The prompts are those of test_vllm_crosscheck.py, whose fp32
outputs agree between the two engines.

vLLM lives in its own environment (``make vllm-env``); without it this test is skipped (under
SPECDECODE_REQUIRE_VLLM=1, as in CI, it fails instead).
"""
import pytest

from support import need_vllm

from specdecode_ref import autoregressive_generate
from specdecode_ref.models import EMBEDDED, cache_dir, chat_ids
from specdecode_ref.serving import vllm_runner as V
from specdecode_ref.serving.compare import compare_outputs

pytestmark = pytest.mark.vllm

MAX_TOKENS = 24
PROMPTS = [
    "Summarize in one sentence: The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, "
    "named after the engineer Gustave Eiffel, whose company designed and built it from 1887 to 1889.",
    "Rewrite this Python function with a docstring and type hints, keeping its body:\n"
    "def area(w, h):\n    result = w * h\n    return result",
]


@pytest.mark.vllm_extra
def test_vllm_sweep_with_speculation_equals_plain_greedy(embedded):
    need_vllm()
    model, tok = embedded
    prompts = [chat_ids(tok, p) for p in PROMPTS]
    plain = [autoregressive_generate(model, p, max_new_tokens=MAX_TOKENS).tokens.tolist() for p in prompts]
    df = V.run_vllm_sweep(cache_dir() / EMBEDDED, prompts, loads=(1, 2), max_tokens=MAX_TOKENS,
                          speculative_config=V.ngram_config(k=4), dtype="fp32")
    assert list(df.load) == [1, 2] and set(df.policy) == {"on"} and set(df.k) == {4}
    for _, row in df.iterrows():
        same = compare_outputs(plain, row.outputs)
        assert same["identical"] == len(prompts), f"load {row.load}: first differences at {same['first_difference']}"
        assert row.max_in_flight == row.load
        assert row.output_tokens == sum(len(t) for t in plain)
        assert row.throughput_tok_s > 0 and row.ttft_p50_s > 0 and row.itl_p50_s > 0
        assert row.spec_decode_num_drafts > 0 and row.spec_decode_num_draft_tokens >= row.spec_decode_num_accepted_tokens
        assert row.tau >= 1.0


@pytest.mark.vllm_extra
def test_one_job_serves_both_settings_in_process(embedded):
    """speculative_configs=[None, n-gram] with in_process=True: one job, vLLM imported once, the
    rows of both settings; greedy fp32 outputs equal with and without speculation."""
    need_vllm()
    _, tok = embedded
    prompts = [chat_ids(tok, p) for p in PROMPTS]
    df = V.run_vllm_sweep(cache_dir() / EMBEDDED, prompts, loads=(1, 2), max_tokens=8, dtype="fp32",
                          speculative_configs=[None, V.ngram_config(k=4)], in_process=True, repeats=2)
    assert list(zip(df.policy, df.load, df.repeat)) == [(p, l, r) for p in ("off", "on") for l in (1, 2) for r in (0, 1)]
    assert all(a == b for a, b in zip(df.outputs.iloc[::2], df.outputs.iloc[1::2]))  # a repeated run decodes the same
    off, on = df[df.policy == "off"].outputs.iloc[0], df[df.policy == "on"].outputs.iloc[0]
    assert compare_outputs(off, on)["identical"] == len(prompts)
    assert all(len(t) == len(prompts) for t in df.tpot_per_request_s)
