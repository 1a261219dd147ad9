"""How every benchmark ends: one JSON object printed last, also written to --out."""

from __future__ import annotations

import json
import os


def emit_summary(summary: dict, out: str | None) -> None:
    text = json.dumps(summary)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            f.write(text + "\n")
    print(text, flush=True)
