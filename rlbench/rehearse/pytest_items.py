"""`pytest suites/ --arch gfx950 --rehearse`: one item per suite x profile (full, mini) x mode, each a rehearsal.

    pytest suites/ --arch gfx950 --rehearse                 # every full and mini profile (one at a time)
    pytest suites/ --rehearse --profile mini -k geo3k

Collected by `rlbench/run/pytest_plugin.py` when `--rehearse` is given (instead of the check items). An item
runs `rlbench.rehearse.run.rehearse` (records its JSON under reports/rehearsal/) and passes when every
mechanics check passed; it fails with the line the run stopped on, or with the failing checks. Its report
section lists every change the rehearsal made to the profile, the engine note (SGLang: a double) and that
the published references are not evaluated (rehearsal). `--arch` only names the hardware the profiles are
meant for; a rehearsal runs on this CPU whatever it says.
"""

from __future__ import annotations

from typing import Any

import pytest

from rlbench.rehearse.run import REHEARSED_PROFILES, rehearse


class RehearsalFailed(Exception):
    pass


class RehearsalItem(pytest.Item):
    def __init__(self, *, suite: Any, profile: str, mode: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.suite, self.profile, self.mode = suite, profile, mode

    def runtest(self) -> None:
        rec = rehearse(str(self.suite.path), self.profile, self.mode, status=lambda line: None)
        changes = "\n".join(f"  {c['field']}: {c['profile']!r} -> {c['rehearsal']!r}  ({c['why']})" for c in rec["changes"])
        checks = "\n".join(f"  {c['check']}: {c['result']}: {c['detail']}" for c in rec["checks"])
        text = (f"{rec['outcome']} in {rec['wall_s']} s, {rec['steps_run']}/{rec['steps_planned']} steps"
                + (f"\n{rec['engine_note']}" if rec["engine_note"] else "")
                + f"\npublished references: {rec['published_references']}"
                + f"\nchanges ({len(rec['changes'])}):\n{changes}\nmechanics checks:\n{checks or '  none (stopped at start)'}")
        self.add_report_section("call", "rehearsal", text)
        if rec["outcome"] != "pass":
            raise RehearsalFailed(f"{rec['outcome']}: {rec['line']}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, RehearsalFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Any, int, str]:
        return self.path, 0, f"{self.suite.id}[{self.profile}-rehearsal]::{self.mode}"


def rehearsal_items(parent: pytest.Collector, suite: Any, profiles: list[str]) -> Any:
    for profile in profiles:
        if profile not in REHEARSED_PROFILES:
            continue
        for mode in suite.profile(profile).modes:
            item = RehearsalItem.from_parent(parent, name=f"{suite.id}[{profile}-rehearsal]::{mode}", suite=suite,
                                             profile=profile, mode=mode)
            item.add_marker("rlbench")
            item.add_marker(f"profile_{profile}")
            yield item
