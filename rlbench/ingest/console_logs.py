"""Console logs of verl and Miles, reassembled from their structure when lines were broken.

    from rlbench.ingest.console_logs import read_verl_console, read_miles_console
    rows = read_verl_console(lines, warnings)     # {step: {raw name: value}}

Terminals, log collectors and copy-paste break long lines at any width, and some runs print one
item per line. Neither reader guesses line lengths; each joins physical lines while the text stays
inside the grammar of its format:

- verl: a step record is `step:N` followed by `key:value` items, each introduced by ` - `
  (`step:12 - actor/ppo_kl:0.001 - timing_s/gen:3.2`). A physical line continues the open record
  when the record's text followed by the line is still such a sequence (at most one item left
  open at the end): a key split mid-word (`... - c` + `ritic/returns/min:0`), a number split at
  the break (`368.` + `902 - ...`), a separator split (`0.5 -` + ` a:1`), or one item per line
  (`(TaskRunner pid=1) step:1` then ` - key:value` lines, with or without the Ray prefix). A
  line that does not fit closes the record. A record whose last item is left open (the name has
  no value, or the value is cut: `timing_s/old_log_prob:6.`, `1e-`, `np.float64(0.`) is read up
  to that item and warned about, naming the line, like a truncated JSON line.
- Miles: a record is `perf 3: {...}` (also `eval`, `rollout`, `step`, `actor-step`) whose dict
  literal may run over several lines; lines are joined until its braces balance (outside string
  quotes), then the dict is parsed with `ast.literal_eval`. A record that never closes, or whose
  dict does not parse, is warned about with its line numbers and ignored.

Values: plain numbers, numpy/torch reprs (`np.float64(0.5)`, `tensor(0.5, device='cuda:0')`),
`nan`/`inf`, booleans. A value that is not a number is warned about and ignored. Continuation
lines holding ` - key:value` items while no record is open are warned about (an unrelated line
cut the record) and ignored. A Kubernetes/CRI container-log prefix (`<time> stdout P `, P for a
line the runtime split) is removed first, so split lines rejoin like wrapped ones.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Any

# One record's text may not grow past this (a verl step line is a few kB; Miles dicts the same).
MAX_RECORD_CHARS = 1 << 20

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RAY_REPEAT = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")
_RAY_PREFIX = re.compile(r"^\((?:[\w.:-]+) pid=\d+(?:, ip=[^)]*)?\) ?")

_KEY = r"[A-Za-z_][^\s:]*"
_NUM = r"[-+]?(?:(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|inf|Inf|infinity|Infinity)"
_REPR = rf"(?:np|numpy)\.\w+\(\s*{_NUM}\s*\)|tensor\(\s*{_NUM}\s*(?:,[^()]*)?\)"
_WORD = r"(?![-+\d.]|np\.|numpy\.|tensor\()[^\s]+?"  # not a number: must not start like one
_SEP = r"\s*-\s*"
_VALUE = rf"(?:{_REPR}|{_NUM}|True|False|None|{_WORD})"
# An item ends where the next one starts (`- key:`), where the text ends, or where the text ends
# inside the next item's name or right after its separator (a line broken there).
_ITEM = re.compile(rf"{_SEP}(?P<key>{_KEY}):(?P<val>{_VALUE})(?={_SEP}{_KEY}:|{_SEP}{_KEY}$|\s*-?\s*$)")
# What may be left open at the end of a record's text: nothing, a separator, a name, `name:valfrag`.
_OPEN_TAIL = re.compile(rf"\s*(?:-\s*(?:{_KEY}(?::\S*)?)?)?")
# A value left open at the end of the text that is the start of a number's spelling (`n` of nan,
# `np` of np.float64(...), `tens` of tensor(...), `Tr` of True): not yet an item.
_WORD_PREFIX = re.compile(r"[-+]?(?:na?|Na?|infi?n?i?t?|Infi?n?i?t?|In?|np|nu(?:m(?:py?)?)?|"
                          r"t(?:e(?:n(?:s(?:or?)?)?)?)?|Tr?u?|Fa?l?s?|No?n?)")
_STEP = re.compile(r"step:(?P<step>-?\d+)")
# The end of a physical line that may be the start of "step:N" broken at the line break.
_STEP_HEAD = re.compile(r"(?:^|(?<=[\s)\]]))(?:s|st|ste|step|step:|step:-)$")
# Where a verl record starts: "step:N" at the start, after a space, ')' or ']' (a Ray prefix).
_VERL_START = re.compile(r"(?:^|(?<=[\s)\]]))step:-?\d+")
# " - key:number" somewhere in a line no record took: items cut off from their "step:N".
_ORPHAN_ITEM = re.compile(rf"(?:^|\s)-\s+{_KEY}:(?:{_REPR}|{_NUM})(?=\s+-\s+{_KEY}:|\s*$)")
# Kubernetes/CRI container log prefix: "<RFC 3339 time> stdout|stderr F|P " (P: a partial line,
# the rest follows on the next entry).
_CRI = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d) (?:stdout|stderr) [FP] ")

_MILES_START = re.compile(
    r"(?:^|[\s:\])])(?P<kind>perf|eval|rollout|(?:\w+-)?step)\s+(?P<id>\d+):\s*(?P<dict>\{.*)?$"
)
_NP_SCALAR = re.compile(r"\b(?:np|numpy)\.\w+\(\s*([^(),]*?)\s*\)")
_TENSOR_SCALAR = re.compile(r"\btensor\(\s*([^(),]*?)\s*(?:,[^()]*)?\)")
_BARE_NAN = re.compile(r"(?<![\w'\"/.])nan(?![\w'\"])")
_BARE_INF = re.compile(r"(?<![\w'\"/.])inf(?![\w'\"])")


def clean(line: str) -> str:
    """A physical line without a container-log prefix, ANSI colours, Ray's `[repeated Nx ...]`
    suffix and trailing spaces."""
    return _RAY_REPEAT.sub("", _ANSI.sub("", _CRI.sub("", line, count=1))).rstrip()


def parse_scalar(text: str) -> float | None:
    """A console value as a float: `0.5`, `np.float64(0.5)`, `tensor(0.5)`, `nan`, `-inf`; else None."""
    text = text.strip()
    m = _NP_SCALAR.fullmatch(text) or _TENSOR_SCALAR.fullmatch(text)
    if m:
        text = m.group(1).strip()
    if text in ("True", "False"):
        return 1.0 if text == "True" else 0.0
    try:
        return float(text)
    except ValueError:
        return None


# ---------------------------------------------------------------------------- verl
@dataclass
class _Parsed:
    step: int
    step_end: int  # where the text after "step:N" begins
    items: list[tuple[str, str]]  # complete (key, value text) items
    starts: list[int]  # where each item (its separator) starts in the text
    tail: str  # what is left open at the end ("" when the text ends with a complete item)
    tail_pos: int


def _parse_record(text: str, resume: _Parsed | None = None) -> _Parsed | None:
    """The record's text `step:N - k:v - ...` parsed; None if off-grammar. `resume`: the parse of a
    prefix of `text`, continued from its last item (items before it cannot change by appending)."""
    if resume is not None and (resume.items or resume.tail):
        keep = len(resume.items) if resume.tail else len(resume.items) - 1
        pos = resume.tail_pos if resume.tail else resume.starts[-1]
        step, step_end = resume.step, resume.step_end
        items, starts = resume.items[:keep], resume.starts[:keep]
    else:
        m = _STEP.match(text)
        if not m:
            return None
        pos, items, starts = m.end(), [], []
        if pos < len(text) and text[pos].isdigit():
            return None
        step, step_end = int(m.group("step")), m.end()
    while True:
        it = _ITEM.match(text, pos)
        if not it:
            break
        items.append((it.group("key"), it.group("val")))
        starts.append(pos)
        pos = it.end()
    tail = text[pos:]
    if not _OPEN_TAIL.fullmatch(tail):
        return None
    if not tail and items and _WORD_PREFIX.fullmatch(items[-1][1]):
        items.pop()  # "nan" broken after "n": the value is still open
        pos = starts.pop()
        tail = text[pos:]
    return _Parsed(step, step_end, items, starts, tail, pos)


def verl_record_start(line: str) -> int | None:
    """Index in `line` where a verl step record starts (its text fits the grammar), else None."""
    for m in _VERL_START.finditer(line):
        if _parse_record(line[m.start():]) is not None:
            return m.start()
    return None


class _Record:
    def __init__(self, text: str, line_no: int):
        self.text, self.first, self.last = text, line_no, line_no
        self.parsed = _parse_record(text)
        assert self.parsed is not None

    @property
    def tail(self) -> str:
        assert self.parsed is not None
        return self.parsed.tail

    def extend(self, line: str, line_no: int) -> str | None:
        """Join `line` if the joined text stays in the grammar; '' or a warning when joined, None if not."""
        assert self.parsed is not None
        step, items = self.parsed.step, self.parsed.items
        for cont in dict.fromkeys((line, _RAY_PREFIX.sub("", line, count=1))):
            if not cont.strip():
                continue
            joined = self.text + cont
            if len(joined) > MAX_RECORD_CHARS:
                return None
            parsed = _parse_record(joined, self.parsed)
            if parsed is None:
                continue
            if parsed.step != step and (items or self.tail.strip() or not cont[:1].isdigit()):
                continue  # only "step:1" + "23 - ..." (the step number itself wrapped) may change it
            new_items = parsed.items
            if not self._keeps(new_items):
                continue
            gained = len(new_items) > len(items) or len(parsed.tail.strip()) > len(self.tail.strip())
            changed = new_items[: len(items)] != items
            if not gained and not changed:
                continue
            note = ""
            if changed and len(new_items) == len(items) and not parsed.tail.strip():
                key = items[-1][0] if items else "step"
                note = f"line {line_no}: {cont.strip()[:40]!r} read as the rest of step {step}'s value of {key!r}"
            self.text, self.parsed, self.last = joined, parsed, line_no
            return note
        return None


    def _keeps(self, new_items: list[tuple[str, str]]) -> bool:
        """The joined text keeps every complete item; only the last may grow, and stay a number."""
        assert self.parsed is not None
        items = self.parsed.items
        if not items:
            return True
        if len(new_items) < len(items) or new_items[: len(items) - 1] != items[: len(items) - 1]:
            return False
        if new_items[len(items) - 1] == items[-1]:
            return True
        (k0, v0), (k1, v1) = items[-1], new_items[len(items) - 1]
        if self.tail.strip() or k0 != k1 or not v1.startswith(v0):
            return False
        return parse_scalar(v1) is not None or parse_scalar(v0) is None


def _close_verl(rec: _Record, rows: dict[int, dict[str, Any]], warnings: list[str],
                steps_seen: list[tuple[int, int]]) -> None:
    assert rec.parsed is not None
    step, items, tail = rec.parsed.step, rec.parsed.items, rec.parsed.tail
    where = f"line {rec.last}" if rec.first == rec.last else f"lines {rec.first}-{rec.last}"
    values: dict[str, float] = {}
    for key, text in items:
        v = parse_scalar(text)
        if v is None:
            warnings.append(f"{where}: value of {key!r} is not a number ({text.strip()[:40]!r}); ignored")
            continue
        values[key] = v
    if tail.strip():
        warnings.append(f"line {rec.last}: step {step} is cut short at {tail.strip()[:60]!r} (a name or value "
                        f"broken off, like a truncated JSON line); read {len(values)} items, that one ignored")
    if values:  # "step:5" alone (a progress line) carries no metrics
        steps_seen.append((step, rec.first))
        row = rows.setdefault(step, {})
        row.update(values)


def read_verl_console(lines: list[str], warnings: list[str],
                      steps_seen: list[tuple[int, int]]) -> dict[int, dict[str, Any]]:
    """verl console step records, reassembled across physical lines; `steps_seen` gets (step, line)."""
    rows: dict[int, dict[str, Any]] = {}
    rec: _Record | None = None
    head: tuple[str, int] | None = None  # a line ending in "st" / "step:" (a record's start broken)
    orphans: list[int] = []
    tails: list[str] = []  # a number's last characters alone on the next line, joined to it
    for i, raw in enumerate(lines, start=1):
        if not raw:
            if rec is not None:
                _close_verl(rec, rows, warnings, steps_seen)
                rec = None
            continue
        line = clean(raw)
        start = verl_record_start(line) if "step:" in line else None
        if rec is not None:
            # "- training/global_" + "step:3 - ...": a name split before "step:", not a new record
            # (global_step is the step itself, so the glued value equals the open record's step)
            tail = rec.tail.strip()
            glue_key = (start == 0 and tail.startswith("-") and ":" not in tail and tail[-1:] not in "- "
                        and rec.parsed is not None and _step_of_text(line) == rec.parsed.step)
            if start is None or glue_key:
                note = rec.extend(line, i)
                if note is not None:
                    if note:
                        tails.append(note)
                    continue
            _close_verl(rec, rows, warnings, steps_seen)
            rec = None
        if start is None and head is not None and verl_record_start(head[0] + line) == 0:
            rec = _Record(head[0] + line, head[1])  # "... st" + "ep:3 - ...": "step:" broken
            head = None
            continue
        head = None
        if start is not None:
            rec = _Record(line[start:], i)
        elif _ORPHAN_ITEM.search(_RAY_PREFIX.sub("", line, count=1)):
            orphans.append(i)
        else:
            m = _STEP_HEAD.search(line)
            head = (m.group(0), i) if m else None
    if rec is not None:
        _close_verl(rec, rows, warnings, steps_seen)
    if tails:
        more = f" (and {len(tails) - 3} more lines like it)" if len(tails) > 3 else ""
        warnings.append(f"{'; '.join(tails[:3])}{more}: a number wrapped at the line break, its end alone on the "
                        "next line; check those lines if they were separate output")
    if orphans:
        shown = ", ".join(map(str, orphans[:5])) + (f" and {len(orphans) - 5} more" if len(orphans) > 5 else "")
        warnings.append(f"line {shown}: ' - key:value' items outside any step record (another line came "
                        "between them and their 'step:N'); ignored")
    return rows


def _step_of_text(line: str) -> int | None:
    m = _STEP.match(line)
    return int(m.group("step")) if m else None


# ---------------------------------------------------------------------------- Miles
def literal_dict(text: str) -> dict[str, Any] | None:
    """A Python dict repr (with numpy/torch scalars, nan, inf) as a dict; None if it does not parse."""
    text = _NP_SCALAR.sub(r"\1", text)
    text = _TENSOR_SCALAR.sub(r"\1", text)
    text = _BARE_NAN.sub("None", text)  # None -> NaN below
    text = _BARE_INF.sub("1e999", text)  # 1e999 parses as inf
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    return {str(k): (math.nan if v is None else v) for k, v in value.items()}


def _dict_end(text: str) -> int | None:
    """Index just past the brace that closes the dict opening `text`, outside quotes; None if open."""
    depth, quote, escape = 0, "", False
    for j, ch in enumerate(text):
        if quote:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
            if depth == 0:
                return j + 1
    return None


def read_miles_console(lines: list[str], warnings: list[str], emit: Any) -> None:
    """Miles `kind N: {...}` records, joined over lines; `emit(record, kind, id, where)` for each."""
    open_rec: list[Any] | None = None  # [kind, id, first line, text so far]
    pending: tuple[str, str] | None = None  # "perf 3:" ended a line; the dict may start the next

    def finish(kind: str, rid: str, first: int, text: str, last: int) -> None:
        end = _dict_end(text)
        where = f"line {first}" if first == last else f"lines {first}-{last}"
        record = literal_dict(text[:end]) if end is not None else None
        if record is None:
            warnings.append(f"{where}: Miles '{kind}' record has an unreadable dict; ignored")
            return
        emit(record, kind, rid, where)

    for i, raw in enumerate(lines, start=1):
        line = clean(raw)
        cont = _RAY_PREFIX.sub("", line, count=1)
        if pending is not None and cont.lstrip().startswith("{"):
            line = f"{pending[0]} {pending[1]}: {cont.lstrip()}"
        pending = None
        m = _MILES_START.search(line) if ":" in line else None
        if open_rec is not None:
            kind, rid, first, text = open_rec
            if not line or (m and m.group("dict")) or len(text) + len(cont) > MAX_RECORD_CHARS:
                why = "too long" if line and not m else f"cut short before line {i}"
                warnings.append(f"lines {first}-{i - 1}: Miles '{kind}' record is not closed ({why}); ignored")
                open_rec = None
            else:
                text += cont
                if _dict_end(text) is not None:
                    finish(kind, rid, first, text, i)
                    open_rec = None
                else:
                    open_rec[3] = text
                continue
        if not m:
            continue
        if m.group("dict") is None:
            pending = (m.group("kind"), m.group("id"))
        elif _dict_end(m.group("dict")) is not None:
            finish(m.group("kind"), m.group("id"), i, m.group("dict"), i)
        else:
            open_rec = [m.group("kind"), m.group("id"), i, m.group("dict")]
    if open_rec is not None:
        warnings.append(f"lines {open_rec[2]}-{len(lines)}: Miles '{open_rec[0]}' record is not closed at the "
                        "end of the file (cut short); ignored")
