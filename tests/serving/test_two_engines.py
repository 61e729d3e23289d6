"""vLLM's load sweep and the two-engine comparison without vLLM: the refill loop on a scripted
engine (exactly L requests in flight), the rows computed from step times, the side-by-side table,
the crossover load and the token-for-token comparison on synthetic rows."""
import importlib.util
from types import SimpleNamespace

import pandas as pd
import pytest

from specdecode_ref.serving import vllm_runner as V
from specdecode_ref.serving.compare import compare_outputs, crossover_loads, side_by_side


def _job_module():
    spec = importlib.util.spec_from_file_location("vllm_job", V.JOB_SCRIPT)
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)  # stdlib only at import time
    return job


class ScriptedEngine:
    """Stands in for LLM.llm_engine: every step, each request in flight gets `per_step` new tokens
    (DELTA outputs) until it has `lengths[prompt]`; records how many were in flight at each step."""

    def __init__(self, lengths, per_step=1):
        self.lengths, self.per_step = lengths, per_step
        self.active, self.in_flight_per_step, self.added, self.added_per_step = {}, [], 0, []

    def add_request(self, request_id, prompt, params):
        self.active[request_id] = [prompt, 0]
        self.added += 1
        return request_id + "-internal"

    def step(self):
        self.in_flight_per_step.append(len(self.active))
        self.added_per_step.append(self.added)
        outs = []
        for rid, state in list(self.active.items()):
            prompt, done = state
            n = min(self.per_step, self.lengths[prompt] - done)
            state[1] += n
            finished = state[1] == self.lengths[prompt]
            outs.append(SimpleNamespace(request_id=rid, finished=finished,
                                        outputs=[SimpleNamespace(token_ids=[100 * prompt + done + j for j in range(n)])]))
            if finished:
                del self.active[rid]
        return outs


def _clock():
    t = [0.0]

    def clock():
        t[0] += 1.0
        return t[0]
    return clock


@pytest.mark.parametrize("load", [1, 2, 3, 10])
def test_refill_keeps_exactly_load_requests_in_flight(load):
    job = _job_module()
    lengths = [3, 1, 4, 2, 5]
    engine = ScriptedEngine(lengths)
    served = job.serve_at_load(engine, list(range(5)), None, load, clock=_clock())
    assert served["tokens"] == [[100 * p + i for i in range(n)] for p, n in enumerate(lengths)]
    assert served["max_in_flight"] == min(load, 5)
    assert max(engine.in_flight_per_step) == min(load, 5)
    # while some request still waits, every step has exactly `load` in flight
    waiting = [n for n, added in zip(engine.in_flight_per_step, engine.added_per_step) if added < 5]
    assert all(n == load for n in waiting)
    assert (len(waiting) > 0) == (load < 5)
    assert sum(c for chunks in served["chunks"] for _, c in chunks) == sum(lengths)
    with pytest.raises(ValueError, match="at least 1"):
        job.serve_at_load(engine, [0], None, 0)


