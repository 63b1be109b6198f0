"""The HTML report of a run or a session: verdicts, check tables, charts.

- `html.py`    `render_report`, `render_session_report`, `overall_verdict`
- `charts.py`  the plotly charts
- `summary.py` counts and one-line summaries

May import: `rlbench.checks.results` (the records it renders). Nothing that trains or checks.
"""
