"""vLLM's suffix decoding (``method="suffix"``: Arctic Inference's suffix trees over the prompt and
past responses) is lossless on this CPU: in fp32 and greedy, three chat prompts give exactly the
tokens of vLLM without speculation, while suffix decoding drafts and some drafts are accepted.

One job, vLLM imported once: both settings run one after the other in one process
(``speculative_configs`` with ``in_process``), each request alone (load 1).

Measured here (32 new tokens, vLLM's defaults: k = max_tree_depth = 24, 10 000 cached responses,
max_spec_factor 1, min_token_prob 0.1; the first summarisation, code and QA prompts of the
benchmark): outputs identical; drafting steps 31, drafted 93, accepted 59, accepted per position
[16, 7, 5, 5, 5, 4, 3, 3, 3, 3, 3, 2, 0, ...]. The job's warm-up request is the first prompt, whose
response then sits in the global tree: the first prompt is drafted from its own earlier answer.

vLLM lives in its own environment (``make vllm-env``, which also builds arctic-inference); without it,
or without Arctic Inference in it, this test is skipped and says why (under
SPECDECODE_REQUIRE_VLLM=1, as in CI, it fails instead).
"""
import pytest

from support import need_vllm

from specdecode_ref.measure.harness.workloads import load_workloads
from specdecode_ref.models import EMBEDDED, cache_dir, chat_ids
from specdecode_ref.serving import vllm_runner as V
from specdecode_ref.serving.compare import compare_outputs

MAX_TOKENS = 32
CATEGORIES = ["summarization", "code", "qa"]  # two that copy from the prompt, one that does not


def need_suffix():
    need_vllm()
    ok, why = V.suffix_available()
    if not ok:
        if V.vllm_required():
            pytest.fail(f"{V.REQUIRE_ENV}=1 but vLLM's suffix decoding is not available: {why}")
        pytest.skip(why)
    return why


def test_suffix_config_uses_vllm_names_and_defaults():
    config = V.suffix_config()
    assert config == {"method": "suffix", "num_speculative_tokens": 24, "suffix_decoding_max_tree_depth": 24,
                      "suffix_decoding_max_cached_requests": 10000, "suffix_decoding_max_spec_factor": 1.0,
                      "suffix_decoding_min_token_prob": 0.1}
    assert V.suffix_config(max_tree_depth=16)["num_speculative_tokens"] == 16  # k defaults to the depth
    assert V.suffix_config(k=5, max_cached_requests=0)["num_speculative_tokens"] == 5
    for bad in ({"k": 0}, {"max_tree_depth": 0}, {"max_cached_requests": -1}, {"max_spec_factor": -1.0},
                {"min_token_prob": 1.5}, {"min_token_prob": float("nan")}):
        with pytest.raises(ValueError):
            V.suffix_config(**bad)


@pytest.mark.vllm
@pytest.mark.vllm_extra
def test_vllm_suffix_decoding_equals_plain_greedy(embedded):
    need_suffix()
    _, tok = embedded
    prompts = [chat_ids(tok, items[0]["messages"]) for items in load_workloads(CATEGORIES, per_category=1).values()]
    config = V.suffix_config()
    df = V.run_vllm_sweep(cache_dir() / EMBEDDED, prompts, loads=(1,), max_tokens=MAX_TOKENS, dtype="fp32",
                          speculative_configs=[None, config], in_process=True)
    off, on = df[df.policy == "off"].iloc[0], df[df.policy == "on"].iloc[0]
    same = compare_outputs(off.outputs, on.outputs)
    assert same["identical"] == len(prompts), f"first differences at {same['first_difference']}"
    assert off.spec_decode_num_drafts == 0
    per_pos = on.spec_decode_num_accepted_tokens_per_pos
    print(f"suffix: drafts {on.spec_decode_num_drafts}, drafted {on.spec_decode_num_draft_tokens}, accepted "
          f"{on.spec_decode_num_accepted_tokens}, per position {per_pos}; start-up {df.attrs['startup_s']:.1f} s")
    assert on.k == config["num_speculative_tokens"] == len(per_pos)
    assert on.spec_decode_num_drafts > 0 and on.spec_decode_num_accepted_tokens > 0
    assert on.spec_decode_num_draft_tokens >= on.spec_decode_num_accepted_tokens
    assert sum(per_pos) == on.spec_decode_num_accepted_tokens
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))  # a survival count: never grows with position
    assert per_pos[0] <= on.spec_decode_num_drafts
    assert on.tau > 1.0
