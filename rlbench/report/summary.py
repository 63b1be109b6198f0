"""What a report says first: which checks compared against the articles, which against golden or
sanity values, which could not run here and why; the verdict rows in reading order.

    from rlbench.report.summary import Tally, headline_html, verdict_rows_html
    tally = Tally.of(results)               # classified and counted results
    tally.published_evaluated               # how many published references were compared here

Every result is classified by what it compares against:

- `published`: a reference read off an article (its `source` names a seed document);
- `golden`: values this project recorded per arch (`scope == "golden"`, check ids `golden:...`);
- `sanity`: the project's own mechanics checks (`source` starting with `rlbench:`).

and by status: `pass`, `fail`, `error`, `skip`, or any other verdict a newer `rlbench.checks.evaluate`
may return (e.g. a check whose metric, steps or window are missing from the log): those are
"not evaluated", listed with their reason next to the skips and never counted as a pass.

A skip whose reason is "applies to profile X (this run: Y)" is "not applicable to this profile":
it belongs to another profile of the suite and is no pytest item of this one, so it is counted
apart from the skips of this profile. Skips are folded into one `<details>` per reason.
The headline verdict is green PASS only when at least one published reference was compared and
nothing failed; a run whose checks are all the project's own reads "PASS: project checks only".
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rlbench.checks.results import CheckResult

KINDS = ("published", "golden", "sanity")
KIND_LABEL = {"published": "published reference", "golden": "golden value", "sanity": "sanity check"}
_SKIP_RE = re.compile(r":\s*(?:SKIP|NOT[ _]EVALUATED)\s*\((.*)\)\s*$", re.IGNORECASE | re.DOTALL)
_OTHER_PROFILE_RE = re.compile(r"^applies to profile ")
_RANK = {"fail": 0, "error": 2, "pass": 3}  # anything else (not evaluated) ranks 1, as in rlbench.checks.results


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def kind_of(r: CheckResult) -> str:
    """published | golden | sanity (see module docstring)."""
    if r.scope == "golden" or r.check_id.startswith("golden:"):
        return "golden"
    if r.source.strip().lower().startswith("rlbench"):
        return "sanity"
    return "published"


def status_of(r: CheckResult) -> str:
    """pass | fail | error | skip | not evaluated (any other verdict)."""
    return r.verdict if r.verdict in ("pass", "fail", "error", "skip") else "not evaluated"


def reason_of(r: CheckResult) -> str:
    """Why a check was skipped or not evaluated: the text in `<id>: SKIP (<reason>)`, else the message."""
    m = _SKIP_RE.search(r.message or "")
    if m:
        return m.group(1).strip()
    return (r.message or "no reason given").strip()


def other_profile(r: CheckResult) -> bool:
    """A skip of a reference that does not list this run's profile."""
    return r.verdict == "skip" and bool(_OTHER_PROFILE_RE.match(reason_of(r)))


@dataclass
class Tally:
    """Results split by kind and status, with the counts the headline states."""

    results: list[CheckResult]
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> status -> count (this profile)
    other_profiles: list[CheckResult] = field(default_factory=list)  # references of other profiles
    skip_reasons: dict[str, list[CheckResult]] = field(default_factory=dict)  # reason -> skips/not evaluated

    @classmethod
    def of(cls, results: Iterable[CheckResult]) -> Tally:
        t = cls(results=list(results))
        t.by_kind = {k: {} for k in KINDS}
        for r in t.results:
            if other_profile(r):
                t.other_profiles.append(r)
                continue
            st = status_of(r)
            counts = t.by_kind[kind_of(r)]
            counts[st] = counts.get(st, 0) + 1
            if st in ("skip", "not evaluated"):
                t.skip_reasons.setdefault(reason_of(r), []).append(r)
        return t

    def count(self, kind: str | None = None, status: str | None = None) -> int:
        kinds = [kind] if kind else list(KINDS)
        return sum(n for k in kinds for s, n in self.by_kind[k].items() if status is None or s == status)

    @property
    def published_evaluated(self) -> int:
        return sum(self.count("published", s) for s in ("pass", "fail"))

    @property
    def published_total(self) -> int:
        return self.count("published") + sum(kind_of(r) == "published" for r in self.other_profiles)

    @property
    def not_evaluated(self) -> int:
        return self.count(status="not evaluated")

    def verdict(self) -> str:
        """fail > not_evaluated > error > pass (published compared) > partial (project checks only) > skip."""
        if self.count(status="fail"):
            return "fail"
        if self.not_evaluated:
            return "not_evaluated"
        if self.count(status="error"):
            return "error"
        if self.count(status="pass"):
            return "pass" if self.count("published", "pass") else "partial"
        return "skip" if self.results else "none"


