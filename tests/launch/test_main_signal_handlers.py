"""``launch.cli.main`` called in process gives back the SIGINT and SIGTERM
handlers it found, however the run ends: stopped by Ctrl-C or SIGTERM while
the engine starts (130, 143), or serving until SIGTERM (0). While the exit
of a stopped run removes what a cut-short shutdown left, both signals are
ignored, so a further one cannot cut that cleanup short. A later run in
the same process judges only its own signals: one stopped before it does
not stop it.

Each run is ``serve --model tiny`` with the engine and the server replaced
by stand-ins (no model loads); the signal is a real one, sent to this
process, and reaches the handler the CLI installed for it.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.helpers.serve_stand_ins import stand_in_engine_and_server

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _callers_sigint(_signum, _frame) -> None:
    raise AssertionError("the caller's SIGINT handler ran")


def _callers_sigterm(_signum, _frame) -> None:
    raise AssertionError("the caller's SIGTERM handler ran")


def _signal_self(signum: int, until=lambda: False) -> None:
    """Send ``signum`` to this process; return once ``until()`` holds (a
    handler that raises ends the wait with its exception; a signal never
    acted on is the test's timeout)."""
    os.kill(os.getpid(), signum)
    while not until():
        time.sleep(0.01)


@pytest.fixture
def callers_handlers():
    """The caller's own handlers, installed before ``main`` runs; the
    test's original ones are put back afterwards whatever happens."""
    from executor import stop_signals

    original = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    mine = {signal.SIGINT: _callers_sigint, signal.SIGTERM: _callers_sigterm}
    stop_signals.reset()
    for sig, handler in mine.items():
        signal.signal(sig, handler)
    try:
        yield mine
    finally:
        for sig, handler in original.items():
            signal.signal(sig, handler)
        stop_signals.reset()


def _stand_ins(monkeypatch, stop_at: str, signum: int) -> list[str]:
    """Replace the engine and the engine server; ``signum`` is sent while
    the engine starts (``stop_at`` "start") or while the server serves
    ("serve"); with ``stop_at`` "never" the server stops by itself once
    it serves. Returns the list of what happened."""

    def on_start():
        if stop_at == "start":
            _signal_self(signum)

    def on_serve(server):
        if stop_at == "serve":
            _signal_self(signum, until=lambda: server.stopped)

    return stand_in_engine_and_server(monkeypatch, on_start, on_serve)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("stop_at", "signum", "code", "line"), [
    ("start", signal.SIGINT, 130, "tprun: interrupted"),
    ("start", signal.SIGTERM, 143, "tprun: stopped by SIGTERM"),
])
def test_a_run_stopped_while_starting_gives_back_the_callers_handlers(
        monkeypatch, capsys, callers_handlers, stop_at, signum, code, line):
    import ipc.endpoints
    from launch import cli

    events = _stand_ins(monkeypatch, stop_at, signum)
    during_cleanup = []
    remove = ipc.endpoints.remove_own_directories

    def watched_remove():
        during_cleanup.append({sig: signal.getsignal(sig) for sig in STOP_SIGNALS})
        remove()

    monkeypatch.setattr(ipc.endpoints, "remove_own_directories", watched_remove)
    assert cli.main(["serve", "--model", "tiny", "--device", "cpu"]) == code
    assert capsys.readouterr().err.splitlines()[-1] == line
    assert events == []  # stopped inside the engine's start
    assert during_cleanup == [{sig: signal.SIG_IGN for sig in STOP_SIGNALS}]
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == callers_handlers


@pytest.mark.timeout(60)
def test_a_serve_stopped_by_sigterm_gives_back_the_callers_handlers(
        monkeypatch, capsys, callers_handlers):
    from launch import cli

    events = _stand_ins(monkeypatch, "serve", signal.SIGTERM)
    assert cli.main(["serve", "--model", "tiny", "--device", "cpu"]) == 0
    assert capsys.readouterr().err.splitlines()[-1] == "tprun serve: stopped by SIGTERM"
    assert events == ["engine started", "serving", "server closed", "engine shut down"]
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == callers_handlers


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_run_after_a_stopped_one_in_the_same_process_is_not_stopped(
        monkeypatch, capsys, callers_handlers, signum):
    """The first run is stopped while its engine starts; the second, with
    no signal sent, serves and ends by itself: exit code 0, no line saying
    it was stopped."""
    from launch import cli

    _stand_ins(monkeypatch, "start", signum)
    assert cli.main(["serve", "--model", "tiny", "--device", "cpu"]) == 128 + signum
    capsys.readouterr()
    events = _stand_ins(monkeypatch, "never", signum)
    assert cli.main(["serve", "--model", "tiny", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "interrupted" not in err and "stopped by" not in err, err
    assert events == ["engine started", "serving", "server closed", "engine shut down"]
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == callers_handlers
