"""The self-contained HTML page: inline CSS, inline SVG, one small inline script that checks
every plot rendered (no CDN, no fonts, no external anything)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

CSS = """
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 8px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ccc}
h3{font-size:15px;margin:18px 0 6px} .meta{color:#555} table{border-collapse:collapse;margin:6px 0}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top;font-size:13px}
th{background:#f3f3f3} code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
svg.aegis-plot{display:block;margin:4px 0 12px;background:#fcfcfc;border:1px solid #eee}
.axes .axis{stroke:#999}.axes .grid{stroke:#eee}.axes text{font-size:11px;fill:#555}
.axes .threshold{stroke:#b2182b;stroke-dasharray:5 4}.axes .arrow{stroke:#777;stroke-width:2}
.marks .fault{fill:#f4a582;stroke:#b2182b}.marks .command{fill:#1b7837}
.marks .refusal{stroke:#e08214;stroke-width:3;fill:none}.marks .band{fill:#92c5de;opacity:.45}
.marks .mean{fill:none;stroke:#2166ac;stroke-width:1.5}.marks .bound{fill:none;stroke:#b2182b;stroke-dasharray:6 4}
.marks .value{fill:none;stroke:#111;stroke-width:2}.marks .persistence{fill:#fddbc7;opacity:.7}
.marks .detected{stroke:#b2182b;stroke-width:2}.marks .ratio{fill:none;stroke:#2166ac;stroke-width:1.5}
.marks .slow{fill:#f4a582}.step rect{stroke:#555;fill:#eee}.step.hit rect{fill:#fddbc7;stroke:#b2182b}.step.pass rect{fill:#fff7bc;stroke:#8c510a}
.step text{font-size:12px}.step .outcome{fill:#555;font-size:11px}
.legend span{display:inline-block;margin-right:14px}.sw{display:inline-block;width:12px;height:12px;vertical-align:middle;margin-right:4px}
.appear{color:#1b7837}.disappear{color:#b2182b}.change{color:#8c510a}
#render-check{color:#555;font-size:12px}
"""

SCRIPT = """
(function(){var plots=document.querySelectorAll('svg.aegis-plot'),ok=0;
for(var i=0;i<plots.length;i++){var s=plots[i],g=s.querySelector('g.marks'),w=0,h=0;
try{var b=g.getBBox();w=b.width;h=b.height;}catch(e){}
s.setAttribute('data-rendered',Math.round(w)+'x'+Math.round(h));
if(g.childElementCount>0&&(w>0||h>0)){ok++;}}
var c=document.getElementById('render-check');c.setAttribute('data-plots',plots.length);
c.setAttribute('data-nonempty',ok);c.textContent=ok+' of '+plots.length+' plots rendered with content';})();
"""


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c if isinstance(c, Raw) else escape(str(c))}</td>"
                                    for c in row) + "</tr>" for row in rows)
    return f'<table class="{escape(cls)}"><tr>{head}</tr>{body}</table>'


class Raw(str):
    """Already-escaped HTML for a table cell."""


def legend(items: Mapping[str, str]) -> str:
    return '<div class="legend">' + "".join(
        f'<span><i class="sw" style="background:{c}"></i>{escape(n)}</span>'
        for n, c in items.items()) + "</div>"


def page(title: str, sections: Sequence[str]) -> str:
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            + "".join(sections)
            + '<p id="render-check" data-plots="0" data-nonempty="0">plots not checked</p>'
            + f"<script>{SCRIPT}</script></body></html>\n")
