"""Malformed suite files give one-line ConfigErrors naming the file, the field path and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlbench.suite import load_suite
from trainer.errors import ConfigError

BAD = Path(__file__).resolve().parent / "data" / "bad_suites"

# fixture -> substrings the message must contain (field path first, then the fix)
CASES = {
    "unknown_key": ["profiles.cpu.stpes", "unknown key 'stpes'", "did you mean 'steps'?"],
    "wrong_type": ["profiles.cpu.steps", "integer", "'twenty'"],
    "missing_title": ["title:", "missing required key 'title'"],
    "bad_stat": ["references[0].stat", "'peek'", "did you mean 'peak'?"],
    "unknown_profile_ref": ["references[0].profiles[0]", "'ful'", "did you mean 'full'?"],
    "profile_unknown_mode": ["profiles.cpu.modes[0]", "'fully_async' is not defined", "defined: colocated"],
    "ratio_missing_mode": ["references[1].den", "'fully_async' which this suite lacks"],
    "yaml_syntax": ["YAML syntax error at line 14", "fix the YAML"],
    "band_without_hi": ["references[0].lo", "needs 'lo' and 'hi'"],
    "device_scope_no_device": ["references[0].device", "scope 'device' needs 'device'"],
    "id_mismatch": ["id:", "'some_other_suite' differs from the file name", "set id: id_mismatch"],
    "trainer_typo": ["trainer.actor.lrr", "unknown key", "did you mean 'lr'?"],
    "uncited_source": ["references[0].source", "must start with one of the suite's source docs"],
    "bad_mode_enum": ["modes.coloc", "did you mean 'colocated'?"],
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
