#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (the zip is unpacked
# in /autograder/source). It installs the course's pinned environment and the embedded model,
# so that run_autograder grades offline exactly as `python -m specdecode_ref.grading` does on the
# course machine. Built for @LAB@ by `python -m specdecode_ref.grading gradescope`.
#
# Settings (environment variables; Gradescope sets none of them, the defaults are for it):
#   AUTOGRADER_ROOT              the folder that plays /autograder (trying the zip locally)
#   SPECDECODE_AUTOGRADER_VENV   where the environment goes (default: source/venv); a folder this
#                                script did not make (no .specdecode-autograder in it) is never replaced
#   SPECDECODE_PYTHON            the Python to build it with (default: the newest python3.x >= 3.11)
#   SPECDECODE_TORCH_INDEX       where the CPU build of torch comes from (empty: the usual index)
set -euo pipefail
# The pip and uv that install the course's pins (those of the course machine's own environment).
PIP_VERSION=26.3
UV_VERSION=0.13.9
ROOT="${AUTOGRADER_ROOT:-/autograder}"
COURSE="$ROOT/source/course"
VENV="${SPECDECODE_AUTOGRADER_VENV:-$ROOT/source/venv}"
TORCH_INDEX="${SPECDECODE_TORCH_INDEX-https://download.pytorch.org/whl/cpu}"
MARKER="$VENV/.specdecode-autograder"  # this script made $VENV: the only kind of folder it deletes
STAMP="$VENV/.specdecode-stamp"        # the pins $VENV was built with

# Never delete or fill a folder this script did not make (the variable may name someone's own
# environment): stop before anything is installed.
if { [ -e "$VENV" ] || [ -L "$VENV" ]; } && [ ! -f "$MARKER" ]; then
  echo "setup.sh: $VENV exists and was not made by this script (it has no $(basename "$MARKER")):" \
       "not touching it. Set SPECDECODE_AUTOGRADER_VENV to a new folder, or remove this one yourself." >&2
  exit 1
fi

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
# apt-get without questions (a changed configuration file keeps its version); its output stays in
# the log, where a failed install says why.
apt_get() {
  DEBIAN_FRONTEND=noninteractive apt-get -y -q -o Dpkg::Options::=--force-confdef \
    -o Dpkg::Options::=--force-confold "$@"
}
if ! PY=$(pick_python) && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  # The system's Python (3.12 on Ubuntu 24.04), else 3.11 from Ubuntu 22.04's own archive.
  echo "setup.sh: no Python >= 3.11 with venv here; installing one with apt-get"
  apt_get update || true
  apt_get install python3 python3-venv || true
  PY=$(pick_python) || { apt_get install python3.11 python3.11-venv || true; }
fi
PY=${PY:-$(pick_python)} || {
  echo "setup.sh: the course needs Python >= 3.11 with its venv module. Choose Gradescope's" \
       "Ubuntu 24.04 base image, or set SPECDECODE_PYTHON." >&2
  exit 1
}

# Every pin the environment depends on; a change in any of them rebuilds it.
stamp() {
  echo "requirements.txt sha256: $(sha256sum < "$COURSE/requirements.txt" | cut -d' ' -f1)"
  echo "embedded model: @EMBEDDED_PIN@"
  echo "pip: $PIP_VERSION"
  echo "uv: $UV_VERSION"
  echo "torch index: $TORCH_INDEX"
  echo "python: $("$PY" -c 'import sys; print(sys.version)')"
}
WANT=$(stamp)

if [ -f "$MARKER" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
  echo "setup.sh: the environment in $VENV already holds these pins"
else
  echo "setup.sh: building the course's environment in $VENV with $($PY --version)"
  if [ -f "$MARKER" ]; then
    rm -rf "$VENV"  # made by this script (a folder without the marker stopped it above)
  fi
  mkdir -p "$VENV"
  echo "made by the course's autograder setup.sh, which may delete and rebuild this folder" > "$MARKER"
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet "pip==$PIP_VERSION" "uv==$UV_VERSION"
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
  printf '%s\n' "$WANT" > "$STAMP"
fi

# The embedded model, converted once into the image (run_autograder finds it at the same place).
export SPECDECODE_CACHE="${SPECDECODE_CACHE:-$VENV/specdecode-cache}"
cd "$COURSE"
PYTHONPATH="$COURSE" "$VENV/bin/python" -c \
  "from specdecode_ref.models import prepare_embedded; print('embedded model:', prepare_embedded(verbose=False))"

if [ "$(id -u)" = 0 ]; then
  # The student's code runs as an unprivileged numeric user id: it may run the environment's
  # Python and import the package, and must not read the lab's grading files. The course folder
  # can be passed through but not listed (as can the folders above it); the labs are root's alone.
  chmod a+x "$ROOT" "$ROOT/source"
  chmod 711 "$COURSE"
  chmod -R go-rwx "$COURSE/labs"
  chmod -R a+rX "$COURSE/specdecode_ref" "$COURSE/requirements.txt" "$VENV"
  # The student side's private folders are made under the system's temporary folder.
  [ -d /tmp ] || install -d -m 1777 /tmp
fi
echo "setup.sh: ready to grade @LAB@"
