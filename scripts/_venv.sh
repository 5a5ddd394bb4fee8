# Sourced by scripts/serve and scripts/test: make .venv and install the project into it.
# Re-installs when pyproject.toml (or the client's, clients/python/pyproject.toml) changes.
# Usage: . scripts/_venv.sh [dev|bench]   (dev: the dev extra, plus the client distribution in
# clients/python with its plots, editable, which the client, CLI and example tests use; bench:
# the bench extra (EconML for bench.drlearner) into the same .venv, as CI does)
set -euo pipefail
extras="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
stamp=".venv/.installed-$(cat pyproject.toml clients/python/pyproject.toml | sha256sum | cut -c1-16)${extras:+-$extras}"
if [ ! -f "$stamp" ]; then
  echo "installing dependencies into .venv (once) ..." >&2
  if [ -n "$extras" ]; then
    .venv/bin/python -m pip install --quiet -e ".[$extras]"
    # After the server: an older install of the server owned the dpcurator script.
    .venv/bin/python -m pip install --quiet -e "./clients/python[plots]"
  else
    .venv/bin/python -m pip install --quiet -e .
  fi
  touch "$stamp"
fi
