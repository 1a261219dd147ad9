"""``tprun bench serve`` run in process against a test server, with the
tiny model's tokenizer and a small random workload."""

from __future__ import annotations

import json

from checkpoint.tiny_model import ensure_tiny_model
from launch.cli import main


def bench(url: str, tmp_path, *args: str) -> tuple[int, dict | None]:
    """The exit code and the saved result (``--save-detailed``; None when
    none was written) of bench serve against ``url`` with ``args`` added."""
    result = tmp_path / "result.json"
    code = main(["bench", "serve", "--base-url", url, "--model", "m", "--tokenizer",
                 ensure_tiny_model(), "--random-input-len", "8", "--random-output-len", "3",
                 "--disable-tqdm", "--save-result", "--save-detailed", "--result-filename",
                 str(result), *args])
    return code, (json.loads(result.read_text()) if result.exists() else None)
