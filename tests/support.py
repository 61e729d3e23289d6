"""Helpers shared by the tests: a tiny random Llama and a pooled chi-square test.

(Kept out of conftest.py: labs/ has a conftest.py too, and two modules named ``conftest`` on
sys.path shadow each other, so ``from conftest import ...`` would be ambiguous.)
"""
from __future__ import annotations

import torch

from specdecode_ref.stats import chi_square_test


def make_tiny_llama(vocab_size: int = 64, seed: int = 0, sharpness: float = 1.0, layers: int = 2):
    """A randomly initialised Llama small enough for thousands of forwards in a test.

    sharpness scales the output head so next-token distributions are peaked rather than uniform.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpness)
    model.generation_config.eos_token_id = None
    model.requires_grad_(False)
    return model


def chi2_pvalue(counts, probs, min_expected: float = 5.0) -> float:
    """p-value of the package's pooled chi-square goodness-of-fit test (0 if a p = 0 token was drawn)."""
    return chi_square_test(counts, probs, min_expected).pvalue
