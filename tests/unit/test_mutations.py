"""rlbench/selftest/mutations.py: every mutation applies to the current trainer, and a moved target fails loudly."""

from __future__ import annotations

import pytest

from rlbench.selftest.mutations import (
    AREAS,
    MUTATIONS,
    Mutation,
    MutationError,
    apply_mutation,
    check_targets,
    copy_trainer,
)


def test_every_mutation_targets_one_place_of_the_current_trainer():
    assert check_targets() == []


def test_the_list_covers_every_area_with_at_least_ten_mutations():
    assert len(MUTATIONS) >= 10
    assert {m.area for m in MUTATIONS.values()} == set(AREAS)


def test_apply_changes_the_copy_only(tmp_path):
    m = MUTATIONS["grpo_no_group_mean"]
    root = copy_trainer(tmp_path)
    apply_mutation(m, root)
    text = (root / "trainer" / m.file).read_text()
    assert m.new in text and m.old not in text
    from rlbench.selftest.mutations import TRAINER_DIR

    assert m.old in (TRAINER_DIR / m.file).read_text()


def test_a_target_that_moved_raises_naming_the_mutation(tmp_path):
    root = copy_trainer(tmp_path)
    moved = Mutation("moved", "algorithm", "algorithms/advantages.py", "text that is not there\n", "x\n", "", "")
    with pytest.raises(MutationError, match="mutation moved: its target text occurs 0 times"):
        apply_mutation(moved, root)
    missing = Mutation("gone", "data", "no/such.py", "a", "b", "", "")
    with pytest.raises(MutationError, match="gone: trainer/no/such.py does not exist"):
        apply_mutation(missing, root)


def test_rev_copies_a_commit(tmp_path):
    root = copy_trainer(tmp_path, "HEAD")
    assert (root / "trainer" / "modes" / "colocated.py").is_file()
    with pytest.raises(MutationError, match="--rev no-such-rev"):
        copy_trainer(tmp_path / "x", "no-such-rev")
