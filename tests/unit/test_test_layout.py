"""The test tree itself: pytest imports test modules by basename (there are no package `__init__`
files under tests/unit, tests/integration or tests/engines), so two test files of one name in
different folders stop the collection of the whole suite. Run: `pytest tests/unit/test_test_layout.py`."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def duplicate_basenames(root: Path) -> dict[str, list[str]]:
    seen: dict[str, list[str]] = defaultdict(list)
    for f in sorted(root.rglob("test_*.py")):
        seen[f.name].append(str(f.relative_to(root)))
    return {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_test_files_have_unique_basenames() -> None:
    dups = duplicate_basenames(TESTS)
    assert not dups, f"test files sharing a basename (rename one of each): {dups}"


def test_duplicate_basenames_are_found(tmp_path: Path) -> None:
    for folder in ("unit", "integration"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "test_same.py").write_text("")
    assert duplicate_basenames(tmp_path) == {"test_same.py": ["integration/test_same.py", "unit/test_same.py"]}
