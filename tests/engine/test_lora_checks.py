"""``LoRAChecks`` across threads: an adapter being read (a runtime load's
check over HTTP, from a slow disk) holds up no check of another adapter,
so the engine's loop, which makes token-id requests itself, goes on; two
adapters that claim one name still never both pass."""

from __future__ import annotations

import threading

import pytest

import engine.lora_checks as lora_checks
from engine.lora_checks import LoRAChecks
from ipc.config import LoRAConfig
from ipc.errors import InvalidRequestError
from ipc.lora_request import LoRARequest

KNOWN = LoRARequest("known", 1, "/adapters/known")
SLOW = LoRARequest("slow", 2, "/adapters/slow")


@pytest.fixture
def reads(monkeypatch):
    """``read_adapter`` replaced: each read is recorded, and a read of the
    slow adapter's path waits until ``release`` is set."""
    entered, release, paths = threading.Event(), threading.Event(), []

    def read(path, model, max_lora_rank):
        paths.append(path)
        if path == SLOW.lora_path:
            entered.set()
            release.wait()

    monkeypatch.setattr(lora_checks, "read_adapter", read)
    yield entered, release, paths
    release.set()


def _in_thread(work) -> tuple[threading.Thread, list]:
    errors = []

    def run():
        try:
            work()
        except Exception as e:  # handed to the test
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


@pytest.mark.timeout(60)
def test_a_read_in_progress_holds_up_no_other_check(reads):
    entered, release, paths = reads
    checks = LoRAChecks(LoRAConfig(max_loras=1, max_lora_rank=8), model=None)
    checks.check(KNOWN)
    slow, slow_errors = _in_thread(lambda: checks.check(SLOW))
    assert entered.wait(30)
    other = LoRARequest("other", 3, "/adapters/other")
    for lora in (KNOWN, other):  # known, and read for the first time
        thread, errors = _in_thread(lambda lora=lora: checks.check(lora))
        thread.join(30)
        finished = not thread.is_alive()
        if not finished:
            release.set()
        assert finished and errors == [], f"{lora.lora_name} waited on the slow read"
    release.set()
    slow.join(30)
    assert not slow.is_alive() and slow_errors == []
    assert paths == [KNOWN.lora_path, SLOW.lora_path, "/adapters/other"]
    checks.check(SLOW)  # remembered: not read again
    assert paths.count(SLOW.lora_path) == 1


@pytest.mark.timeout(60)
def test_two_adapters_of_one_name_read_at_once_never_both_pass(reads):
    entered, release, _ = reads
    checks = LoRAChecks(LoRAConfig(max_loras=1, max_lora_rank=8), model=None)
    slow, slow_errors = _in_thread(lambda: checks.check(SLOW))
    assert entered.wait(30)
    rival = LoRARequest("slow", 9, "/adapters/rival")  # read while SLOW's read waits
    thread, errors = _in_thread(lambda: checks.check(rival))
    thread.join(30)
    finished = not thread.is_alive()
    release.set()
    assert finished and errors == [], "the rival waited on the slow read"
    slow.join(30)
    assert len(slow_errors) == 1 and isinstance(slow_errors[0], InvalidRequestError)
    assert "give this adapter a name of its own" in str(slow_errors[0])
    with pytest.raises(InvalidRequestError, match="give this adapter a name of its own"):
        checks.check(SLOW)
    checks.check(rival)
