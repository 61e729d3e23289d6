"""specdecode_ref: the reference implementation behind the specdecode course.

    from specdecode_ref import load_model, generate, autoregressive_generate, generate_batch
    from specdecode_ref.proposers import NgramProposer
"""
from .engine import GenerationResult, autoregressive_generate, generate
from .batch import generate_batch
from .metrics import SpecStats
from .models import chat_ids, load_model
from .sampling import SamplingParams

__all__ = ["load_model", "chat_ids", "generate", "autoregressive_generate", "generate_batch", "GenerationResult",
           "SamplingParams", "SpecStats"]
__version__ = "0.1.0"
