"""The engine endpoint's per-launch secret, its HMAC framing, and where it binds.

Unit tests hold ``ipc.auth`` to its contract (a payload comes out only if
its MAC was made with the same secret for that direction; key files are
owner-only), and ``EngineClient``'s key discovery. One ``tprun serve`` at
TP=1 bound with ``--host 0.0.0.0`` checks the warning, the key file, and
that unsigned or wrongly keyed messages get no answer and are counted.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import tempfile

import msgspec
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import SamplingParams
from ipc.auth import (
    MAC_BYTES,
    SECRET_BYTES,
    Authenticator,
    AuthError,
    RefusalLog,
    new_secret,
    read_key_file,
    write_key_file,
)
from ipc.endpoints import IPC_PATH_MAX
from ipc.engine_messages import EngineStats, StatsRequest, decode_server_message
from ipc.serde import encode
from serving.client import EngineClient, find_secret
from serving.endpoint import Endpoint, check_listen_address, exposure_warning, is_loopback
from tests.helpers.proc_utils import long_directory, run_tprun, socket_dirs
from tests.helpers.serve_utils import start_server, stop_server

SECRET = bytes(range(SECRET_BYTES))


# ---- framing ------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2048), st.data())
def test_seal_unseal_round_trip_and_any_flipped_bit_is_refused(payload, data):
    client, server = Authenticator.for_client(SECRET), Authenticator.for_server(SECRET)
    frames = client.seal(payload)
    assert len(frames) == 2 and len(frames[0]) == MAC_BYTES and frames[1] == payload
    assert server.unseal(frames) == payload
    which = data.draw(st.sampled_from([0, 1] if payload else [0]))
    frame = bytearray(frames[which])
    bit = data.draw(st.integers(0, len(frame) * 8 - 1))
    frame[bit // 8] ^= 1 << (bit % 8)
    tampered = list(frames)
    tampered[which] = bytes(frame)
    with pytest.raises(AuthError, match="wrong MAC"):
        server.unseal(tampered)


def test_wrong_secret_wrong_direction_and_wrong_shapes_are_refused():
    client, server = Authenticator.for_client(SECRET), Authenticator.for_server(SECRET)
    frames = client.seal(b"payload")
    with pytest.raises(AuthError, match="wrong MAC"):
        Authenticator.for_server(new_secret()).unseal(frames)
    with pytest.raises(AuthError, match="wrong MAC"):  # a request reflected back to a client
        client.unseal(frames)
    with pytest.raises(AuthError, match="wrong MAC"):  # a reply replayed to the server
        server.unseal(server.seal(b"payload"))
    with pytest.raises(AuthError, match="expected 2 frames"):
        server.unseal([b"payload"])
    with pytest.raises(AuthError, match="expected 2 frames"):
        server.unseal([*frames, b"more"])
    with pytest.raises(AuthError, match="32 bytes, got 31"):
        server.unseal([frames[0][:31], frames[1]])
    with pytest.raises(ValueError, match="too short"):
        Authenticator.for_server(b"short")


def test_new_secrets_are_random_32_bytes():
    secrets_ = {new_secret() for _ in range(100)}
    assert len(secrets_) == 100 and all(len(s) == 32 for s in secrets_)


# ---- key files ------------------------------------------------------------------
def test_key_file_is_owner_only_and_round_trips(tmp_path):
    path = str(tmp_path / "endpoint.key")
    umask = os.umask(0)  # the most permissive umask: the file must still be 0600
    try:
        write_key_file(path, SECRET)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert open(path).read() == SECRET.hex() + "\n"
    assert read_key_file(path) == SECRET
    write_key_file(path, b"\x01" * 32)  # replaced atomically, no temporary left
    assert read_key_file(path) == b"\x01" * 32
    assert os.listdir(tmp_path) == ["endpoint.key"]


def test_bad_key_files_are_refused_with_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no key file at"):
        read_key_file(str(tmp_path / "missing.key"))
    open_to_all = tmp_path / "open.key"
    open_to_all.write_text(SECRET.hex())
    open_to_all.chmod(0o644)
    with pytest.raises(ValueError, match=r"open to other users \(mode 644\)"):
        read_key_file(str(open_to_all))
    for name, text, error in [("nothex.key", "zz" * 32, "hex secret"),
                              ("short.key", "ab" * 8 + "\n", "8 bytes is too short")]:
        path = tmp_path / name
        path.write_text(text)
        path.chmod(0o600)
        with pytest.raises(ValueError, match=error):
            read_key_file(str(path))


def test_client_finds_the_key_or_says_where_it_looked(tmp_path):
    endpoint_file = tmp_path / "endpoint"
    endpoint_file.write_text("ipc:///nonexistent/engine\n")
    write_key_file(str(endpoint_file) + ".key", SECRET)
    assert find_secret(str(endpoint_file)) == SECRET
    socket_dir = tmp_path / "private"
    socket_dir.mkdir()
    write_key_file(str(socket_dir / "engine.key"), b"\x02" * 32)
    assert find_secret(f"ipc://{socket_dir}/engine") == b"\x02" * 32
    assert find_secret("tcp://127.0.0.1:5555", secret=b"\x03" * 32) == b"\x03" * 32
    assert find_secret("tcp://127.0.0.1:5555", key_file=str(endpoint_file) + ".key") == SECRET
    with pytest.raises(ValueError, match="no key for tcp://127.0.0.1:5555: pass key_file="):
        find_secret("tcp://127.0.0.1:5555")
    with pytest.raises(ValueError, match="no key file at .*other.key"):
        EngineClient(f"ipc://{tmp_path}/other")
    with pytest.raises(ValueError, match="too short"):
        EngineClient("tcp://127.0.0.1:5555", secret=b"x")


def test_refusal_log_throttles_and_its_counts_add_up(caplog):
    now = [0.0]
    log = RefusalLog(logging.getLogger("test.refusals"), "a thing", per_second=3,
                     clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="test.refusals"):
        for i in range(50):
            now[0] = i * 0.01  # 50 refusals in half a second
            log.refuse("wrong MAC")
        assert len(caplog.records) == 3 and log.unlogged == 47
        now[0] = 2.0
        log.refuse("expected 2 frames [mac, payload], got 1")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "refused a thing (dropped unread): wrong MAC"
    assert lines[-1] == ("refused a thing (dropped unread): expected 2 frames [mac, payload], "
                         "got 1; 47 earlier refusals unlogged")
    assert log.count == 51 == len(lines) + 47


# ---- binding ------------------------------------------------------------------
def test_default_endpoints_are_private_or_loopback():
    ipc = Endpoint.create()
    tcp = Endpoint.create(port=0)
    try:
        assert ipc.address == f"ipc://{ipc.directory}/engine"
        assert ipc.key_file == f"{ipc.directory}/engine.key"
        assert stat.S_IMODE(os.stat(ipc.directory).st_mode) == 0o700
        assert tcp.address == "tcp://127.0.0.1:*" and tcp.host == "127.0.0.1"
        assert stat.S_IMODE(os.stat(tcp.directory).st_mode) == 0o700  # holds the key
        assert exposure_warning(ipc) is None and exposure_warning(tcp) is None
    finally:
        ipc.cleanup()
        tcp.cleanup()
    assert not os.path.exists(ipc.directory) and not os.path.exists(tcp.directory)
    with pytest.raises(ValueError, match="--port"):
        Endpoint.create(port=70000)
    for bad in ["", "0.0.0.0:80", "tcp://x", "a b", "-x"]:
        with pytest.raises(ValueError, match="--host must be"):
            Endpoint.create(host=bad)


def test_ipc_endpoint_too_long_for_an_address_is_refused_and_removed(tmp_path, monkeypatch):
    """A TMPDIR so long the engine socket's path would not fit a Unix socket
    address: refused with a message naming it, its directory removed; a
    tcp:// endpoint there (the directory holds only the key) is fine."""
    tmp = long_directory(tmp_path, IPC_PATH_MAX - 20)  # 20 bytes to spare
    os.makedirs(tmp)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    with pytest.raises(ValueError, match=rf"/engine is \d+ bytes, more than the {IPC_PATH_MAX} "):
        Endpoint.create()
    assert socket_dirs(tmp) == []
    tcp = Endpoint.create(port=0)
    tcp.cleanup()
    assert socket_dirs(tmp) == []


