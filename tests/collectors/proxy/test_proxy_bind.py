"""The proxy's port bound exclusively where the OS has SO_EXCLUSIVEADDRUSE (Windows), chosen by capability."""

from __future__ import annotations

import socket

import pytest

from collectors.proxy.bind import exclusive_socket


def test_no_exclusive_option_binds_as_before() -> None:
    assert not hasattr(socket, "SO_EXCLUSIVEADDRUSE")  # this machine: the reuse_address path
    assert exclusive_socket("127.0.0.1", 0) is None


def test_with_the_option_the_socket_is_bound_with_it_and_listens(monkeypatch: pytest.MonkeyPatch) -> None:
    # Linux has no SO_EXCLUSIVEADDRUSE: a real option of its own stands in, to see it set on the socket bound.
    monkeypatch.setattr(socket, "SO_EXCLUSIVEADDRUSE", socket.SO_KEEPALIVE, raising=False)
    sock = exclusive_socket("127.0.0.1", 0)
    assert sock is not None
    try:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        host, port = sock.getsockname()
        with socket.create_connection((host, port), timeout=5):
            pass  # it listens
        with socket.socket() as second, pytest.raises(OSError):
            second.bind((host, port))  # and the port is taken
    finally:
        sock.close()
