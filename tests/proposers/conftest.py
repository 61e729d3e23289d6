"""Fixtures the drafter tests share: a 4-layer tiny target and a corpus of its own answers."""
import pytest
import torch

from support import make_tiny_llama
from specdecode_ref import autoregressive_generate
from specdecode_ref.training import distill


@pytest.fixture(scope="module")
def target4():
    return make_tiny_llama(vocab_size=64, sharpness=1.0, seed=3, layers=4, init_range=0.3)


@pytest.fixture(scope="module")
def tiny_corpus(target4):
    """48 random prompts with the target's greedy answers, scored by the teacher pass (features kept)."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 64, (6,), generator=g) for _ in range(48)]
    pairs = [(p, autoregressive_generate(target4, p, max_new_tokens=20).tokens) for p in prompts]
    return distill.teacher_pass(target4, pairs, top_k=8, keep_hidden=True, batch_tokens=256)
