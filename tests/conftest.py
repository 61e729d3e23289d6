"""Shared fixtures: a tiny random Llama (fast unit tests) and the embedded model in fp32."""
from __future__ import annotations

import pytest

from support import make_tiny_llama


@pytest.fixture(scope="session")
def tiny_model():
    return make_tiny_llama(vocab_size=64, sharpness=8.0)


@pytest.fixture(scope="session")
def embedded():
    from specdecode_ref import load_model

    model, tokenizer = load_model(dtype="fp32", device="cpu")
    return model, tokenizer