OVERALL_LABEL = {"none": "NO CHECKS", "partial": "PASS: project checks only", "skip": "NOTHING EVALUATED"}


def badge(verdict: str, overall: bool = False) -> str:
    """A coloured verdict label; `overall` words the verdict of a whole report (see `Tally.verdict`)."""
    cls = verdict if verdict in ("pass", "fail", "error", "skip", "partial", "none") else "not_evaluated"
    label = (OVERALL_LABEL.get(verdict) if overall else None) or (
        "NOT EVALUATED" if cls == "not_evaluated" else verdict.upper())
    return f'<span class="badge v-{_e(cls)}">{_e(label)}</span>'


def _profiles_of(rs: list[CheckResult]) -> str:
    """'mini/cpu' from reasons 'applies to profile mini/cpu (this run: full)', 'applies to profile cpu (...)'."""
    names = {p for r in rs for p in reason_of(r).split("(")[0].replace("applies to profile", "").strip().split("/")}
    order = ("full", "mini", "cpu")
    return "/".join(sorted(names, key=lambda p: order.index(p) if p in order else len(order)))


def expected_text(r: CheckResult) -> str:
    """`expected` without the source it repeats (the source is shown under it)."""
    text = r.expected
    if r.source and r.source in text:
        text = text.replace(f"; {r.source}", "").replace(f"({r.source})", "").replace(r.source, "")
        text = text.replace(" ()", "").strip()
    return text


def _status_counts(counts: dict[str, int]) -> str:
    order = ("pass", "fail", "error", "not evaluated", "skip")
    return ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s))


def headline_html(tally: Tally, *, profile: str | None = None, unrun: list[tuple[str, str, int]] | None = None,
                  items: dict[str, int] | None = None) -> str:
    """The verdict sentence block: published references first, then golden and sanity, then what could not run.

    `unrun`: (suite [profile], reason, number of checks) of profiles that could not run here;
    `items`: pytest's own outcome counts, shown so the two numbers can be compared.
    """
    v = tally.verdict()
    pub = tally.by_kind["published"]
    lines = []
    where = f" on profile {profile}" if profile else ""
    if tally.published_total or unrun:
        n_other = sum(kind_of(r) == "published" for r in tally.other_profiles)
        evaluated = tally.published_evaluated
        text = (f"<b>{evaluated}</b> of {tally.published_total} published references (read off the articles) "
                f"were compared{where}" + (f": {_status_counts({s: pub.get(s, 0) for s in ('pass', 'fail')})}"
                                           if evaluated else "") + ".")
        rest = []
        if n_other:
            profs = _profiles_of([r for r in tally.other_profiles if kind_of(r) == "published"])
            rest.append(f"{n_other} apply only to profile {profs}")
        for st in ("skip", "not evaluated", "error"):
            if pub.get(st):
                rest.append(f"{pub[st]} {'skipped here' if st == 'skip' else st} (reasons below)")
        if rest:
            text += " Not compared: " + "; ".join(rest) + "."
        if not evaluated:
            text += " <b>This is not a parity result.</b>"
        lines.append(f'<li class="h-published">{text}</li>')
    for kind, label in (("golden", "golden value(s) recorded by this project per arch"),
                        ("sanity", "sanity check(s) of this project's mechanics")):
        counts = tally.by_kind[kind]
        if counts:
            lines.append(f"<li>{sum(counts.values())} {label}: {_e(_status_counts(counts))}.</li>")
    other_project = [r for r in tally.other_profiles if kind_of(r) != "published"]
    if other_project:
        lines.append(f'<li class="note">{len(other_project)} golden/sanity checks apply only to profile '
                     f"{_e(_profiles_of(other_project))} (not checked on this one).</li>")
    partial = [r for r in tally.results if getattr(r, "coverage", "") and not other_profile(r)]
    if partial:
        notes = sorted({r.coverage for r in partial})
        lines.append(f'<li class="h-partial">{len(partial)} checks read a partial log: {_e("; ".join(notes[:3]))}'
                     f"{' ...' if len(notes) > 3 else ''}.</li>")
    for title, reason, n in unrun or []:
        lines.append(f'<li class="h-unrun">{n} checks of {_e(title)} could not run here: {_e(reason)}.</li>')
    if items:
        lines.append(f'<li class="note">pytest items: {_e(", ".join(f"{n} {k}" for k, n in items.items()))}.</li>')
    return (f'<div class="headline"><p class="verdict-line">Verdict: {badge(v, overall=True)}</p>'
            f'<ul>{"".join(lines)}</ul></div>')