@pytest.mark.parametrize("host,exposed", [
    ("127.0.0.1", False), ("127.0.0.2", False), ("::1", False), ("localhost", False),
    ("0.0.0.0", True), ("*", True), ("192.168.1.5", True), ("::", True), ("eth0", True),
])
def test_hosts_beyond_loopback_draw_a_warning(host, exposed):
    assert is_loopback(host) is not exposed
    endpoint = Endpoint.create(port=5555, host=host)
    try:
        warning = exposure_warning(endpoint)
    finally:
        endpoint.cleanup()
    assert (warning is not None) == exposed
    if exposed:
        assert "not a loopback address" in warning and "not encrypted" in warning
    if host == "::1":
        assert endpoint.address == "tcp://[::1]:5555"


def test_listen_address_is_checked_before_serving():
    """Loopback, every interface and ZeroMQ's interface names are accepted;
    a busy port names the option it came from; a name that does not resolve
    and an address of another machine are refused."""
    for host in ("127.0.0.1", "localhost", "*", "0.0.0.0", socket.if_nameindex()[0][1]):
        check_listen_address(host, 0, "--port")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ValueError, match=f"^--http-port {port}: cannot listen on "
                           f"127.0.0.1:{port} "):
            check_listen_address("127.0.0.1", port, "--http-port")
    with pytest.raises(ValueError, match="^--host no-such-host.invalid does not resolve"):
        check_listen_address("no-such-host.invalid", 0, "--port")
    with pytest.raises(ValueError, match="^--host 192.0.2.1 is not an address of this machine"):
        check_listen_address("192.0.2.1", 0, "--port")  # TEST-NET-1 (RFC 5737)


