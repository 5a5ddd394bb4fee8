# Sourced by scripts/serve and scripts/test: make .venv and install the project into it.
# Re-installs when pyproject.toml changes. Usage: . scripts/_venv.sh [dev]
set -euo pipefail
extras="${1:-}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)${extras:+-$extras}"
if [ ! -f "$stamp" ]; then
  echo "installing dependencies into .venv (once) ..." >&2
  if [ -n "$extras" ]; then
    .venv/bin/python -m pip install --quiet -e ".[$extras]"
  else
    .venv/bin/python -m pip install --quiet -e .
  fi
  touch "$stamp"
fi
