"""layer_analysis on a tiny random Llama: the logit lens and layer skipping agree with the model's own
forward where they must, and the layer-call trace shows what KV reuse saves."""
import copy

import pytest
import torch

from support import make_tiny_llama
from specdecode_ref import generate
from specdecode_ref.measure import layer_analysis as la
from specdecode_ref.proposers.early_exit import EarlyExitProposer, build_adapter


@pytest.fixture(scope="module")
def model():
    return make_tiny_llama(vocab_size=64, sharpness=1.0, seed=3, layers=4, init_range=0.3)


@pytest.fixture(scope="module")
def seqs(model):
    return la.answer_sequences(model, [torch.tensor([5, 9, 2, 33, 7]), torch.tensor([1, 4, 4, 60])], 16)


def test_answer_sequences_hold_prompt_then_greedy_answer(model, seqs):
    s = seqs[0]
    assert s.start == 5 and s.ids.numel() == 5 + 16
    assert s.positions.tolist() == list(range(4, 20))
    logits = model(input_ids=s.ids[None]).logits[0]
    assert torch.equal(logits[s.positions].argmax(-1), s.ids[s.start:])  # the target's own greedy text


def test_residual_stream_matches_hf_hidden_states(model, seqs):
    ids = seqs[0].ids
    mine = la.residual_stream(model, ids)
    hf = model(input_ids=ids[None], output_hidden_states=True).hidden_states
    assert len(mine) == model.config.num_hidden_layers + 1
    for L in range(model.config.num_hidden_layers):  # HF's last entry is after the final norm
        torch.testing.assert_close(mine[L], hf[L][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.model.norm(mine[-1]), hf[-1][0], atol=1e-5, rtol=1e-5)


def test_exit_agreement_last_layer_is_exact_and_matches_skipping_the_end(model, seqs):
    lens = la.exit_agreement(model, seqs, topk=3)
    n = model.config.num_hidden_layers
    assert lens["layers"] == list(range(1, n + 1)) and lens["positions"] == 32
    assert lens["top1"][-1] == 1.0 and lens["top3"][-1] == 1.0
    assert all(t1 <= t3 for t1, t3 in zip(lens["top1"], lens["top3"]))
    end = la.skip_agreement(model, seqs, [1, 2, 3], where="end")  # skipping the last s = exiting at N - s
    for s, a in zip(end["num_skipped"], end["top1"]):
        assert a == pytest.approx(lens["top1"][n - s - 1])


def test_skip_predictions_equal_a_model_without_those_layers(model, seqs):
    ids = seqs[1].ids
    assert torch.equal(la.skip_predictions(model, ids, []), model(input_ids=ids[None]).logits[0].argmax(-1))
    short = copy.deepcopy(model)
    short.model.layers = torch.nn.ModuleList([short.model.layers[i] for i in (0, 3)])
    short.config.num_hidden_layers = 2
    expect = short(input_ids=ids[None], use_cache=False).logits[0].argmax(-1)
    assert torch.equal(la.skip_predictions(model, ids, la.middle_block(4, 2)), expect)
    res = la.skip_agreement(model, seqs, [0, 2])
    assert res["top1"][0] == 1.0 and list(res["blocks"][1]) == [1, 2]


def test_bad_arguments(model, seqs):
    with pytest.raises(ValueError):
        la.exit_agreement(model, seqs, layers=[0])
    with pytest.raises(ValueError):
        la.middle_block(4, 4)
    with pytest.raises(ValueError):
        la.skip_agreement(model, seqs, [1], where="start")
    with pytest.raises(ValueError):
        la.exit_agreement(model, [(torch.tensor([1, 2]), 2)])


@pytest.mark.parametrize("reuse", [True, False])
def test_trace_shows_what_kv_reuse_skips(model, reuse):
    k, L = 3, 2
    p = EarlyExitProposer(model, build_adapter(model, L), k=k, reuse_kv=reuse)
    trace = la.LayerCallTrace(model, p)
    with trace.recording():
        generate(model, torch.tensor([5, 9, 2, 33, 7]), proposer=p, max_new_tokens=20)
    assert "propose" not in p.__dict__ and "score" not in p.__dict__  # the wrappers are removed
    table = la.schedule_table(trace, 1, L)
    early, late = table.loc["layers 0..1"], table.loc["layers 2..3"]
    assert list(late) == ["verify"] * (k + 1)  # the late layers run only in verification
    assert list(table.loc["exit adapter"])[:k] == ["draft"] * k
    assert early["d3"] == "verify"  # the last draft token never went through the early layers
    want = "draft" if reuse else "draft, verify"  # reuse: computed once; no reuse: twice
    assert list(early[:k]) == [want] * k
    n = model.config.num_hidden_layers
    assert la.count_layer_positions(trace, "draft", 1) == L * k
    assert la.count_layer_positions(trace, "verify", 1) == (n - L) * (k + 1) + L * (1 if reuse else k + 1)


def test_verification_paths_times_the_same_work_two_ways(model, monkeypatch):
    out = la.verification_paths(model, 4, context_len=12, repeats=2, warmup=1)
    assert out["n"] == 4 and out["context_len"] == 12
    assert out["forward_s"] > 0 and out["loop_s"] > 0
    assert out["loop_over_forward"] == pytest.approx(out["loop_s"] / out["forward_s"])
    with pytest.raises(ValueError):
        la.verification_paths(model, 0)
    with pytest.raises(ValueError):
        la.verification_paths(model, 2, repeats=0)
    # A loop that skips a layer does other work than the forward: the comparison refuses it.
    real = la.run_layers
    monkeypatch.setattr(la, "run_layers", lambda m, h, pos, layers, *a: real(m, h, pos, list(layers)[:-1], *a))
    with pytest.raises(AssertionError, match="differ"):
        la.verification_paths(model, 4, context_len=12, repeats=1, warmup=0)
