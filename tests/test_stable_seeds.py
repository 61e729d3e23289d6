"""Test code never seeds (or does anything else) with the builtin ``hash()``: a str's hash changes
from process to process (PYTHONHASHSEED), so a rare failure seeded by it could not be reproduced.
Seed with fixed ints, a case's place in a sorted list, or ``zlib.crc32(name.encode())``."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def builtin_hash_calls(paths) -> list:
    """'file:line' for every call of the builtin ``hash`` (a bare name, not ``obj.hash``)."""
    found = []
    for path in paths:
        tree = ast.parse(Path(path).read_text(), filename=str(path))
        found += [f"{Path(path).relative_to(ROOT) if Path(path).is_relative_to(ROOT) else path}:{node.lineno}"
                  for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "hash"]
    return found


def test_the_finder_sees_a_hash_seed(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text("import torch\n\ndef test_x(name='a'):\n"
                       "    g = torch.Generator().manual_seed(hash(name) % 2**31)\n    obj.hash(1)\n")
    assert builtin_hash_calls([planted]) == [f"{planted}:4"]


def test_no_test_seeds_with_the_per_process_str_hash():
    files = sorted(ROOT.joinpath("tests").rglob("*.py")) + [ROOT / "conftest.py"]
    assert builtin_hash_calls(files) == [], (
        "hash() of a str changes per process (PYTHONHASHSEED): seed with a fixed int or zlib.crc32(name.encode())")
