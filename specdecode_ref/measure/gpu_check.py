"""Check a GPU end to end in one command: the cost curve, the exactness matrix and every notebook.

    python -m specdecode_ref.measure.gpu_check            # on a machine with CUDA
    python -m specdecode_ref.measure.gpu_check --dry-run  # print the steps without running them

Three steps, each reported as it finishes, with a summary at the end (exit status 0 only if all pass):

1. the cost curve T(n) of the embedded model on the GPU, bf16 and fp32, n = 1..513 (a GPU reads
   the weights at its bandwidth with its own libraries, so the eager backend runs there);
2. the exactness matrix (``tests/test_exactness_matrix.py``: every proposer on every path, greedy
   output equal to plain decoding) and the engine and batch tests, with the model on CUDA
   (``SPECDECODE_TEST_DEVICE=cuda``);
3. every notebook at its small size (``SPECDECODE_SMALL_RUN=1``), where ``load_model`` picks CUDA.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ["tests/test_exactness_matrix.py", "tests/test_engine.py", "tests/test_batch.py"]


def steps(device: str) -> list:
    """``[(name, argv, extra environment)]`` of the check on ``device``."""
    py = sys.executable
    env_tests = {"SPECDECODE_TEST_DEVICE": device}
    return [
        ("cost curve", [py, "-m", "specdecode_ref.measure.gpu_check", "--curve-only", "--device", device], {}),
        ("exactness matrix", [py, "-m", "pytest", "-q", "-m", "not vllm", *TESTS], env_tests),
        ("notebooks (small)", [py, "-m", "pytest", "-q", "--nbval-lax", "notebooks"], {"SPECDECODE_SMALL_RUN": "1"}),
    ]


def cost_curve(device: str) -> None:
    import torch

    from .. import load_model
    from .harness.bench import format_cost_curve, measure_cost_curve

    for dtype in ("bf16", "fp32"):
        model, _ = load_model(device=device, dtype=dtype)
        name = torch.cuda.get_device_name() if device.startswith("cuda") else device
        print(f"{name}, {dtype}:")
        curve = measure_cost_curve(model, ns=[1, 2, 3, 5, 9, 17, 33, 65, 129, 257, 513], repeats=10, warmup=3)
        print(format_cost_curve(curve))
        del model
        if device.startswith("cuda"):
            torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dry-run", action="store_true", help="print the steps, run nothing")
    ap.add_argument("--curve-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.curve_only:
        cost_curve(args.device)
        return 0
    plan = steps(args.device)
    if args.dry_run:
        for name, argv_, env in plan:
            print(f"{name}: {' '.join(f'{k}={v}' for k, v in env.items())} {' '.join(argv_)}".replace(": ", ":  ", 1))
        return 0
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("No CUDA device is visible to torch here: nothing to check. Run this on the GPU machine "
              "(or pass --device cpu to run the same steps on the CPU).", file=sys.stderr)
        return 2
    results = []
    for name, argv_, env in plan:
        t0 = time.perf_counter()
        print(f"==> {name}", flush=True)
        rc = subprocess.run(argv_, cwd=ROOT, env={**os.environ, **env}).returncode
        results.append((name, rc, time.perf_counter() - t0))
    print("\nGPU check:")
    for name, rc, secs in results:
        print(f"  {'PASS' if rc == 0 else 'FAIL'}  {name}  ({secs:.0f} s)")
    return 0 if all(rc == 0 for _, rc, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
