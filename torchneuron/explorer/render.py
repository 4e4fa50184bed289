"""The report as one HTML file: the template with the stylesheet, the script and
the analysis (as JSON) written into it, so it opens offline with nothing else."""
from __future__ import annotations

import html
import json
import re
from importlib import resources

PLACEHOLDER = re.compile(r"@@(TITLE|CSS|JS|DATA)@@")


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath("assets", name).read_text(encoding="utf-8")


def embedded_json(data) -> str:
    """JSON safe inside a <script> element: no "<", ">" or "&" outside escapes."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_html(analysis: dict, title: str = "neuron explorer") -> str:
    parts = {"TITLE": html.escape(title), "CSS": _asset("explorer.css"), "JS": _asset("explorer.js"),
             "DATA": embedded_json(analysis)}
    # One pass, so text inside the stylesheet, script or data is never taken for a placeholder.
    return PLACEHOLDER.sub(lambda m: parts[m.group(1)], _asset("template.html"))
