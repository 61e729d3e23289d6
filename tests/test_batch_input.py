"""generate_batch refuses bad input with a clear error that names the argument (and the row)."""
import pytest
import torch

from specdecode_ref.batch import generate_batch
from specdecode_ref.proposers import NgramProposer
from specdecode_ref.proposers.draft_model import DraftModelProposer
from support import make_tiny_llama

OK = torch.tensor([1, 2, 3])


@pytest.fixture(scope="module")
def other_vocab():
    return make_tiny_llama(vocab_size=80, layers=1)


CASES = {
    "no prompts": (dict(prompts=[]), ValueError, "prompt list is empty: generate_batch"),
    "one tensor": (dict(prompts=torch.ones(2, 3, dtype=torch.long)), TypeError, "prompts must be a list"),
    "not a list": (dict(prompts=None), TypeError, "prompts must be a list"),
    "empty row": (dict(prompts=[OK, torch.tensor([], dtype=torch.long)]), ValueError, "prompt 1: the prompt is empty"),
    "float row": (dict(prompts=[OK, OK, torch.tensor([1.0, 2.0])]), ValueError, "prompt 2: .*integer token ids"),
    "float list row": (dict(prompts=[[1.5, 2.0], OK]), ValueError, "prompt 0: .*integer token ids"),
    "bool row": (dict(prompts=[OK, torch.tensor([True, False])]), ValueError, "prompt 1: .*integer token ids"),
    "uint8 row": (dict(prompts=[OK, torch.tensor([1, 2], dtype=torch.uint8)]), ValueError,
                  "prompt 1: input_ids are torch.uint8, too narrow for token ids"),
    "2-D row": (dict(prompts=[OK, torch.ones(2, 3, dtype=torch.long)]), ValueError, "prompt 1: input_ids must be 1-D"),
    "3-D row": (dict(prompts=[torch.ones(1, 1, 3, dtype=torch.long)]), ValueError, "prompt 0: input_ids must be 1-D"),
    "string row": (dict(prompts=[OK, "hello"]), TypeError, "prompt 1: input_ids must be a 1-D tensor or list"),
    "id out of vocab": (dict(prompts=[OK, torch.tensor([1, 99])]), ValueError, r"prompt 1: token ids must lie in \[0, 64\)"),
    "negative id": (dict(prompts=[torch.tensor([-1, 2]), OK]), ValueError, r"prompt 0: token ids must lie"),
    "max_new_tokens 0": (dict(max_new_tokens=0), ValueError, "prompt 0: max_new_tokens must be an int >= 1, got 0"),
    "max_new_tokens -3": (dict(max_new_tokens=-3), ValueError, "max_new_tokens must be an int >= 1, got -3"),
    "max_new_tokens float": (dict(max_new_tokens=2.0), ValueError, "max_new_tokens must be an int >= 1, got 2.0"),
    "max_new_tokens bool": (dict(max_new_tokens=True), ValueError, "max_new_tokens must be an int >= 1, got True"),
    "max_new_tokens list too short": (dict(max_new_tokens=[2]), ValueError, "got 1 max_new_tokens for 2 prompts"),
    "max_new_tokens list bad entry": (dict(max_new_tokens=[2, 0]), ValueError, "prompt 1: max_new_tokens .* got 0"),
    "over the context window": (dict(prompts=[OK, torch.zeros(250, dtype=torch.long)], max_new_tokens=10),
                                ValueError, "prompt 1: prompt of 250 tokens .* context window of 256"),
    "sampling not SamplingParams": (dict(sampling={"temperature": 1.0}), TypeError, "sampling must be a SamplingParams"),
    "seeds of the wrong length": (dict(seed=[1, 2, 3]), ValueError, "got 3 seeds for 2 prompts"),
    "seed a float": (dict(seed=1.5), ValueError, "seed must be an int, got 1.5"),
    "seed a string": (dict(seed="7"), ValueError, "seed must be an int, got '7'"),
    "one seed a float": (dict(seed=[1, 2.0]), ValueError, r"seed\[1\] must be an int, got 2.0"),
    "compact_fraction NaN": (dict(compact_fraction=float("nan")), ValueError, "compact_fraction must be a number in"),
    "compact_fraction negative": (dict(compact_fraction=-0.5), ValueError, "compact_fraction must be a number in"),
    "proposer not a Proposer": (dict(proposer="ngram"), TypeError, "proposer must be a specdecode_ref.proposers"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused(tiny_model, case):
    kwargs, error, message = CASES[case]
    kwargs = {"prompts": [OK, OK], "max_new_tokens": 2, **kwargs}
    with pytest.raises(error, match=message):
        generate_batch(tiny_model, **kwargs)


@pytest.mark.parametrize("text, sampling", [("temperature", dict(temperature=-1.0)),
                                            ("temperature", dict(temperature=float("nan"))),
                                            ("top_k", dict(top_k=-1)), ("top_p", dict(top_p=float("nan")))])
def test_bad_sampling_settings_are_refused(tiny_model, text, sampling):
    from specdecode_ref.sampling import SamplingParams

    with pytest.raises(ValueError, match=f"{text} must be"):
        generate_batch(tiny_model, [OK], max_new_tokens=2, sampling=SamplingParams(**sampling))


def test_draft_model_for_another_vocabulary_is_refused(tiny_model, other_vocab):
    with pytest.raises(ValueError, match="the draft model has a vocabulary of 80 tokens .* the target has 64"):
        generate_batch(tiny_model, [OK], proposer=DraftModelProposer(other_vocab, k=2), max_new_tokens=2)


def test_draft_model_on_another_device_is_refused(tiny_model):
    draft = make_tiny_llama(layers=1).to("meta")  # the same vocabulary, another device
    with pytest.raises(ValueError, match="the draft model is on meta but the target is on cpu"):
        generate_batch(tiny_model, [OK], proposer=DraftModelProposer(draft, k=2), max_new_tokens=2)


def test_valid_mixed_rows_still_run(tiny_model):
    """Rows of int32 / int64 tensors, a [1, L] tensor and a list of ints are all prompts."""
    rows = [OK.int(), OK.unsqueeze(0), [1, 2, 3]]
    out = generate_batch(tiny_model, rows, proposer=NgramProposer(k=2), max_new_tokens=3)
    assert [r.tokens.tolist() for r in out] == [out[0].tokens.tolist()] * 3


def test_numpy_int_seeds_are_seeds(tiny_model):
    import numpy as np

    from specdecode_ref.sampling import SamplingParams

    t1 = SamplingParams(temperature=1.0)
    a = generate_batch(tiny_model, [OK, OK], max_new_tokens=3, sampling=t1, seed=np.int64(5))
    b = generate_batch(tiny_model, [OK, OK], max_new_tokens=3, sampling=t1, seed=[5, np.int32(6)])
    assert [r.tokens.tolist() for r in a] == [r.tokens.tolist() for r in b]


def test_numpy_int_budgets_are_budgets(tiny_model):
    """A token budget read from a numpy array (np.int64) is a whole number like an int, in both engines."""
    import numpy as np

    from specdecode_ref import generate

    budgets = np.array([3, 2])
    out = generate_batch(tiny_model, [OK, OK], max_new_tokens=list(budgets), proposer=NgramProposer(k=2))
    assert [len(r.tokens) for r in out] == [3, 2]
    assert generate(tiny_model, OK, max_new_tokens=budgets[0]).tokens.tolist() == out[0].tokens.tolist()
