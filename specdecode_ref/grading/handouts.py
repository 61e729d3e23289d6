"""What students get: a lab without its hidden tests, worked solution, planted bugs and mutants."""
from __future__ import annotations

import shutil
from pathlib import Path

from .labs import Lab


def handout(lab_dir, out) -> Path:
    """Copy what students get: the notebook with its outputs cleared, student.py, reference.py
    (for the notebook's reference switch), README.md and the visible grading tests. Withheld:
    the hidden tests, solution.py, planted_bugs/ and mutants/."""
    import nbformat

    lab = Lab.open(lab_dir)
    dest = Path(out) / lab.name
    dest.mkdir(parents=True, exist_ok=True)
    for nb_path in sorted(lab.dir.glob("*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        nbformat.write(nb, dest / nb_path.name)
    for f in ["student.py", "reference.py", "README.md", *[p.name for p in lab.visible_files]]:
        if (lab.dir / f).is_file():
            shutil.copy(lab.dir / f, dest / f)
    return dest
