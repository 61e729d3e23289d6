"""Shared fixtures: a tiny random Llama (fast unit tests) and the embedded model in fp32.

Every test that uses the real model carries the ``embedded`` marker, so ``pytest -m "not embedded"``
(``make test-fast``) runs the unit tests alone. Tests that take the ``embedded`` fixture are marked
here; tests that load the model in a fixture of their own add
it to REAL_MODEL_FIXTURES or say ``@pytest.mark.embedded`` themselves.
"""
from __future__ import annotations

import pytest

from support import make_tiny_llama


@pytest.fixture(autouse=True)
def _full_size(monkeypatch):
    """The tests below run at one size whatever the notebooks' switch says: `make test` sets
    SPECDECODE_SMALL_RUN=1 for the notebooks, and the tests share their worker processes. Drafts
    are of the fixed sizes (see below)."""
    from specdecode_ref.measure.harness.run_size import SWITCH

    monkeypatch.delenv(SWITCH, raising=False)
    # load_proposer without k drafts at the fixed sizes here, whatever this machine would choose: a
    # test about a drafter needs it to draft (a sized one may stand aside). The tests of the sizing
    # itself (proposers/test_sized_defaults.py) lift this.
    monkeypatch.setenv("SPECDECODE_DRAFT_SIZES", "fixed")


@pytest.fixture(scope="session")
def tiny_model():
    return make_tiny_llama(vocab_size=64, sharpness=8.0)


@pytest.fixture(scope="session")
def embedded():
    """The embedded model in fp32 on the CPU (SPECDECODE_TEST_DEVICE=cuda puts it on a GPU:
    ``python -m specdecode_ref.measure.gpu_check`` runs the exactness matrix that way)."""
    import os

    from specdecode_ref import load_model

    model, tokenizer = load_model(dtype="fp32", device=os.environ.get("SPECDECODE_TEST_DEVICE", "cpu"))
    return model, tokenizer


# Fixtures that load the real model (fixturenames is transitive: a fixture built on these counts).
REAL_MODEL_FIXTURES = {"embedded", "model_and_tok"}


def pytest_collection_modifyitems(items):
    for item in items:
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.embedded)
