#!/usr/bin/env bash
# Run case-study suites under pytest and gather the parity report and JUnit XML as CI artifacts.
#
#   PROFILE=cpu bash ci/run_suites.sh                                   # every suite, cpu profile
#   SUITE=verl_grpo_qwen3_8b_sglang_gfx950 PROFILE=mini ARCH=gfx950 bash ci/run_suites.sh
#   PROFILE=mini bash ci/run_suites.sh -k colocated -x                  # extra args go to pytest
#
# Environment (all optional):
#   SUITE          suite id (file suites/<id>.yaml) or "all" (default: all)
#   PROFILE        full | mini | cpu | cpu-vllm (default: cpu; cpu-vllm: the suites that define it)
#   ARCH           gfx942 | gfx950 | sm_90 | cpu ... (default: detected with trainer.platform.env.detect_arch)
#   ARTIFACTS_DIR  where report-<name>.html, junit-<name>.xml and the runs' small files go
#                  (default: artifacts)
#   RUNS_DIR       run folders (checkpoints included) (default: runs/ci)
#   PYTEST_MARKERS marker expression passed as -m; empty selects every item, overriding the
#                  project's default "not slow and not gpu" (default: empty). Items whose arch,
#                  GPU count or packages do not match this machine are skipped by the suite plugin.
#   PYTHON         interpreter (default: python3)
#   MODEL_DIR, DATA_DIR  read by the suites' full profiles (local model and dataset folders)
#
# Exit status: pytest's. "No tests collected" (pytest exit 5) counts as a failure here: a suite
# and profile named in CI that yield nothing are a misconfiguration.
set -euo pipefail

PYTHON="${PYTHON:-python3}"
SUITE="${SUITE:-all}"
PROFILE="${PROFILE:-cpu}"
ARTIFACTS_DIR="${ARTIFACTS_DIR:-artifacts}"
RUNS_DIR="${RUNS_DIR:-runs/ci}"
PYTEST_MARKERS="${PYTEST_MARKERS:-}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

case "$PROFILE" in
  full|mini|cpu|cpu-vllm) ;;
  *) echo "ci/run_suites.sh: PROFILE=$PROFILE is not a profile; use full, mini, cpu or cpu-vllm" >&2; exit 2 ;;
esac

if [[ "$SUITE" == "all" ]]; then
  target="suites/"
  name="all-${PROFILE}"
else
  target="suites/${SUITE}.yaml"
  if [[ ! -f "$target" ]]; then
    echo "ci/run_suites.sh: SUITE=$SUITE has no file $target; suites here:" >&2
    ls suites/*.yaml >&2 || true
    exit 2
  fi
  name="${SUITE}-${PROFILE}"
fi

if [[ -z "${ARCH:-}" ]]; then
  ARCH="$("$PYTHON" -c 'from trainer.platform.env import detect_arch; print(detect_arch())')"
fi

mkdir -p "$ARTIFACTS_DIR" "$RUNS_DIR"
report="$ARTIFACTS_DIR/report-${name}.html"
junit="$ARTIFACTS_DIR/junit-${name}.xml"
echo "ci/run_suites.sh: $target profile=$PROFILE arch=$ARCH -> $report, $junit"

set +e
"$PYTHON" -m pytest "$target" \
  --arch "$ARCH" --profile "$PROFILE" \
  -m "$PYTEST_MARKERS" \
  --junitxml="$junit" \
  --rlbench-report "$report" \
  --rlbench-out "$RUNS_DIR" \
  -o junit_family=xunit2 -rs \
  "$@"
status=$?
set -e

# The small files of every run (metrics, env.json, per-run reports, logs) travel with the
# artifacts; checkpoints and weights stay in RUNS_DIR.
if [[ -d "$RUNS_DIR" ]]; then
  while IFS= read -r -d '' file; do
    dest="$ARTIFACTS_DIR/runs/${file#"$RUNS_DIR"/}"
    mkdir -p "$(dirname "$dest")"
    cp "$file" "$dest"
  done < <(find "$RUNS_DIR" -type f -size -20M \
             \( -name '*.json' -o -name '*.jsonl' -o -name '*.html' -o -name '*.yaml' -o -name '*.log' -o -name '*.txt' \) \
             -print0)
fi

if [[ "$status" -eq 5 ]]; then
  echo "ci/run_suites.sh: pytest collected no tests from $target (profile $PROFILE, arch $ARCH)" >&2
  exit 1
fi
exit "$status"
