"""Malformed suite files give one-line ConfigErrors naming the file, the field path and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlbench.suites.suite import load_suite
from trainer.errors import ConfigError

BAD = Path(__file__).resolve().parent / "data" / "bad_suites"

# fixture -> substrings the message must contain (field path first, then the fix)
CASES = {
    "unknown_key": ["profiles.cpu.stpes", "unknown key 'stpes'", "did you mean 'steps'?"],
    "wrong_type": ["profiles.cpu.steps", "integer", "'twenty'"],
    "missing_title": ["title:", "missing required key 'title'"],
    "bad_stat": ["references[0].stat", "'peek'", "did you mean 'peak'?"],
    "unknown_profile_ref": ["references[0].profiles[0]", "'ful'", "did you mean 'full'?"],
    "undefined_profile_ref": ["references[0].profiles[0]", "profile 'cpu-vllm' is not defined", "defined: full, mini, cpu"],
    "profile_unknown_mode": ["profiles.cpu.modes[0]", "'fully_async' is not defined", "defined: colocated"],
    "slow_mode_not_run": ["profiles.cpu.slow_modes[0]", "does not run mode 'fully_async'", "it runs: colocated"],
    "slow_modes_all": ["profiles.cpu.slow_modes", "every mode of the profile is slow", "keep at least one of colocated"],
    "ratio_missing_mode": ["references[1].den", "'fully_async' which this suite lacks"],
    "yaml_syntax": ["YAML syntax error at line 14", "fix the YAML"],
    "band_without_hi": ["references[0].lo", "needs 'lo' and 'hi'"],
    "device_scope_no_device": ["references[0].device", "scope 'device' needs 'device'"],
    "id_mismatch": ["id:", "'some_other_suite' differs from the file name", "set id: id_mismatch"],
    "trainer_typo": ["trainer.actor.lrr", "unknown key", "did you mean 'lr'?"],
    "uncited_source": ["references[0].source", "must start with one of the suite's source docs"],
    "bad_mode_enum": ["modes.coloc", "did you mean 'colocated'?"],
    "unknown_ref_arch": ["references[0].arch[0]", "unknown arch 'gfx95O'", "did you mean 'gfx950'?",
                         "known: any, cpu, gfx942, gfx950"],
    "unknown_requires_arch": ["profiles.mini.requires.arch[0]", "unknown arch 'sm90'", "did you mean 'sm_90'?"],
    "unknown_published_arch": ["published_on.arch", "unknown arch 'gfx9500'", "known: gfx942, gfx950"],
}


def test_every_fixture_has_a_case() -> None:
    assert {p.stem for p in BAD.glob("*.yaml")} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_suite_message(name: str) -> None:
    path = BAD / f"{name}.yaml"
    with pytest.raises(ConfigError) as info:
        load_suite(path)
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{path}: "), msg
    for part in CASES[name]:
        assert part in msg, f"{part!r} not in {msg!r}"


def test_messages_are_distinct() -> None:
    msgs = set()
    for name in CASES:
        with pytest.raises(ConfigError) as info:
            load_suite(BAD / f"{name}.yaml")
        msgs.add(str(info.value).split(": ", 1)[1])
    assert len(msgs) == len(CASES)


def test_missing_file_and_non_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read suite file"):
        load_suite(tmp_path / "nope.yaml")
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_suite(p)


# file-level problems: each input built here -> substrings of its one-line message
FILE_CASES = {
    "binary": (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 4, ["is a binary file (NUL bytes), not a suite YAML"]),
    "not_utf8": (b"id: caf\xe9\ntitle: t\n", ["not UTF-8 text (byte 7: b'\\xe9')", "UTF-8 YAML file"]),
    "empty": (b"   \n\n", ["the suite file is empty", "id, title, source"]),
    "control_char": (b"id: x\x07y\n", ["YAML syntax error at character 5", "unacceptable character #x0007"]),
    "duplicate_key": (b"id: a\ntitle: t\nid: b\n", ["line 3: key 'id' is given twice", "first on line 1",
                                                   "YAML keeps only the last"]),
    "python_tag": (b"id: !!python/object:os.system x\n", ["YAML syntax error at line 1", "could not determine a constructor"]),
}


@pytest.mark.parametrize("name", sorted(FILE_CASES))
def test_bad_suite_file(name: str, tmp_path: Path) -> None:
    data, parts = FILE_CASES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        load_suite(path)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(f"{path}: "), msg
    for part in parts:
        assert part in msg, f"{part!r} not in {msg!r}"


def test_directory_and_oversize_suite(tmp_path: Path) -> None:
    d = tmp_path / "dir.yaml"
    d.mkdir()
    with pytest.raises(ConfigError, match="is a directory, not a suite file"):
        load_suite(d)
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (6 * 10**6) + "\n")
    with pytest.raises(ConfigError, match=r"6\.0 MB, over the 5 MB a suite file may be"):
        load_suite(big)


def test_a_profile_whose_memory_budget_the_machine_lacks_cannot_run_here() -> None:
    """requires.memory_gb against the machine's total memory: a skip reason naming both numbers."""
    from rlbench.suites.suite import profile_unmet_requirements

    suite = load_suite(Path(__file__).resolve().parents[2] / "suites" / "verl_grpo_qwen3_8b_sglang_gfx950.yaml")
    budget = suite.profile("cpu").requires.memory_gb
    assert budget == 16
    small = {"arch": "cpu", "num_gpus": 0, "packages": {}, "memory_gb": 7.8}
    assert profile_unmet_requirements(suite, "cpu", small) == ["needs 16 GB of memory at peak (has 7.8 GB)"]
    assert profile_unmet_requirements(suite, "cpu", {**small, "memory_gb": 23.5}) == []
