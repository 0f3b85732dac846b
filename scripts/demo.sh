#!/usr/bin/env bash
# Why this exists: the one command that shows graphed at work: it sets up (scripts/setup.sh, which
# installs graphed into .venv) and runs bench/demo.py, a small DiT-like model timed eager and
# through graphed.GraphedForward (on a machine with no GPU: on the CPU, eager only, saying why
# graphs are unavailable). scripts/test.sh afterwards keeps the build this one made.
# Extra arguments go to bench/demo.py (for example --blocks 8 or --device cpu).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
echo
exec .venv/bin/python bench/demo.py "$@"
