"""Training autocasts to bf16 only where bf16 is computed natively: emulated bf16 on a CPU without
AVX512-BF16/AMX made a live training step tens of times slower than plain fp32."""
import torch

from specdecode_ref.training import loop


def test_autocast_is_a_no_op_on_a_cpu_without_native_bf16(monkeypatch):
    monkeypatch.setattr(loop, "cpu_supports_bf16", lambda: False)
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with loop.autocast("cpu"):
        assert (a @ b).dtype == torch.float32


def test_autocast_uses_bf16_on_a_cpu_with_native_bf16(monkeypatch):
    monkeypatch.setattr(loop, "cpu_supports_bf16", lambda: True)
    a, b = torch.randn(4, 8), torch.randn(8, 3)
    with loop.autocast("cpu"):
        assert (a @ b).dtype == torch.bfloat16