def verdict_rows_html(results: list[CheckResult], actual: Callable[[CheckResult], str]) -> str:
    """Failures, errors and not-evaluated checks, then passes (a table); then skips folded by reason."""
    if not results:
        return '<p class="note">No checks were evaluated.</p>'
    tally = Tally.of(results)
    shown = sorted((r for r in results if status_of(r) not in ("skip", "not evaluated")),
                   key=lambda r: _RANK.get(r.verdict, 2))
    parts = []
    if shown:
        head = "".join(f'<th class="c-{c.split()[0]}">{c}</th>' for c in
                       ("verdict", "check", "kind", "run", "actual", "expected"))
        rows = []
        for r in shown:
            msg = f'<div class="msg">{_e(r.message)}</div>' if r.message and r.verdict != "pass" else ""
            cov = getattr(r, "coverage", "")
            msg += f'<div class="msg warn">{_e(cov)}</div>' if cov else ""
            detail = f'<div class="src">{_e(r.source)}<br><i>{_e(r.why)}</i></div>' if (r.source or r.why) else ""
            rows.append(
                f'<tr class="row-{_e(status_of(r).replace(" ", "_"))}"><td class="c-verdict">{badge(r.verdict)}</td>'
                f'<td class="c-check"><code>{_e(r.check_id)}</code>{msg}</td><td>{_e(KIND_LABEL[kind_of(r)])}</td>'
                f"<td>{_e(r.run or '')}</td><td>{_e(actual(r))}</td><td>{_e(expected_text(r))}{detail}</td></tr>")
        parts.append(f'<table class="grid verdicts"><tr>{head}</tr>{"".join(rows)}</table>')
    for reason, rs in sorted(tally.skip_reasons.items(), key=lambda kv: (status_of(kv[1][0]) == "skip", -len(kv[1]))):
        st = status_of(rs[0])
        items = "".join(f"<li><code>{_e(r.check_id)}</code> <span class=\"note\">({_e(KIND_LABEL[kind_of(r)])}"
                        f"{', ' + _e(r.source) if r.source else ''})</span></li>" for r in rs)
        parts.append(f'<details class="fold fold-{_e(st.replace(" ", "_"))}"><summary>{badge(rs[0].verdict)} '
                     f"{len(rs)} {_e(st if st != 'skip' else 'skipped')}: {_e(reason)}</summary><ul>{items}</ul></details>")
    if tally.other_profiles:  # one fold: references that list other profiles, each with its profiles
        rs = tally.other_profiles
        items = "".join(f"<li><code>{_e(r.check_id)}</code> <span class=\"note\">({_e(KIND_LABEL[kind_of(r)])}, "
                        f"profile {_e(_profiles_of([r]))})</span></li>" for r in rs)
        this = reason_of(rs[0]).rpartition("this run: ")[2].rstrip(")") or "this one"
        parts.append(f'<details class="fold fold-other"><summary>{len(rs)} not applicable to profile {_e(this)}: '
                     f"they apply to profile {_e(_profiles_of(rs))}</summary><ul>{items}</ul></details>")
    return "\n".join(parts)


def counts_text(results: list[CheckResult]) -> str:
    """'3 pass, 1 fail, 2 skip (+16 of other profiles)': the checks of this profile, then the rest."""
    t = Tally.of(results)
    counts: dict[str, int] = {}
    for k in KINDS:
        for s, n in t.by_kind[k].items():
            counts[s] = counts.get(s, 0) + n
    text = _status_counts(counts) or "no checks"
    return text + (f" (+{len(t.other_profiles)} of other profiles)" if t.other_profiles else "")
