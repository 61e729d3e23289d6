"""The engine profile decodes the same tokens every way it times them, and its split adds up."""
import pytest
import torch

from specdecode_ref.measure import engine_profile


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(3, 60, (n,), generator=g) for n in (5, 9, 7, 11)]


def test_every_variant_decodes_the_tokens_of_our_engine(tiny_model, prompts):
    table, extra = engine_profile.profile_plain(tiny_model, prompts, max_new_tokens=6, progress=False)
    assert list(table.variant) == ["ours (DynamicCache)", "bare loop (DynamicCache)", "static cache"]
    assert table.same_tokens_as_ours.all()
    assert (table.forward_ms_per_token <= table.ms_per_token + 1e-9).all()
    assert table.speed_vs_ours.iloc[0] == pytest.approx(1.0)
    ops = extra["operators"]
    assert 0.0 < ops["operator_share"] <= 1.0 and ops["top_ops_ms"]


def test_a_static_cache_that_loses_its_length_is_caught(tiny_model, prompts, monkeypatch):
    # A static cache that reports length 0: every step is placed at position 0 and attends to
    # nothing before it, so the tokens part from ours.
    import transformers

    class Forgetful(transformers.StaticCache):
        def get_seq_length(self, layer_idx=0):
            return 0

    monkeypatch.setattr(transformers, "StaticCache", Forgetful)
    table, _ = engine_profile.profile_plain(tiny_model, prompts, max_new_tokens=12, progress=False)
    assert table.same_tokens_as_ours.iloc[1] and not table.same_tokens_as_ours.iloc[2]


def test_too_few_tokens_is_refused(tiny_model, prompts):
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine_profile.profile_plain(tiny_model, prompts, max_new_tokens=1, progress=False)
