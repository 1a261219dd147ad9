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
