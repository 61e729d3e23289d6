"""``python -m specdecode_ref.grading``: the grader's command line (see cli.py)."""
import sys

from .cli import main

sys.exit(main())
