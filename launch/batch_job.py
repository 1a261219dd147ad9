"""``tprun run-batch``'s run: the engine started as ``serve`` starts it,
and an OpenAI batch file answered through the HTTP app in process.

The engine loop (``EngineServer.serve``) keeps the main thread, as in
``serve``; the batch runs on its own thread and event loop
(``BatchThread``), the app reaching the engine through the server's
in-process address, as serve's HTTP front end does. When the batch ends
the thread stops the server. Ctrl-C or SIGTERM cancels the batch first
(its requests in flight aborted while the engine still runs), then the
engine stops as after a finished batch, and ``main`` reports the signal
(exit code 130 or 143, one line). When the server stops first (a worker
that failed) the batch ends at its first 503 (``batch_runner.EngineGone``)
or is cancelled, and ``main`` reports the failure. Either way the lines
written so far stay written, in order.

The output file is opened (emptied) only once the engine has started, so
a launch that fails before leaves an older output file as it was (with
``--output-tmp-dir``, until the batch has ended well: ``BatchFiles``).
An http(s) input is downloaded whole before the engine starts, and an
http(s) output uploaded whole after it has stopped (``BatchFiles.local``
and ``upload``; ``batch_urls``).
With ``--enable-metrics`` the app's /metrics page is served for the
batch's length (``metrics_server``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import uuid
from dataclasses import dataclass
from typing import BinaryIO

from tqdm import tqdm

from launch.batch_urls import TransferError, download, is_url, shown, upload, url_error
from serving.http.batch_lines import GENERATION_URLS, model_urls
from serving.http.batch_runner import BatchSummary, run_batch

STDIO = "-"

# Either one cancels the batch; the engine then stops as after a finished one.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# vLLM's bar: plain text, a line per update (no animation to garble a log).
_BAR_FORMAT = ("{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} "
               "[{elapsed}<{remaining}, {rate_fmt}]\n")
_BAR_FORMAT_NO_TOTAL = "{desc}: {n_fmt} done [{elapsed}, {rate_fmt}]\n"


@dataclass(frozen=True)
class BatchFiles:
    """Where the lines come from and go to (``STDIO``: stdin, stdout; an
    http(s) URL: ``batch_urls``, read with a GET, written with a PUT).
    With ``tmp_dir`` (vLLM's ``--output-tmp-dir``) the lines are written
    to a new file in that directory and moved onto ``output`` once the
    batch has ended well: until then an older output file stays as it
    was, and a batch that ends early leaves its lines in the new file.

    A URL is read and written through local files (``local``):
    ``input_copy`` holds the input's body, downloaded before the engine
    starts; ``output_copy`` is the new file the lines are written to (in
    ``tmp_dir``, else the system's temporary directory), sent with
    ``upload`` once the batch has ended well and then removed. A batch that
    ends early, or an upload that fails, leaves it there, named."""

    input: str
    output: str
    tmp_dir: str | None = None
    input_copy: BinaryIO | None = None
    output_copy: str | None = None

    def check(self) -> None:
        """A readable input file and a writable output file that is not the
        input, or http(s) URLs; ValueError naming the option else (before
        any process starts). The input is not opened: a pipe (``-i
        <(...)``, ``/dev/stdin``) is read once, by the run; a URL is not
        asked for (``local`` reads it)."""
        for option, name in (("--input-file", self.input), ("--output-file", self.output)):
            if is_url(name) and (why := url_error(name)) is not None:
                raise ValueError(f"{option} {shown(name)}: {why}")
        if self.input != STDIO and not is_url(self.input):
            try:
                mode = os.stat(self.input).st_mode
            except OSError as e:
                raise ValueError(f"--input-file {self.input}: {e.strerror}") from None
            if stat.S_ISDIR(mode):
                raise ValueError(f"--input-file {self.input} is a directory")
            if not os.access(self.input, os.R_OK):
                raise ValueError(f"--input-file {self.input}: Permission denied")
        if self.output == STDIO:
            if self.tmp_dir is not None:
                raise ValueError("--output-tmp-dir holds the output file until the batch ends: "
                                 "give --output-file FILE, not -")
            return
        if self.tmp_dir is not None:
            if not os.path.isdir(self.tmp_dir):
                raise ValueError(f"--output-tmp-dir {self.tmp_dir} is not a directory")
            if not os.access(self.tmp_dir, os.W_OK | os.X_OK):
                raise ValueError(f"--output-tmp-dir {self.tmp_dir} is not writable")
        if is_url(self.output):
            return
        if os.path.isdir(self.output):
            raise ValueError(f"--output-file {self.output} is a directory: give the path of "
                             "a file to write")
        directory = os.path.dirname(os.path.abspath(self.output))
        if not os.path.isdir(directory):
            raise ValueError(f"--output-file {self.output}: directory {directory} does not "
                             "exist")
        if os.path.exists(self.output):
            if not os.access(self.output, os.W_OK):
                raise ValueError(f"--output-file {self.output} is not writable")
            if self._is_input(self.output):
                raise ValueError(f"--output-file {self.output} is the input file: writing "
                                 "it would erase the requests")
        elif not os.access(directory, os.W_OK | os.X_OK):
            raise ValueError(f"--output-file {self.output}: directory {directory} is not "
                             "writable")

    def _is_input(self, path: str) -> bool:
        """Whether the regular file ``path`` is the input, given by its path
        or as stdin (``-i - < FILE``). A terminal or a pipe is never erased
        by writing it, so only a regular file counts."""
        if is_url(self.input):
            return False
        output = os.stat(path)
        if not stat.S_ISREG(output.st_mode):
            return False
        try:
            source = (os.fstat(sys.stdin.fileno()) if self.input == STDIO
                      else os.stat(self.input))
        except (OSError, ValueError, AttributeError):  # no stdin to read
            return False
        return (source.st_dev, source.st_ino) == (output.st_dev, output.st_ino)

    def local(self) -> BatchFiles:
        """These files with a URL input's body downloaded into
        ``input_copy`` (an unnamed temporary file, gone once closed or
        once the process ends) and a URL output's ``output_copy`` chosen;
        the same files without URLs. ValueError naming the input when its
        GET fails (before the engine starts: the user's input, as a
        missing file)."""
        copy = None
        if is_url(self.input):
            copy = tempfile.TemporaryFile()
            try:
                download(self.input, copy)
                copy.seek(0)
            except TransferError as e:
                copy.close()
                raise ValueError(f"--input-file {shown(self.input)}: {e}") from None
            except BaseException:
                copy.close()
                raise
        staged = None
        if is_url(self.output):
            staged = _staging_path(self.tmp_dir or tempfile.gettempdir())
        return dataclasses.replace(self, input_copy=copy, output_copy=staged)

    def close(self) -> None:
        """The input's copy closed (its space given back)."""
        if self.input_copy is not None:
            self.input_copy.close()

    def input_name(self) -> str:
        """The input for a message: ``-``, the file, the URL (``shown``)."""
        return shown(self.input) if is_url(self.input) else self.input

    def output_name(self) -> str:
        """The output for a message: ``stdout``, the file, the URL (``shown``)."""
        if self.output == STDIO:
            return "stdout"
        return shown(self.output) if is_url(self.output) else self.output

    def count_lines(self) -> int | None:
        """The input's non-blank lines, the progress bar's total; None for
        stdin or any input but a regular file (counting a pipe would use up
        its lines)."""
        if self.input_copy is not None:
            total = sum(1 for line in self.input_copy if line.strip())
            self.input_copy.seek(0)
            return total
        if self.input == STDIO or not os.path.isfile(self.input):
            return None
        with open(self.input, "rb") as f:
            return sum(1 for line in f if line.strip())

    @contextlib.contextmanager
    def opened(self):
        """(input, output): the input read as bytes (a line that is not
        UTF-8 is ``batch_lines``' to refuse, in its place), the output a
        UTF-8 text file, emptied (with ``tmp_dir``, a new one there, moved
        onto the output file when the block ends without an error; for an
        URL, ``output_copy``, left for ``upload``)."""
        with contextlib.ExitStack() as stack:
            if self.input_copy is not None:
                source = self.input_copy
            elif self.input == STDIO:
                source = sys.stdin.buffer
            else:
                source = stack.enter_context(open(self.input, "rb"))
            if self.output_copy is not None:
                with _staged(self.output_copy) as sink:
                    yield source, sink
            elif self.output == STDIO:
                yield source, sys.stdout
            elif self.tmp_dir is None:
                yield source, stack.enter_context(open(self.output, "w", encoding="utf-8"))
            else:
                path = _staging_path(self.tmp_dir)
                with _staged(path) as sink:
                    yield source, sink
                shutil.move(path, self.output)

    def upload(self) -> None:
        """A URL output: ``output_copy`` sent with a PUT (``batch_urls.upload``),
        then removed. OSError naming the URL and the file when the upload
        fails: the lines stay there."""
        if self.output_copy is None:
            return
        try:
            upload(self.output, self.output_copy)
        except TransferError as e:
            raise OSError(f"--output-file {shown(self.output)}: the upload failed ({e}); "
                          f"the output lines are in {self.output_copy}") from None
        except BaseException:
            _say_where(self.output_copy)
            raise
        os.remove(self.output_copy)


def _staging_path(directory: str) -> str:
    """A new name for the output lines in ``directory`` (vLLM's prefix)."""
    return os.path.join(directory, f"tmp_batch_output_{uuid.uuid4().hex}.jsonl")


@contextlib.contextmanager
def _staged(path: str):
    """A new file at ``path`` (made as ``open`` makes a file: mode 0666
    less the umask), closed after the block; left where it is, and named,
    after one that ends with an error."""
    sink = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w",
                     encoding="utf-8")
    try:
        with sink:
            yield sink
    except BaseException:
        _say_where(path)
        raise


def _say_where(path: str) -> None:
    print(f"tprun run-batch: the lines written are in {path}", file=sys.stderr, flush=True)


class BatchThread(threading.Thread):
    """``run_batch`` of ``files`` over ``app`` on this thread's own event
    loop, within the app's lifespan, answering the lines of ``model_urls``
    (``batch_lines.model_urls``); ``on_finish`` is called when it ends,
    however it ends. ``result()`` gives its summary or raises its error."""

    def __init__(self, app, files: BatchFiles, window: int, on_finish,
                 metrics_address: tuple[str, int] | None = None,
                 model_urls: tuple[str, ...] = GENERATION_URLS) -> None:
        super().__init__(name="run-batch", daemon=True)
        self.app, self.files, self.window, self.on_finish = app, files, window, on_finish
        self.model_urls = model_urls
        self.metrics_address = metrics_address
        self.loop = asyncio.new_event_loop()
        self.stopping = False
        self.task: asyncio.Task | None = None
        self.summary: BatchSummary | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.task = self.loop.create_task(self._run())
            self.summary = self.loop.run_until_complete(self.task)
        except BaseException as e:
            self.error = e
        finally:
            self.on_finish()
            self.loop.close()

    async def _run(self) -> BatchSummary:
        from serving.http.asgi_call import running

        if self.stopping:
            raise asyncio.CancelledError
        total = await asyncio.to_thread(self.files.count_lines)
        bar = tqdm(total=total, unit="req", desc="Running batch", mininterval=5,
                   file=sys.stderr,
                   bar_format=_BAR_FORMAT if total is not None else _BAR_FORMAT_NO_TOTAL)
        with bar, self.files.opened() as (source, sink):
            async with running(self.app), self._metrics_served():
                return await run_batch(self.app, source.readline, sink, self.window,
                                       on_done=bar.update, model_urls=self.model_urls)

    @contextlib.asynccontextmanager
    async def _metrics_served(self):
        """The app's /metrics on ``metrics_address`` for the block (none
        without one)."""
        if self.metrics_address is None:
            yield
            return
        from serving.http.metrics_server import serving_metrics

        host, port = self.metrics_address
        async with serving_metrics(self.app, host, port) as bound:
            shown = f"[{host}]" if ":" in host else host
            print(f"tprun run-batch: Prometheus metrics at http://{shown}:{bound}/metrics",
                  file=sys.stderr, flush=True)
            yield

    def cancel(self) -> None:
        """Cancel the batch if it still runs, without waiting (signal-handler safe)."""
        self.stopping = True
        with contextlib.suppress(RuntimeError):  # the loop has closed: it ended
            self.loop.call_soon_threadsafe(self._cancel)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """``cancel``, then wait; whether the thread has ended."""
        self.cancel()
        self.join(timeout_s)
        return not self.is_alive()

    def _cancel(self) -> None:
        """The batch's task cancelled: its lines in flight are, and the
        app's lifespan still ends (the engine link closes)."""
        if self.task is not None:
            self.task.cancel()

    def result(self) -> BatchSummary:
        if self.error is not None:
            raise self.error
        return self.summary


def run_batch_job(config, files: BatchFiles, served_names: list[str],
                  chat_template: str | None, response_role: str = "assistant",
                  metrics_address: tuple[str, int] | None = None,
                  lora_modules: tuple = ()) -> BatchSummary:
    """Start the engine (``config``), answer ``files``' batch, stop the
    engine; the run's summary. ``chat_template``: the chat route's, in
    place of the model's (None: the model's); ``response_role``: a chat
    answer's role after a generation prompt (vLLM's ``--response-role``);
    ``metrics_address``: (host, port) where the app's /metrics is served
    during the batch (vLLM's ``--enable-metrics``; None: nowhere);
    ``lora_modules``: vLLM's ``--lora-modules``, the ``LoRARequest`` of each
    adapter a line runs with by naming it as its body's model, each checked
    once the engine has started (a bad one stops the run before any line)."""
    from engine.llm_engine import LLMEngine
    from engine.lora_checks import check_lora_modules
    from executor import stop_signals
    from ipc.auth import new_secret
    from serving.async_client import AsyncEngineClient
    from serving.endpoint import Endpoint, EngineServer
    from serving.http.app import create_app
    from serving.http.http_server import engine_app_options

    endpoint = Endpoint.create()
    try:
        engine = LLMEngine(config)
    except BaseException:
        endpoint.cleanup()
        raise
    secret = new_secret()
    try:
        server = EngineServer(engine, endpoint, secret=secret)
    except BaseException:
        engine.shutdown()
        endpoint.cleanup()
        raise
    try:
        if chat_template is not None:  # as serve sets it
            engine.tokenizer.chat_template = chat_template
        check_lora_modules(engine.lora_checks, lora_modules)
        link = AsyncEngineClient(server.inproc_address, secret, context=server.ctx)
        options = engine_app_options(engine)
        app = create_app(link, engine.tokenizer, served_names, engine.max_model_len,
                         chat_template=chat_template, response_role=response_role,
                         lora_modules=lora_modules, **options)
    except BaseException:  # an app that cannot be made (a reasoning parser without its tags)
        server.close()
        engine.shutdown()
        raise
    # Lines read and not yet written: in flight (vLLM keeps twice the
    # engine's batch in flight) or done and waiting for an earlier one.
    batch = BatchThread(app, files, window=4 * config.max_num_seqs, on_finish=server.stop,
                        metrics_address=metrics_address,
                        model_urls=model_urls(options["pooling"], options["pooling_task"]))

    def stop(signum, _frame) -> None:
        stop_signals.note(signum)
        batch.cancel()

    previous = {sig: signal.signal(sig, stop) for sig in _STOP_SIGNALS}
    batch.start()
    try:
        if stop_signals.first() is None:  # none swallowed while the engine started
            server.serve()
    finally:
        ended = batch.stop()
        server.close(term_context=ended)
        engine.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if (signum := stop_signals.first()) is not None:
        _raise_stop(signum)
    return batch.result()


def _raise_stop(signum: int) -> None:
    """The stop ``main`` reports for ``signum`` (one line; 130 or 143)."""
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)
