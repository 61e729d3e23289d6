import pytest
import torch

from specdecode_ref.sampling import SamplingParams, apply_top_k, apply_top_p, logits_to_probs, next_token


def test_greedy_is_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.9]])
    probs = logits_to_probs(logits, SamplingParams(temperature=0.0))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]
    assert next_token(logits[0], SamplingParams()).item() == 1


def test_temperature_one_is_softmax():
    logits = torch.randn(3, 10)
    torch.testing.assert_close(logits_to_probs(logits, SamplingParams(temperature=1.0)), torch.softmax(logits, -1))


def test_low_temperature_approaches_greedy():
    logits = torch.tensor([0.0, 1.0, 0.5])
    probs = logits_to_probs(logits, SamplingParams(temperature=0.01))
    assert probs[1] > 0.999


def test_top_k_keeps_k_tokens():
    logits = torch.tensor([1.0, 5.0, 3.0, 4.0, 2.0])
    probs = logits_to_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (probs > 0).tolist() == [False, True, False, True, False]
    assert probs.sum().item() == pytest.approx(1.0)
    assert torch.equal(apply_top_k(logits, 0), logits)


def test_top_p_smallest_nucleus():
    probs_in = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs_in.log()
    kept = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.8)) > 0
    assert kept.tolist() == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8
    kept = logits_to_probs(logits, SamplingParams(temperature=1.0, top_p=0.81)) > 0
    assert kept.tolist() == [True, True, True, False]
    kept = apply_top_p(logits, 0.01) > float("-inf")
    assert kept.tolist() == [True, False, False, False]  # the top token always survives


@pytest.mark.parametrize("kwargs", [dict(temperature=-1.0), dict(temperature=float("nan")),
                                    dict(temperature=float("inf")), dict(temperature=True), dict(top_k=-3),
                                    dict(top_k=2.5), dict(top_k=True), dict(top_p=0.0), dict(top_p=1.5),
                                    dict(top_p=float("nan"))])
def test_bad_params_raise(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_nan_temperature_in_generate_is_a_clear_error(tiny_model):
    from specdecode_ref import generate

    with pytest.raises(ValueError, match="temperature must be a finite number"):
        generate(tiny_model, torch.tensor([1, 2, 3]), max_new_tokens=4,
                 sampling=SamplingParams(temperature=float("nan")))
