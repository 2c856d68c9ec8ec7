"""A self-contained HTML page: plotly.js inlined once, figures as divs, tables, no external resources
(the report opens offline and inside the MLflow UI's artifact viewer)."""

from __future__ import annotations

import html
import math
from typing import Any

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1200px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: right; } th { background: #f4f4f4; }
td.l, th.l { text-align: left; } .note { color: #555; font-size: 0.9em; }
"""


def fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "nan" if math.isnan(v) else "inf"
        if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
            return f"{v:.4g}"
        return f"{v:.4f}"
    return str(v)


def table(rows: list[dict], columns: list[str] | None = None) -> str:
    if not rows:
        return '<p class="note">(no rows)</p>'
    columns = columns or list(rows[0])
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c, "")
            cls = ' class="l"' if isinstance(v, str) else ""
            cells.append(f"<td{cls}>{html.escape(fmt(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def page(title: str, sections: list[tuple[str, str]], subtitle: str = "") -> str:
    from plotly.offline import get_plotlyjs

    parts = [f"<h2>{html.escape(h)}</h2>\n{body}" for h, body in sections]
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>\n"
            f"<style>{STYLE}</style>\n<script type=\"text/javascript\">{get_plotlyjs()}</script>\n</head>\n"
            f"<body>\n<h1>{html.escape(title)}</h1>\n<p class=\"note\">{subtitle}</p>\n" + "\n".join(parts)
            + "\n</body></html>\n")


def figure(fig) -> str:
    """A figure's div and script; plotly.js itself is in the page head (once, inline)."""
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False})


def note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>'
