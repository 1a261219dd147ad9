"""The README's commands work when pasted.

Each test takes a block from README.md as written and runs it with bash,
changing only what a test must: ``tprun`` and ``python`` become this
interpreter's, and paths under /tmp move to the test's own folder (so
nothing is left in /tmp).
"""

from __future__ import annotations

import os
import re
import shlex
import sys

import pytest

from tests.helpers.proc_utils import ROOT, run_in_session


def readme_block(containing: str) -> str:
    """The ```bash block of README.md that contains ``containing``."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```bash\n(.*?)```", f.read(), re.S)
    matches = [b for b in blocks if containing in b]
    assert len(matches) == 1, f"{len(matches)} README blocks contain {containing!r}"
    return matches[0]


def localize(block: str, tmp_path) -> str:
    python = shlex.quote(sys.executable)
    block = block.replace("/tmp/", f"{tmp_path}/")
    block = re.sub(r"^tprun ", f"{python} -m launch ", block, flags=re.M)
    block = re.sub(r"^torchrun ", f"{python} -m torch.distributed.run ", block, flags=re.M)
    block = re.sub(r"&& tprun ", f"&& {python} -m launch ", block)
    return re.sub(r"^python ", f"{python} ", block, flags=re.M)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_serve_example_works_when_pasted(tmp_path):
    block = readme_block("--endpoint-file /tmp/tprun.endpoint &")
    script = localize(block, tmp_path) + "wait\n"
    result, leftovers = run_in_session(["bash", "-c", script], timeout=220,
                                       env={"TPRUN_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("tprun serve: ready: engine endpoint ipc://"), result.stdout
    assert len(lines) >= 2 and "Traceback" not in result.stderr, result.stderr
    assert leftovers == []
    assert not (tmp_path / "tprun.endpoint").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_attach_example_runs_twice_as_written(tmp_path):
    """The torchrun example reuses its socket folder; tprun says what it waits for."""
    script = localize(readme_block("--attach-workers"), tmp_path)
    for _ in range(2):
        result, leftovers = run_in_session(["bash", "-c", script], timeout=140,
                                           env={"TPRUN_CACHE": str(tmp_path / "cache")})
        assert result.returncode == 0, result.stderr
        assert f"tprun: waiting for 2 workers at {tmp_path}/tp" in result.stderr
        assert result.stdout.count("->") == 2, result.stdout  # one line per default prompt
        assert leftovers == []
        assert list((tmp_path / "tp").iterdir()) == []


@pytest.mark.timeout(180)
def test_async_api_example_runs_as_written(tmp_path):
    """The Async API's Python block, run as a script: deltas of eight
    tokens in all (those that come while the script prints are merged into
    one), only the last finished, then the two completions of the second
    request."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        blocks = [b for b in re.findall(r"```python\n(.*?)```", f.read(), re.S)
                  if "AsyncLLM(" in b]
    assert len(blocks) == 1
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    result, leftovers = run_in_session([sys.executable, str(script)], timeout=160,
                                       env={"TPRUN_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    *deltas, last = result.stdout.splitlines()
    parsed = [re.fullmatch(r"(\[[\d, ]+\]) '.*' (True|False)", line) for line in deltas]
    assert all(parsed), result.stdout
    assert sum(len(eval(m.group(1))) for m in parsed) == 8
    assert [m.group(2) for m in parsed] == ["False"] * (len(deltas) - 1) + ["True"]
    completions = eval(last)  # a list of two lists of token ids
    assert len(completions) == 2 and all(1 <= len(c) <= 8 for c in completions)
    assert leftovers == []


def test_client_names_the_missing_server_after_its_timeout(tmp_path):
    from serving.client import EngineClient

    path = str(tmp_path / "endpoint")
    with pytest.raises(TimeoutError, match=r"no endpoint file .* `tprun serve --endpoint-file"):
        EngineClient(path, ready_timeout_s=0.3)


def test_docs_point_nowhere_outside_the_repository():
    """Every relative path the README and docs/ name resolves inside the repository."""
    pages = [os.path.join(ROOT, "README.md")]
    pages += [os.path.join(ROOT, "docs", n) for n in os.listdir(os.path.join(ROOT, "docs"))]
    for page in pages:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for ref in re.findall(r"(?:\.\./)+[\w./-]+", text):
            target = os.path.realpath(os.path.join(os.path.dirname(page), ref))
            assert target.startswith(ROOT + os.sep), f"{page} points outside: {ref}"
    assert os.path.exists(os.path.join(ROOT, "docs", "design.md"))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_run_batch_example_prints_the_output_line_shown(tmp_path):
    """The README's run-batch block, pasted: its output line is the one the
    README shows, but for the ids and the time, which are fresh each run."""
    script = localize(readme_block("run-batch -i /tmp/requests.jsonl"), tmp_path)
    result, leftovers = run_in_session(["bash", "-c", script], timeout=220,
                                       env={"TPRUN_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    assert leftovers == []
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        shown = re.search(r'\n(\{"id":"tprun-[^\n]*)\n', f.read()).group(1)
    fresh = r'"(tprun-[0-9a-f]{32}|tprun-batch-[0-9a-f]{32}|chatcmpl-[0-9a-f]{24})"|"created":\d+'
    assert re.sub(fresh, "X", result.stdout.strip()) == re.sub(fresh, "X", shown)
