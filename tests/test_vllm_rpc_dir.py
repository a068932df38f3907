"""The directory kldtool gives vLLM's socket files (kldtool/engines/vllm/rpc_dir.py), on real
directories: made under the temporary directory, removed with everything in it, and the
user's own VLLM_RPC_BASE_PATH left alone. The end-to-end check that multi-rank runs leave no
socket files is test_vllm_engine's."""

import os
import socket
import tempfile
from pathlib import Path

import pytest

from helpers.vllm_serve import SOCKET_ROOT
from kldtool.engines.vllm.rpc_dir import VAR, RpcDir

pytestmark = pytest.mark.quick


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    short = Path(tempfile.mkdtemp(prefix="rd-", dir=SOCKET_ROOT))
    monkeypatch.delenv(VAR, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    yield short
    for p in short.iterdir():
        p.rmdir()
    short.rmdir()


def _bind_in(directory: str) -> socket.socket:
    """A socket file as vLLM's processes leave them: bound and never unlinked."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(directory, "3f2c6f0e-0d0b-4c51-9d43-5e0d2bd7f7a1"))
    return s


def test_a_run_gets_a_directory_of_its_own_and_leaves_nothing(tmpdir_env):
    held = RpcDir()
    assert os.environ[VAR] == held.path and Path(held.path).parent == tmpdir_env
    s = _bind_in(held.path)
    held.remove()
    s.close()
    assert VAR not in os.environ and not list(tmpdir_env.iterdir())
    held.remove()  # twice is harmless


def test_two_engines_in_one_process_each_remove_their_own(tmpdir_env):
    first = RpcDir()
    second = RpcDir()  # the first one's setting is not the user's: a directory of its own
    assert first.path != second.path and os.environ[VAR] == second.path
    socks = [_bind_in(first.path), _bind_in(second.path)]
    first.remove()
    assert Path(second.path).is_dir() and os.environ[VAR] == second.path
    second.remove()
    for s in socks:
        s.close()
    assert VAR not in os.environ and not list(tmpdir_env.iterdir())


def test_the_users_own_setting_is_left_alone(tmpdir_env, monkeypatch):
    mine = tmpdir_env / "mine"
    mine.mkdir()
    monkeypatch.setenv(VAR, str(mine))
    held = RpcDir()
    assert held.path is None and os.environ[VAR] == str(mine)
    held.remove()
    assert mine.is_dir() and os.environ[VAR] == str(mine)
