"""The one-at-a-time comparison: its table adds up, and without vLLM it says why."""
import pytest

from specdecode_ref.measure.harness.workloads import load_workloads
from specdecode_ref.serving import engine_speed, vllm_runner


def test_our_rows_and_ratios_without_vllm(embedded, monkeypatch):
    model, tok = embedded
    monkeypatch.setattr(vllm_runner, "vllm_available", lambda: (False, "no vLLM here"))
    table = engine_speed.compare_one_at_a_time(model, tok, load_workloads(["qa"], per_category=1), ["ngram"],
                                               max_new_tokens=6, progress=False)
    assert list(table.method) == ["plain", "ngram"] and set(table.engine) == {"ours"}
    assert table.tokens.tolist() == [6, 6]
    assert table.vs_our_plain.iloc[0] == pytest.approx(1.0)
    assert table.tok_per_s.tolist() == pytest.approx((table.tokens / table.seconds).tolist())
    assert table.vs_vllm_plain.isna().all() and table.attrs["vllm"] == "no vLLM here"