def test_rows_from_step_times_use_the_course_definitions():
    # load 1, two requests: the first emits at t = 1, 2 (2 tokens), 3; the second waits, then 4, 5 (3 tokens)
    result = {"startup_s": 9.0, "loads": [{
        "load": 1, "wall_s": 5.0, "max_in_flight": 1,
        "tokens": [[1, 2, 3, 4], [5, 6, 7, 8]],
        "chunks": [[[1.0, 1], [2.0, 2], [3.0, 1]], [[4.0, 1], [5.0, 3]]],
        "metrics": {V.DRAFTS: 3, V.DRAFT_TOKENS: 12, V.ACCEPTED_TOKENS: 3, V.ACCEPTED_PER_POS: [2, 1, 0, 0]}}]}
    (row,) = V.sweep_rows(result, V.ngram_config(k=4))
    assert (row["engine"], row["load"], row["policy"], row["k"]) == ("vLLM", 1, "on", 4)
    assert row["output_tokens"] == 8 and row["throughput_tok_s"] == pytest.approx(8 / 5)
    assert row["ttft_p50_s"] == pytest.approx(2.5)         # TTFTs 1 and 4: waiting for a place counts
    assert row["itl_p50_s"] == pytest.approx(1.0)          # one gap per chunk: 1, 1, 1
    assert row["tpot_mean_s"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert row["tpot_per_request_s"] == pytest.approx([2 / 3, 1 / 3])  # per prompt, in prompt order
    assert row["tau"] == pytest.approx((3 + 3) / 3)        # tokens after the first, per verification step
    assert row["acceptance_rate"] == pytest.approx(0.25)
    assert row["vllm_mean_acceptance_length"] == pytest.approx(2.0)
    assert row["spec_decode_num_accepted_tokens_per_pos"] == [2, 1, 0, 0]
    assert row["outputs"] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    (off,) = V.sweep_rows({"loads": [dict(result["loads"][0], metrics={})]}, None)
    assert (off["policy"], off["k"], off["acceptance_rate"], off["vllm_mean_acceptance_length"]) == ("off", 0, 0.0, 1.0)


def test_sweep_refuses_bad_input(tmp_path):
    with pytest.raises(ValueError, match="at least 1"):
        V.run_vllm_sweep(tmp_path, [[1, 2]], loads=(0, 2), max_tokens=4)
    with pytest.raises(ValueError, match="dtype"):
        V.run_vllm_sweep(tmp_path, [[1, 2]], loads=(1,), max_tokens=4, dtype="fp16")
    with pytest.raises(ValueError, match="empty prompt"):
        V.run_vllm_sweep(tmp_path, [[]], loads=(1,), max_tokens=4)


def _rows(engine, throughput, itl):
    """Synthetic sweep rows: {(load, policy): value}."""
    return pd.DataFrame([{"engine": engine, "load": load, "policy": pol, "throughput_tok_s": throughput[load, pol],
                          "itl_p50_s": itl[load, pol], "acceptance_rate": 0.5 if pol == "on" else 0.0}
                         for load, pol in throughput])


def test_side_by_side_and_crossover_on_synthetic_rows():
    # ours: on wins at loads 1 and 2, loses at 4 and 8; vLLM: on wins at every load
    ours = _rows("x", {(1, "off"): 10, (1, "on"): 20, (2, "off"): 18, (2, "on"): 25, (4, "off"): 30, (4, "on"): 28,
                       (8, "off"): 50, (8, "on"): 52, (4, "adaptive"): 31},
                 {(1, "off"): .1, (1, "on"): .2, (2, "off"): .1, (2, "on"): .2, (4, "off"): .1, (4, "on"): .2,
                  (8, "off"): .1, (8, "on"): .2, (4, "adaptive"): .1})
    theirs = _rows("y", {(1, "off"): 10, (1, "on"): 15, (4, "off"): 30, (4, "on"): 31},
                   {(1, "off"): .2, (1, "on"): .1, (4, "off"): .2, (4, "on"): .3})
    table = side_by_side(ours, theirs)
    assert list(table.engine.unique()) == ["ours", "vLLM"]
    assert set(table.policy) == {"off", "on"}                       # adaptive left out: vLLM has none
    assert list(table[table.engine == "ours"].policy[:2]) == ["off", "on"]
    on_ours_1 = table[(table.engine == "ours") & (table.load == 1) & (table.policy == "on")]
    assert on_ours_1.on_vs_off.item() == pytest.approx(2.0)
    # the first load where on stops beating off, even if it wins again later (load 8)
    assert crossover_loads(table) == {"ours": 4, "vLLM": None}
    # a latency: lower is better, so on "wins" only where its ITL is smaller
    assert crossover_loads(table, "itl_p50_s") == {"ours": 1, "vLLM": 4}
    with pytest.raises(ValueError, match="no column"):
        crossover_loads(table, "goodput")
    with pytest.raises(ValueError, match="lack the columns"):
        side_by_side(ours.drop(columns="policy"), theirs)


def test_repeats_are_summarised_by_their_median():
    rows = pd.DataFrame([{"load": 1, "policy": p, "throughput_tok_s": v} for p, v in
                         (("off", 10), ("off", 12), ("off", 30), ("on", 11), ("on", 13), ("on", 1))])
    table = side_by_side(rows, rows)
    assert table[(table.engine == "ours") & (table.policy == "off")].throughput_tok_s.item() == 12
    assert crossover_loads(table) == {"ours": 1, "vLLM": 1}  # median on 11 < median off 12


def test_the_side_by_side_plot_draws_a_line_per_engine_and_policy():
    import matplotlib

    matplotlib.use("Agg")
    from specdecode_ref.serving.viz import plot_side_by_side

    rows = _rows("x", {(1, "off"): 10, (1, "on"): 20, (4, "off"): 30, (4, "on"): 28},
                 {(1, "off"): .1, (1, "on"): .05, (4, "off"): .1, (4, "on"): .2})
    table = side_by_side(rows, rows)
    fig = plot_side_by_side(table, crossovers=crossover_loads(table))
    assert [len(ax.get_lines()) for ax in fig.axes] == [4 + 2, 4 + 2]  # 2 engines x 2 policies + 2 crossovers
