"""Ingest of the log shapes real runs produce: wrapped verl step lines (any width, keys and numbers
split at the break), one item per line, wrapped Miles dicts, records cut mid-value, verl's older
names, mean reward vs accuracy, steps out of order, and oversize or binary files.

Each input is built here from a clean log; the test asserts the reassembled table equals the
clean one, or that the problem is named (line and reason) instead of dropped or misread."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rlbench.ingest.load import MAX_LINE_BYTES, load_metrics
from tests.helpers.verl_logs import (
    RAY,
    miles_perf_record,
    verl_console_items,
    verl_console_line,
    verl_console_log,
    wrap,
)
from trainer.errors import DataError


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _clean_frame(tmp_path: Path, steps: range = range(1, 6)) -> pd.DataFrame:
    log = load_metrics(_write(tmp_path / "clean.log", verl_console_log(steps)))
    assert log.warnings == []
    return log.frame


# ---------------------------------------------------------------- 1-2: wrapped at any width
@pytest.mark.parametrize("width", [7, 23, 40, 57, 80, 100, 133, 200, 301])
@pytest.mark.parametrize("strip", [True, False])
def test_wrapped_step_lines_read_as_the_unwrapped_log(tmp_path: Path, width: int, strip: bool) -> None:
    clean = _clean_frame(tmp_path)
    assert clean.shape == (5, 9)
    log = load_metrics(_write(tmp_path / "wrapped.log", wrap(verl_console_log(range(1, 6)), width, strip=strip)))
    assert log.source_format == "verl-console"
    assert log.warnings == []
    pd.testing.assert_frame_equal(log.frame, clean)


def test_key_split_mid_word_is_joined(tmp_path: Path) -> None:
    line = verl_console_line(1)
    cut = line.index("ritic/returns/min")  # "... - c" / "ritic/returns/min:..."
    log = load_metrics(_write(tmp_path / "k.log", [line[:cut], line[cut:]]))
    assert log.frame.loc[1, "critic/returns/min"] == -0.26
    assert len(log.frame.columns) == 9 and log.warnings == []


def test_number_split_at_the_break_is_not_read_short(tmp_path: Path) -> None:
    line = verl_console_line(0, prefix="")
    cut = line.index("368.") + len("368.")  # "response_length/mean:368." / "902 - ..."
    assert line[cut:].startswith("902 - ")
    log = load_metrics(_write(tmp_path / "n.log", [line[:cut], line[cut:]]))
    assert log.frame.loc[0, "response_length/mean"] == 368.902  # not 368.0
    cut = line.index("368.9") + len("368.9")  # the part before the break is a number by itself
    log = load_metrics(_write(tmp_path / "n2.log", [line[:cut], line[cut:]]))
    assert log.frame.loc[0, "response_length/mean"] == 368.902 and log.warnings == []


def test_separator_split_at_the_break(tmp_path: Path) -> None:
    line = verl_console_line(2)
    cut = line.index(" - actor/lr") + 2  # "... - " / "actor/lr:..." with the space lost
    log = load_metrics(_write(tmp_path / "s.log", [line[:cut].rstrip(), line[cut:]]))
    assert log.frame.loc[2, "actor/lr"] == 1e-6 and len(log.frame.columns) == 9


def test_name_split_just_before_step_is_not_a_new_record(tmp_path: Path) -> None:
    line = verl_console_line(4)
    cut = line.index("step:4 - actor/lr")  # "... - training/global_" / "step:4 - actor/lr:..."
    log = load_metrics(_write(tmp_path / "g.log", [line[:cut], line[cut:]]))
    assert list(log.frame.index) == [4]
    assert log.frame.loc[4, "training/global_step"] == 4.0 and log.frame.loc[4, "actor/lr"] == 1e-6


# ---------------------------------------------------------------- 3: one item per line
@pytest.mark.parametrize("item_prefix", ["", RAY])
def test_one_item_per_line(tmp_path: Path, item_prefix: str) -> None:
    lines = ["INFO start"]
    for s in (1, 2):
        lines.append(f"{RAY}step:{s}")
        lines += [f"{item_prefix} - {k}:{v}" for k, v in verl_console_items(s)]
    log = load_metrics(_write(tmp_path / "items.log", lines))
    assert list(log.frame.index) == [1, 2] and len(log.frame.columns) == 9
    assert log.frame.loc[2, "response_length/mean"] == 370.902
    assert log.warnings == []


def test_items_cut_off_from_their_step_are_named(tmp_path: Path) -> None:
    lines = [f"{RAY}step:1 - actor/ppo_kl:0.1", "(WorkerDict pid=9) loading shard 3", " - actor/lr:1e-06"]
    log = load_metrics(_write(tmp_path / "orphan.log", lines))
    assert list(log.frame.columns) == ["actor/ppo_kl"]
    assert any(w.startswith("line 3: ' - key:value' items outside any step record") for w in log.warnings)


# ---------------------------------------------------------------- 4: wrapped Miles dicts
@pytest.mark.parametrize("width", [30, 64, 90])
def test_wrapped_miles_records_appended_to_a_good_file(tmp_path: Path, width: int) -> None:
    good = [miles_perf_record(0)]
    wrapped = wrap([miles_perf_record(1), miles_perf_record(2)], width)
    assert len(wrapped) > 4
    log = load_metrics(_write(tmp_path / "miles.log", good + wrapped))
    assert log.source_format == "miles-console"
    assert list(log.frame.index) == [0, 1, 2]
    assert log.frame.loc[2, "perf/throughput"] == 1202.5 and log.frame.loc[1, "timing_s/gen"] == 151.0
    assert log.warnings == []


def test_miles_record_never_closed_is_named(tmp_path: Path) -> None:
    rec = miles_perf_record(1)
    lines = [miles_perf_record(0), rec[:70], rec[70:120], miles_perf_record(2)[:60]]
    log = load_metrics(_write(tmp_path / "cut.log", lines))
    assert list(log.frame.index) == [0]
    assert any(w.startswith("lines 2-3: Miles 'perf' record is not closed") for w in log.warnings)
    assert any(w.startswith("lines 4-4: Miles 'perf' record is not closed at the end") for w in log.warnings)


def test_miles_dict_on_the_line_after_its_head(tmp_path: Path) -> None:
    rec = miles_perf_record(3)
    head, body = rec.split(": {", 1)
    log = load_metrics(_write(tmp_path / "head.log", [head + ":", "{" + body]))
    assert log.frame.loc[3, "timing_s/step"] == 388.5


# ---------------------------------------------------------------- 5: cut mid-value
def test_record_cut_mid_value_at_eof_is_warned(tmp_path: Path) -> None:
    line = verl_console_line(2)
    cut = line.index("timing_s/old_log_prob:8.") + len("timing_s/old_log_prob:8.")
    log = load_metrics(_write(tmp_path / "eof.log", [verl_console_line(1), line[:cut]]))
    assert "timing_s/old_log_prob" in log.frame.columns
    assert math.isnan(log.frame.loc[2, "timing_s/old_log_prob"])  # not read as 8.0
    assert log.frame.loc[2, "critic/score/mean"] == 0.52  # the items before the cut are kept
    assert log.warnings == [("line 2: step 2 is cut short at '- timing_s/old_log_prob:8.' (a name or value broken "
                             "off, like a truncated JSON line); read 6 items, that one ignored")]


@pytest.mark.parametrize("cut_after", ["timing_s/old_log_prob:8.", "actor/lr:1e-", "actor/ppo_kl:np.float64(0.",
                                       "critic/returns/mi", "critic/score/mean:"])
def test_record_cut_before_the_next_record_is_warned(tmp_path: Path, cut_after: str) -> None:
    line = verl_console_line(2)
    cut = line.index(cut_after) + len(cut_after)
    log = load_metrics(_write(tmp_path / "mid.log", [verl_console_line(1), line[:cut], verl_console_line(3)]))
    assert list(log.frame.index) in ([1, 2, 3], [1, 3])
    assert len(log.warnings) == 1 and log.warnings[0].startswith("line 2: step 2 is cut short at")
    assert log.frame.loc[3, "actor/lr"] == 1e-6


# ---------------------------------------------------------------- 7: older names and rewards
QUICKSTART = ("step:0 - timing/gen:21.470 - timing/ref:4.360 - timing/update_critic:15.664 - critic/vf_loss:14.947 "
              "- critic/lr(1e-4):0.100 - timing/update_actor:20.314 - actor/entropy_loss:0.433 - actor/pg_loss:-0.005 "
              "- actor/lr(1e-4):0.010 - critic/score/mean:0.004 - response_length/mean:239.133")


def test_verl_quickstart_names_are_mapped_and_scaled(tmp_path: Path) -> None:
    f = load_metrics(_write(tmp_path / "qs.log", [QUICKSTART])).frame
    assert f.loc[0, "timing_s/gen"] == 21.47 and f.loc[0, "timing_s/update_actor"] == 20.314
    assert f.loc[0, "critic/lr"] == pytest.approx(1e-5) and f.loc[0, "actor/lr"] == pytest.approx(1e-6)
    assert f.loc[0, "actor/entropy"] == 0.433
    assert not any(c.startswith("timing/") or "(1e-4)" in c for c in f.columns)


def _reward_log(tmp_path: Path, values: list[float], score_min: float = 0.0) -> Path:
    lines = [f"step:{s} - val-core/x/reward/mean@4:{v} - critic/score/min:{score_min} - critic/score/max:1.0"
             for s, v in enumerate(values)]
    return _write(tmp_path / "r.log", lines)


def test_mean_reward_is_not_read_as_accuracy_by_default(tmp_path: Path) -> None:
    f = load_metrics(_reward_log(tmp_path, [0.5, 0.7])).frame
    assert "val-core/x/reward/mean@4" in f.columns and "val-core/x/acc/mean@4" not in f.columns


def test_reward_as_accuracy_on_request_and_checked(tmp_path: Path) -> None:
    log = load_metrics(_reward_log(tmp_path, [0.5, 0.7]), reward_is_accuracy=True)
    assert list(log.frame["val-core/x/acc/mean@4"]) == [0.5, 0.7]
    assert log.notes == ["val-core/x/reward/mean@4 read as val-core/x/acc/mean@4 (--reward-is-accuracy: 0/1 rewards)"]
    with pytest.raises(DataError, match=r"critic/score/min leaves \[0, 1\], so rewards are not 0/1"):
        load_metrics(_reward_log(tmp_path, [0.5, 0.7], score_min=-1.0), reward_is_accuracy=True)
    with pytest.raises(DataError, match=r"is -0.2 at step 0, outside \[0, 1\]: it is a mean reward"):
        load_metrics(_reward_log(tmp_path, [-0.2, 0.7]), reward_is_accuracy=True)


# ---------------------------------------------------------------- step order
def test_steps_out_of_order_duplicated_and_negative_are_named(tmp_path: Path) -> None:
    lines = [f'{{"step": {s}, "data": {{"a/x": {i}}}}}' for i, s in enumerate([5, -3, 5, 2, 2, 1])]
    log = load_metrics(_write(tmp_path / "order.jsonl", lines))
    assert list(log.frame.index) == [1, 2, 5]
    assert log.frame.loc[5, "a/x"] == 2.0  # the later line of step 5 wins
    text = " | ".join(log.warnings)
    assert "negative steps -3 (line 2) are not steps of a run; ignored" in text
    assert "steps go back: step -3 at line 2 after step 5; step 2 at line 4 after step 5; step 1 at line 6" in text
    assert "steps logged again after other steps: 5 (lines 1, 3)" in text


def test_console_negative_step_is_read_and_named(tmp_path: Path) -> None:
    log = load_metrics(_write(tmp_path / "neg.log", ["step:-1 - a/x:1", "step:1 - a/x:2"]))
    assert list(log.frame.index) == [1]
    assert any("negative steps -1 (line 1)" in w for w in log.warnings)


# ---------------------------------------------------------------- size guard, binary, empty
def test_oversize_json_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    with path.open("w") as f:
        f.write('{"step": 1, "data": {"a/x": 1}}\n{"step": 2, "data": {"a/x": "' + "x" * (25 * 10**6) + '"}}\n')
    with pytest.raises(DataError, match=r"big\.jsonl:2: line is 25\.0 MB, over the 1\.0 MB limit"):
        load_metrics(path)


def test_oversize_console_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    path.write_text(verl_console_line(1) + "\n" + "y" * (3 * MAX_LINE_BYTES) + "\n" + verl_console_line(2) + "\n")
    log = load_metrics(path)
    assert list(log.frame.index) == [1, 2]
    assert log.warnings == ["line 2: 3.1 MB long, over the 1.0 MB limit of a log line; skipped unread"]


def test_one_line_file_over_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "one.log"
    path.write_text("step:1 - a/x:" + "1" * (2 * MAX_LINE_BYTES))
    with pytest.raises(DataError, match=r"one\.log:1: a 2\.1 MB line, over the 1\.0 MB limit .* not a metrics log"):
        load_metrics(path)


def test_binary_empty_and_directory_logs_are_refused(tmp_path: Path) -> None:
    binary = tmp_path / "b.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\x00\x00" + bytes(range(256)) * 8)
    with pytest.raises(DataError, match=r"b\.bin: is a binary file"):
        load_metrics(binary)
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match=r"e\.jsonl: the file is empty"):
        load_metrics(empty)
    with pytest.raises(DataError, match="is a directory, not a metrics log"):
        load_metrics(tmp_path)


# ---------------------------------------------------------------- other malformed records
def test_number_tail_alone_on_a_line_is_joined_and_named(tmp_path: Path) -> None:
    log = load_metrics(_write(tmp_path / "tail.log", ["step:1 - a/x:0.5 - a/y:368.9", "02", "step:2 - a/x:1"]))
    assert log.frame.loc[1, "a/y"] == 368.902
    assert log.warnings == [("line 2: '02' read as the rest of step 1's value of 'a/y': a number wrapped at the line "
                             "break, its end alone on the next line; check those lines if they were separate output")]


def test_miles_record_with_an_unreadable_dict_is_named(tmp_path: Path) -> None:
    log = load_metrics(_write(tmp_path / "m.log", [miles_perf_record(0), "INFO - perf 1: {'a': 1, 'b': }"]))
    assert list(log.frame.index) == [0]
    assert log.warnings == ["line 2: Miles 'perf' record has an unreadable dict; ignored"]


@pytest.mark.parametrize("second, needle", [
    ("[1, 2]", r"j\.jsonl:2: expected a JSON object per line, got list"),
    ('{"step": 2, "data": [1]}', r"j\.jsonl:2: 'data' must be an object of metric -> value"),
    ('{"step": "two", "data": {"a/x": 1}}', r"j\.jsonl:2: step key 'step' has value 'two', expected an integer"),
])
def test_malformed_json_records_are_refused_naming_the_line(tmp_path: Path, second: str, needle: str) -> None:
    path = _write(tmp_path / "j.jsonl", ['{"step": 1, "data": {"a/x": 1}}', second, '{"step": 3, "data": {"a/x": 3}}'])
    with pytest.raises(DataError, match=needle):
        load_metrics(path)


def test_miles_jsonl_line_without_a_step_key_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", ['{"rollout/step": 0, "perf/step_time": 1.0}', '{"perf/step_time": 2.0}'])
    with pytest.raises(DataError, match=r"m\.jsonl:2: no step key \(one of step, rollout/step"):
        load_metrics(path)


def test_miles_counters_interleaved_are_not_out_of_order(tmp_path: Path) -> None:
    """Miles logs rollout, optimizer-step and eval records with separate counters, interleaved."""
    lines = ["INFO - perf 1: {'perf/rollout_time': 1.0}", "INFO - step 0: {'train/ppo_kl': 0.1}",
             "INFO - perf 1: {'perf/step_time': 2.0}", "INFO - step 1: {'train/ppo_kl': 0.2}",
             "INFO - eval 1: {'eval/aime': 0.5}", "INFO - perf 2: {'perf/rollout_time': 1.0}",
             "INFO - perf 0: {'perf/rollout_time': 9.0}"]
    log = load_metrics(_write(tmp_path / "m.log", lines))
    assert log.warnings == [("steps go back: step 0 at line 7 after step 2 (a resumed or concatenated run?); "
                             "the table is sorted by step")]


def test_container_log_split_lines_rejoin(tmp_path: Path) -> None:
    """Kubernetes (CRI) splits long lines into partial entries tagged P, each with its own prefix."""
    line, out = verl_console_line(3), []
    for i in range(0, len(line), 100):
        tag = "P" if i + 100 < len(line) else "F"
        out.append(f"2026-01-01T12:00:0{i // 100 % 10}.123456789Z stdout {tag} {line[i:i + 100]}")
    log = load_metrics(_write(tmp_path / "cri.log", out))
    assert log.warnings == [] and len(log.frame.columns) == 9
    assert log.frame.loc[3, "perf/total_num_tokens"] == 12288.0


def test_items_after_a_foreign_prefix_are_not_dropped_silently(tmp_path: Path) -> None:
    line = verl_console_line(1)
    cut = line.index(" - actor/lr")  # the break falls between two items; the collector stamps the rest
    log = load_metrics(_write(tmp_path / "ts.log", [line[:cut], "[node-3 12:00:01]" + line[cut:]]))
    assert "actor/lr" not in log.frame.columns
    assert log.warnings[-1].startswith("line 2: ' - key:value' items outside any step record")


def test_text_encodings_and_odd_steps(tmp_path: Path) -> None:
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + b'{"step": 1, "data": {"a/x": 1}}\r\n{"step": 2, "data": {"a/x": 2}}\r\n')
    assert list(load_metrics(bom).frame["a/x"]) == [1.0, 2.0]  # BOM and CRLF line ends
    utf16 = tmp_path / "u16.log"
    utf16.write_bytes("step:1 - a/x:1\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"u16\.log: is UTF-16 text; convert it to UTF-8 first \(iconv"):
        load_metrics(utf16)
    for raw in ("true", "null", "1e400"):
        path = _write(tmp_path / "s.jsonl", ['{"step": 1, "data": {"a/x": 1}}', f'{{"step": {raw}, "data": {{"a/x": 1}}}}'])
        with pytest.raises(DataError, match=r"s\.jsonl:2: step key 'step' has value .*, expected an integer"):
            load_metrics(path)


def test_metric_name_with_a_byte_that_is_not_utf8_is_refused_naming_the_line(tmp_path: Path) -> None:
    """`actor/pp\\xffo_kl` at line 3 would read as a new metric while actor/ppo_kl goes missing at that step."""
    good = [b'{"step": %d, "data": {"actor/ppo_kl": 0.001}}' % t for t in (1, 2, 4)]
    p = tmp_path / "m.jsonl"
    p.write_bytes(b"\n".join([*good[:2], b'{"step": 3, "data": {"actor/pp\xffo_kl": 0.001}}', good[2]]) + b"\n")
    with pytest.raises(DataError) as info:
        load_metrics(p)
    msg = str(info.value)
    assert msg.startswith(f"{p}:3: metric name 'actor/pp?o_kl' has a byte that is not UTF-8") and "\n" not in msg
    c = tmp_path / "c.log"  # a console log: the same, at its line
    c.write_bytes(b"step:1 - actor/ppo_kl:0.001\nstep:2 - actor/pp\xe9o_kl:0.001 - a/b:1\n")
    with pytest.raises(DataError, match=r"c\.log:2: metric name 'actor/pp\?o_kl'"):
        load_metrics(c)
    ok = tmp_path / "ok.log"  # a byte that is not UTF-8 outside the metrics stays harmless
    ok.write_bytes(b"loading caf\xe9 dataset\nstep:1 - actor/ppo_kl:0.001\n")
    assert list(load_metrics(ok).frame.columns) == ["actor/ppo_kl"]


def test_dev_null_and_a_fifo_are_not_regular_files(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    for path, kind in ((Path(os.devnull), "a character device"), (fifo, "a FIFO")):
        with pytest.raises(DataError) as info:
            load_metrics(path)
        assert str(info.value).startswith(f"{path}: not a regular file ({kind}), not a metrics log")
    with pytest.raises(DataError, match="metrics log not found"):
        load_metrics(tmp_path / "nope.log")


def test_steps_logged_as_nan_are_kept_apart_from_steps_without_the_metric(tmp_path: Path) -> None:
    """JSON NaN, the trainer's "nan" string and a console `nan`: in frame.attrs["nan_steps"]; a step that
    does not log the metric is not there."""
    j = tmp_path / "j.jsonl"
    j.write_text('{"step": 1, "data": {"a/x": NaN, "a/y": 1}}\n{"step": 2, "data": {"a/y": 2}}\n'
                 '{"step": 3, "data": {"a/x": "nan", "a/y": "nan"}}\n{"step": 4, "data": {"a/x": 0.5}}\n')
    frame = load_metrics(j).frame
    assert {k: list(v) for k, v in frame.attrs["nan_steps"].items()} == {"a/x": [1, 3], "a/y": [3]}
    assert math.isnan(frame.loc[2, "a/x"])  # step 2 did not log a/x: a gap, not a NaN it logged
    c = tmp_path / "c.log"
    c.write_text("step:1 - a/x:np.float64(nan) - a/y:1\nstep:2 - a/y:2\n")
    assert {k: list(v) for k, v in load_metrics(c).frame.attrs["nan_steps"].items()} == {"a/x": [1]}