@pytest.mark.timeout(60)
def test_serve_help_says_where_the_key_is():
    result, leftovers = run_tprun(["serve", "--help"], timeout=50)
    assert result.returncode == 0 and leftovers == []
    text = " ".join(result.stdout.split())
    assert "HMAC-SHA256" in text and "--host" in text
    assert "engine.key in the private directory" in text
    assert "--endpoint-file F, to F.key" in text


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_serve_on_all_interfaces_warns_and_refuses_unsigned_messages(tmp_path):
    served = start_server(tmp_path, "--nproc-per-node", "1", "serve", "--model", "tiny",
                          "--device", "cpu", "--disable-log-stats", "--host", "0.0.0.0")
    try:
        startup = served.output()
        assert "tprun serve: warning: the engine endpoint listens on 0.0.0.0" in startup
        assert "tprun.serve WARNING the engine endpoint listens on 0.0.0.0" in startup  # logged
        assert served.endpoint.startswith("tcp://0.0.0.0:")
        assert f"(key file {served.key_file})" in startup
        assert stat.S_IMODE(os.stat(served.key_file).st_mode) == 0o600
        port = served.endpoint.rsplit(":", 1)[1]
        local = f"tcp://127.0.0.1:{port}"
        ctx = zmq.Context()
        rogue = ctx.socket(zmq.DEALER)
        rogue.setsockopt(zmq.LINGER, 5000)  # both messages leave before the close
        rogue.connect(local)
        try:
            rogue.send(encode(StatsRequest()))  # unsigned
            rogue.send_multipart(Authenticator.for_client(new_secret()).seal(
                encode(StatsRequest())))  # signed with another key
            assert not rogue.poll(1000), "the engine answered an unauthenticated message"
        finally:
            rogue.close()
            ctx.term()
        with EngineClient(local, timeout_s=1, secret=new_secret()) as stranger:
            with pytest.raises(TimeoutError, match="another key"):
                stranger.stats()
        with EngineClient(served.endpoint_file, timeout_s=60) as client:  # finds F.key
            out = client.generate({"prompt_token_ids": [4, 5, 6]},
                                  SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))
            stats = client.stats()
            assert client.num_dropped_replies == 0
        assert len(out[0].outputs[0].token_ids) == 3
        assert isinstance(stats, EngineStats) and stats.num_refused_messages == 3
    finally:
        code, output, leftovers = stop_server(served)
    assert code == 0 and leftovers == []
    assert output.count("refused a client message (dropped unread)") == 3
    assert "expected 2 frames [mac, payload], got 1" in output
    assert output.count("wrong MAC") == 2
    assert not os.path.exists(served.key_file) and not os.path.exists(served.endpoint_file)


def test_stats_decode_without_the_refusal_counter():
    """An ``EngineStats`` from before the counter existed still decodes (default 0)."""
    fields = dict(num_running=0, num_waiting=0, num_blocks=1, num_free_blocks=1, kv_usage=0.0,
                  prefix_hit_rate=0.0, num_preemptions=0, num_steps=0, num_prompt_tokens=0,
                  num_generation_tokens=0, num_scheduled_tokens=0)
    data = msgspec.msgpack.encode({"type": "EngineStats", **fields})
    assert decode_server_message(data).num_refused_messages == 0
