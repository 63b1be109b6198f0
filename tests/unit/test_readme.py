"""Every command in the README's (and examples/README.md's) ```bash blocks is accounted for: run here
when it is cheap, or named with what runs it (CI's `make test` path, a named test) or why it cannot
run here (a GPU, minutes of SmolLM2 training, marked so on its README line).

A command added to the README without a row in `COMMANDS` fails `test_every_readme_command_is_accounted_for`;
a row whose command left the README fails too, so the table and the README move together. The cheap
commands run as written from a scratch folder (the sample log reached through `examples/`), and the
shipped sample log is checked to be what `tests/helpers/verl_logs.py` writes.

    python3 -m pytest -q tests/unit/test_readme.py
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "examples" / "README.md"]
SAMPLE = ROOT / "examples" / "verl_grpo_qwen3_8b.jsonl"
CHECK_SAMPLE = ("rlbench check examples/verl_grpo_qwen3_8b.jsonl --suite verl_grpo_qwen3_8b_sglang_gfx950 "
                "--profile full --arch gfx950")

# command (as written, comment stripped) -> how it is covered:
#   ("run", "")                   run by test_cheap_commands_run_as_written
#   ("ci", "<file>")              the file (a CI entry point / make recipe) runs it
#   ("make test", "")             part of `make test` (its `pytest suites/ --arch cpu` runs every cpu profile)
#   ("test", "<test file>")       a test of `make test`'s `pytest -q` runs its config (cut short); the config is
#                                 validated here as written
#   ("gpu", "<word>")             needs a GPU; its README line says so (the word appears in its comment)
#   ("heavy", "<word>")           minutes of SmolLM2 training; its README line says so; its config and
#                                 overrides are validated here when it is a `python -m trainer` command
COMMANDS: dict[str, tuple[str, str]] = {
    "make train": ("heavy", "min"),
    "make test": ("ci", ".ci/run"),
    "make selftest": ("heavy", "SmolLM2"),
    "rlbench list": ("run", ""),
    "pytest suites/ --arch gfx950": ("gpu", "MI350X"),
    "pytest suites/ --arch cpu --profile cpu -k dapo": ("make test", ""),
    "pytest suites/ --arch cpu --profile cpu-vllm": ("make test", ""),
    "rlbench run verl_dapo_qwen25_math_7b_fully_async_gfx942 --profile mini --out runs/": ("gpu", "GPU"),
    CHECK_SAMPLE: ("run", ""),
    "python -m trainer trainer/configs/grpo_smollm2_arithmetic.yaml actor.lr=2e-5 trainer.total_steps=10":
        ("heavy", "SmolLM2"),
    "python -m trainer trainer/configs/dapo_smollm2_arithmetic.yaml": ("heavy", "SmolLM2"),
    "python -m trainer trainer/configs/ppo_smollm2_arithmetic.yaml": ("heavy", "SmolLM2"),
    "python -m trainer trainer/configs/grpo_tiny_vlm_geometry.yaml": ("test", "tests/integration/test_vlm_loop.py"),
}


def readme_commands(path: Path) -> list[tuple[str, str]]:
    """(command, comment) of every line of every ```bash block of `path`."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.DOTALL):
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            cmd, _, comment = line.partition(" #")
            out.append((" ".join(cmd.split()), comment.strip()))
    return out


ALL = [(p.name, c, k) for p in DOCS for c, k in readme_commands(p)]


def test_every_readme_command_is_accounted_for() -> None:
    written = {c for _, c, _ in ALL}
    unknown = sorted(written - set(COMMANDS))
    assert not unknown, f"README commands with no row in tests/unit/test_readme.py COMMANDS: {unknown}"
    stale = sorted(set(COMMANDS) - written)
    assert not stale, f"rows of COMMANDS no longer in the README: {stale}"


@pytest.mark.parametrize(("doc", "cmd", "comment"), ALL, ids=[f"{d}:{c[:50]}" for d, c, _ in ALL])
def test_command_is_run_somewhere_or_marked(doc: str, cmd: str, comment: str) -> None:
    how, what = COMMANDS[cmd]
    if how == "ci":
        lines = [ln.strip() for ln in (ROOT / what).read_text().splitlines() if not ln.lstrip().startswith("#")]
        assert cmd in lines, f"{what} no longer runs `{cmd}`"
    elif how == "make test":
        recipe = _make_recipe("test-suites")
        assert "pytest suites/ --arch cpu" in recipe and "--profile" not in recipe and "-k" not in recipe.split()
        assert "test-suites" in _make_recipe("test")
    elif how == "test":
        config = shlex.split(cmd)[3]
        assert config in (ROOT / what).read_text(), f"{what} no longer runs {config}"
        from trainer.config import load_config

        load_config(ROOT / config, shlex.split(cmd)[4:])
    elif how in ("gpu", "heavy"):
        assert what in comment, f"{doc}: mark `{cmd}` on its line (`# {how}: ... {what} ...`)"
        if cmd.startswith("python -m trainer "):
            from trainer.config import load_config

            config, *overrides = shlex.split(cmd)[3:]
            load_config(ROOT / config, overrides)  # the config and its overrides as written are valid
        if cmd == "make train":
            assert "python -m trainer trainer/configs/grpo_smollm2_arithmetic.yaml" in \
                _make_recipe("train").replace("$(PYTHON)", "python")
            assert (ROOT / "reports" / "cpu" / "grpo_smollm2_arithmetic.metrics.jsonl").is_file()
    else:
        assert how == "run"


def _make_recipe(target: str) -> str:
    text = (ROOT / "Makefile").read_text()
    m = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n?)+)", text, flags=re.MULTILINE)
    assert m, f"Makefile: no recipe for `{target}`"
    return m.group(1)


def _run(cmd: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(cmd)
    argv = [sys.executable, "-m", "rlbench", *argv[1:]] if argv[0] == "rlbench" else argv
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(argv, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("cmd", [c for c, (how, _) in COMMANDS.items() if how == "run"])
def test_cheap_commands_run_as_written(cmd: str, tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    res = _run(cmd, tmp_path)
    assert res.returncode == 0, f"`{cmd}` exited {res.returncode}:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
    if cmd == CHECK_SAMPLE:
        assert "FAIL" not in res.stdout and "ERROR" not in res.stdout
        assert re.search(r"^\d+ pass", res.stdout.splitlines()[-1]), res.stdout[-500:]
        report = tmp_path / "runs" / "check" / "verl_grpo_qwen3_8b_sglang_gfx950" / "full" / "report.html"
        assert "published references (read off the articles) were compared" in report.read_text()
    else:
        assert "verl_grpo_qwen3_8b_sglang_gfx950" in res.stdout


def test_sample_log_is_what_the_helper_writes(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.helpers.verl_logs import write_qwen3_8b_grpo_log

    assert write_qwen3_8b_grpo_log(tmp_path / "log.jsonl").read_text() == SAMPLE.read_text()


def test_prerequisites_name_chromium_and_timings_carry_a_caveat() -> None:
    text = (ROOT / "README.md").read_text()
    assert "apt-get install -y chromium" in text
    assert "no promise for yours" in text
    cfg = (ROOT / "trainer" / "configs" / "grpo_smollm2_arithmetic.yaml").read_text()
    assert "0.59" in cfg and "1.00" in cfg and "~0.5+" not in cfg  # as measured in reports/cpu/
