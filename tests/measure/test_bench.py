"""The benchmark harness on the embedded model: frame shape, losslessness, tables, plots, cost curve.

No timing thresholds: timings are only checked to be positive numbers.
"""
import json
import math

import pytest
import torch

from specdecode_ref import load_model
from specdecode_ref.measure.harness import bench
from specdecode_ref.measure.harness.workloads import CATEGORIES, INPUT_GROUNDED, load_workloads

CATS = ["summarization", "qa"]


@pytest.fixture(scope="module")
def model_and_tok():
    # One thread: on a shared 2-core machine, OpenMP threads competing with another process slow
    # every forward down many times over; a single thread keeps this module well under a minute.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield load_model(dtype="fp32", device="cpu")
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def results(model_and_tok):
    model, tok = model_and_tok
    wl = load_workloads(CATS, per_category=2)
    df = bench.run_benchmark(model, tok, ["plain", "ngram"], wl, max_new_tokens=16, repeats=1, k=5,
                             progress=False)
    return df


def test_workloads():
    assert len(CATEGORIES) == 7 and set(INPUT_GROUNDED) <= set(CATEGORIES)
    wl = load_workloads(per_category=3)
    assert list(wl) == CATEGORIES and all(len(v) == 3 for v in wl.values())
    assert len(load_workloads()["code"]) == 8
    assert list(load_workloads("qa,code")) == ["qa", "code"]
    item = wl["qa"][0]
    assert item["id"] and item["messages"][-1]["role"] == "user"
    with pytest.raises(ValueError, match="unknown workload category 'chat'"):
        load_workloads(["chat"])
    with pytest.raises(ValueError, match="per_category"):
        load_workloads(per_category=0)


def test_run_benchmark_frame(results):
    df = results
    assert len(df) == 2 * 2 * 2  # categories x prompts x methods
    expected = {"category", "prompt_id", "method", "k", "prompt_tokens", "tokens", "seconds", "tokens_per_s",
                "tau", "acceptance_rate", "drafted", "accepted", "steps", "emitted", "identical",
                "first_mismatch", "times_s", "token_ids", "stats"}
    assert expected <= set(df.columns)
    assert set(df["category"]) == set(CATS) and set(df["method"]) == {"plain", "ngram"}
    assert df.groupby("method").size().to_dict() == {"ngram": 4, "plain": 4}
    assert (df["tokens"] >= 1).all() and (df["tokens"] <= 16).all()
    assert (df["seconds"] > 0).all() and (df["tokens_per_s"] > 0).all()
    # Greedy speculative decoding in fp32 reproduces plain decoding token for token.
    assert df["identical"].all()
    assert df["first_mismatch"].isna().all()
    plain = df[df["method"] == "plain"]
    assert (plain["tau"] == 1.0).all() and plain["acceptance_rate"].isna().all()
    ngram = df[df["method"] == "ngram"]
    assert (ngram["k"] == 5).all() and (ngram["tau"] >= 1.0).all()
    assert (ngram["drafted"] > 0).any()


def test_summarize_tables_plot(results, tmp_path):
    summary = bench.summarize(results)
    assert set(summary["category"]) == set(CATS) | {"overall"}
    assert len(summary) == 3 * 2
    over = summary[summary["category"] == "overall"].set_index("method")
    assert over.loc["plain", "speedup"] == pytest.approx(1.0)
    assert over.loc["plain", "prompts"] == 4 and over.loc["ngram", "identical"] == 1.0
    assert over.loc["ngram", "tokens"] == results[results["method"] == "ngram"]["tokens"].sum()
    assert over.loc["plain", "tau"] == pytest.approx(1.0)
    assert math.isfinite(over.loc["ngram", "speedup"]) and over.loc["ngram", "speedup"] > 0

    text = bench.format_tables(summary)
    for cat in CATS:
        assert f"== {cat} ==" in text
    assert "overall" in text and "ngram" in text and "speedup" in text

    png = tmp_path / "speedups.png"
    fig = bench.plot_speedups(summary, path=png)
    assert png.stat().st_size > 0 and fig is not None

    paths = bench.save_results(results, summary, tmp_path / "out", config={"test": True})
    payload = json.loads(open(paths["json"]).read())
    assert len(payload["per_prompt"]) == len(results) and payload["config"] == {"test": True}
    # A frame read back from the JSON summarizes the same way (stats rebuilt from the counters).
    import pandas as pd

    again = bench.summarize(pd.DataFrame(payload["per_prompt"]))
    assert again["tau"].fillna(-1).tolist() == pytest.approx(summary["tau"].fillna(-1).tolist())


def test_unknown_method(model_and_tok):
    model, tok = model_and_tok
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        bench.run_benchmark(model, tok, ["plain", "nope"], load_workloads("qa", 1), 4, progress=False)


def test_measure_cost_curve(model_and_tok, tmp_path):
    model, _ = model_and_tok
    curve = bench.measure_cost_curve(model, ns=[1, 2, 4], repeats=2, warmup=1)
    assert curve["ns"] == [1, 2, 4]
    assert len(curve["times_s"]) == 3 and all(type(t) is float and t > 0 for t in curve["times_s"])
    assert curve["relative"][0] == 1.0 and all(type(r) is float for r in curve["relative"])
    json.dumps(curve)  # plain Python values only
    fig = bench.plot_cost_curve(curve, path=tmp_path / "cost.png")
    assert (tmp_path / "cost.png").stat().st_size > 0 and fig is not None
    assert "T(n)" in bench.format_cost_curve(curve)


def test_k_defaults_are_per_method(tiny_model):
    """Without a K each method keeps its own default (a CPU-tuned draft K must not be overridden by
    the n-gram's); NAME@K and an explicit k still win."""
    from specdecode_ref.proposers import _REGISTRY

    assert bench.prepare_method("ngram", tiny_model).k == _REGISTRY["ngram"][1]
    assert bench.prepare_method("ngram@3", tiny_model).k == 3
    assert bench.prepare_method("ngram", tiny_model, k=2).k == 2
    assert bench.prepare_method("ngram@3", tiny_model, k=2).k == 3
    assert bench._effective_k("hf-prompt-lookup", bench.prepare_method("hf-prompt-lookup", tiny_model)) \
        == bench.DEFAULT_K
    assert f"ngram@{bench.DEFAULT_K}" in bench.DEFAULT_METHODS
    assert bench.build_parser().parse_args([]).k is None
