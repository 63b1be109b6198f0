"""Every suite and profile named in the CI workflows and scripts exists in suites/, and every suite
in suites/ runs in CI. Suites are `suites/<id>.yaml` with `profiles:` keys full, mini and cpu, and
optionally cpu-vllm (run in CI for the suites that define it)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = {p.stem: p for p in sorted((ROOT / ".github" / "workflows").glob("*.yml"))}
PROFILES = {"full", "mini", "cpu"}  # every suite has these
OPTIONAL = {"cpu-vllm"}  # some suites have these
CASE_STUDIES = {
    "verl_grpo_qwen3_8b_sglang_gfx950",
    "verl_dapo_qwen25_math_7b_fully_async_gfx942",
    "verl_geo3k_qwen35_35b_a3b_moe_gfx950",
    "miles_grpo_qwen3_30b_a3b_gfx942",
    "miles_retool_qwen25_32b_gfx942",
}


def _workflow(name: str) -> dict[str, Any]:
    data = yaml.safe_load(WORKFLOWS[name].read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the bare key `on` as a boolean
    return data


def _suite(suite_id: str) -> dict[str, Any]:
    path = ROOT / "suites" / f"{suite_id}.yaml"
    assert path.is_file(), f"{path.relative_to(ROOT)} is named in CI but does not exist"
    return yaml.safe_load(path.read_text())


def _named_in(workflow: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(suite ids, profiles) a workflow names: matrices, includes, dispatch options, step env."""
    suites: set[str] = set()
    profiles: set[str] = set()
    inputs = (workflow["on"].get("workflow_dispatch") or {}).get("inputs", {})
    suites |= set(inputs.get("suite", {}).get("options", [])) - {"all"}
    profiles |= set(inputs.get("profile", {}).get("options", []))
    for job in workflow["jobs"].values():
        matrix = (job.get("strategy") or {}).get("matrix", {})
        suites |= set(matrix.get("suite", []))
        suites |= {entry["suite"] for entry in matrix.get("include", []) if "suite" in entry}
        for step in job.get("steps", []):
            profile = (step.get("env") or {}).get("PROFILE")
            if profile and "${{" not in profile:
                profiles.add(profile)
    return suites, profiles


@pytest.mark.parametrize("name", ["cpu", "amd", "nvidia"])
def test_workflow_suites_and_profiles_exist(name: str) -> None:
    suites, profiles = _named_in(_workflow(name))
    assert suites == CASE_STUDIES, f"{name}.yml suites differ from the case studies"
    assert profiles and profiles <= PROFILES | OPTIONAL
    for suite_id in sorted(suites):
        suite = _suite(suite_id)
        assert suite.get("id") == suite_id, f"suites/{suite_id}.yaml has id {suite.get('id')!r}"
        assert PROFILES <= set(suite.get("profiles") or {}), (
            f"suites/{suite_id}.yaml lacks profiles {sorted(PROFILES - set(suite.get('profiles') or {}))}"
        )


def test_every_suite_file_runs_in_ci() -> None:
    on_disk = {p.stem for p in (ROOT / "suites").glob("*.yaml")}
    named = set().union(*(_named_in(_workflow(name))[0] for name in WORKFLOWS))
    assert on_disk <= named, f"suites not run by any workflow: {sorted(on_disk - named)}"


def test_profiles_per_trigger() -> None:
    cpu = _workflow("cpu")
    assert set(cpu["on"]) == {"push", "pull_request"}
    assert _named_in(cpu)[1] == {"cpu", "cpu-vllm"}
    vllm_job = cpu["jobs"]["suites-vllm"]
    run = next(st for st in vllm_job["steps"] if (st.get("env") or {}).get("PROFILE") == "cpu-vllm")
    assert "-k" not in run["run"]  # every check of the profile, golden values included
    for suite_id in vllm_job["strategy"]["matrix"]["suite"]:
        assert "cpu-vllm" in _suite(suite_id)["profiles"], suite_id
    amd = _workflow("amd")
    assert set(amd["on"]) == {"pull_request", "schedule", "workflow_dispatch"}
    steps = {job_id: job["steps"] for job_id, job in amd["jobs"].items()}
    profile_of = {job_id: next(s["env"]["PROFILE"] for s in st if "PROFILE" in (s.get("env") or {}))
                  for job_id, st in steps.items()}
    assert profile_of == {"mini": "mini", "nightly": "full", "on-demand": "${{ inputs.profile }}"}
    assert "pull_request" in amd["jobs"]["mini"]["if"] and "schedule" in amd["jobs"]["nightly"]["if"]


def test_amd_runners_and_container() -> None:
    amd = _workflow("amd")
    for job in amd["jobs"].values():
        labels = job["runs-on"]
        assert labels[:3] == ["self-hosted", "linux", "rocm"]
        assert labels[3] in {"${{ matrix.arch }}", "${{ inputs.arch }}"}
        options = job["container"]["options"]
        for flag in ("--device=/dev/kfd", "--device=/dev/dri", "--group-add video", "--ipc=host",
                     "--shm-size=64g", "--security-opt seccomp=unconfined", "--cap-add=SYS_PTRACE"):
            assert flag in options, flag
        assert "/data/models:/models:ro" in job["container"]["volumes"]
    assert amd["env"]["MODEL_DIR"] == "/models" and amd["env"]["DATA_DIR"] == "/datasets"
    assert set(amd["jobs"]["mini"]["strategy"]["matrix"]["arch"]) == {"gfx942", "gfx950"}
    assert set(amd["on"]["workflow_dispatch"]["inputs"]) == {"suite", "arch", "profile"}
    assert set(amd["on"]["workflow_dispatch"]["inputs"]["arch"]["options"]) == {"gfx942", "gfx950"}


def test_nightly_runs_each_suite_on_its_published_arch() -> None:
    include = _workflow("amd")["jobs"]["nightly"]["strategy"]["matrix"]["include"]
    for entry in include:
        assert entry["suite"].endswith("_" + entry["arch"]), entry
        required = ((_suite(entry["suite"])["profiles"]["full"] or {}).get("requires") or {}).get("arch")
        if required:  # the suite's own full profile must accept the runner it is sent to
            assert entry["arch"] in required, (entry, required)


def test_scripts_name_only_known_profiles() -> None:
    text = (ROOT / "ci" / "run_suites.sh").read_text()
    case_line = re.search(r"^\s*([a-z|-]+)\) ;;", text, re.MULTILINE)
    assert case_line is not None and set(case_line.group(1).split("|")) == PROFILES | OPTIONAL
    assert re.search(r'PROFILE="\$\{PROFILE:-(\w+)\}"', text).group(1) in PROFILES
