import numpy as np
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
                                    dict(top_p=float("nan")), dict(top_p=True), dict(top_p="0.9"),
                                    dict(temperature="0.7"), dict(top_k=np.int64(-1))])
def test_bad_params_raise(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        SamplingParams(**kwargs)


def test_nan_temperature_in_generate_is_a_clear_error(tiny_model):
    from specdecode_ref import generate

    with pytest.raises(ValueError, match="temperature must be a finite number"):
        generate(tiny_model, torch.tensor([1, 2, 3]), max_new_tokens=4,
                 sampling=SamplingParams(temperature=float("nan")))


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=float("nan")), "temperature must be a finite number >= 0 (0 = greedy), got nan"),
    (dict(temperature=float("-inf")), "temperature must be a finite number >= 0 (0 = greedy), got -inf"),
    (dict(temperature=-0.5), "temperature must be a finite number >= 0 (0 = greedy), got -0.5"),
    (dict(top_k=-2), "top_k must be an int >= 0 (0 = no top-k filter), got -2"),
    (dict(top_p=True), "top_p must be in (0, 1] (1 = no nucleus filter), got True"),
    (dict(top_p=1.0000001), "top_p must be in (0, 1] (1 = no nucleus filter), got 1.0000001"),
])
def test_bad_params_name_the_argument_and_the_value(kwargs, message):
    with pytest.raises(ValueError) as err:
        SamplingParams(**kwargs)
    assert str(err.value) == message


def test_numpy_numbers_are_settings_stored_as_python_numbers():
    params = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(3), top_p=np.float64(0.9))
    assert params == SamplingParams(temperature=0.5, top_k=3, top_p=0.9)
    assert [type(v) for v in (params.temperature, params.top_k, params.top_p)] == [float, int, float]


def _tampered(field, value):
    """Valid settings whose frozen field was changed afterwards (as an edited unpickled state would)."""
    params = SamplingParams(temperature=1.0)
    object.__setattr__(params, field, value)
    return params


def _run(entry, model, params):
    from specdecode_ref import generate
    from specdecode_ref.batch import generate_batch
    from specdecode_ref.serving.scheduler import Scheduler, serve

    prompt = torch.tensor([1, 2, 3])
    if entry == "generate":
        generate(model, prompt, max_new_tokens=4, sampling=params)
    elif entry == "generate_batch":
        generate_batch(model, [prompt, prompt], max_new_tokens=4, sampling=params)
    elif entry == "Scheduler":
        Scheduler(model, sampling=params)
    else:
        serve(model, [prompt], max_new_tokens=4, sampling=params)


@pytest.mark.parametrize("field, value", [("temperature", float("nan")), ("temperature", -1.0), ("top_k", -1),
                                          ("top_p", 0.0)])
@pytest.mark.parametrize("entry", ["generate", "generate_batch", "Scheduler", "serve"])
def test_every_entry_point_checks_the_settings_it_is_given(tiny_model, entry, field, value):
    """generate, generate_batch and the scheduler check the settings themselves, not only
    SamplingParams' constructor: a field changed afterwards is refused with the constructor's
    message, before any forward (NaN used to surface as a torch error inside sampling; a negative
    top_k or a top_p of 0 silently meant no filter)."""
    with pytest.raises(ValueError, match=f"^{field} must be .* got {value!r}$"):
        _run(entry, tiny_model, _tampered(field, value))
