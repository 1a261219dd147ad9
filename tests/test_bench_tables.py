"""benchmarks/tables.py turns the kept JSON results into the README's rows."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tables_from_results(tmp_path):
    decode = {"results": [
        {"batch": 1, "context": 512, "step_ms": 4.9287, "ratio_to_floor": 1.314,
         "between_steps_async": {"idle_fraction": 0.0003}, "idle_async": {"idle_fraction": 0.06}},
        {"batch": 1, "context": 4096, "step_ms": 5.1208, "ratio_to_floor": 1.327},
        {"batch": 256, "context": 512, "step_ms": 12.0851, "ratio_to_floor": 1.564},
        {"batch": 256, "context": 4096, "skipped": "KV does not fit"},
    ]}
    (tmp_path / "decode_8b.json").write_text("log line\n" + json.dumps(decode) + "\n")
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "tables.py"),
                          "--results", str(tmp_path)], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert "| 8B | 1 | 4.93 (1.31) | 5.12 (1.33) | 0.03% / 6.0% |" in out
    assert "| 8B | 256 | 12.09 (1.56) | does not fit | - / - |" in out
    assert "<!-- decode_1b.json: not found -->" in out
