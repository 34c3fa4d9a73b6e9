"""torch.distributed's c10d TCPStore, with a timeout on every exchange and one error type.

Why the store and not a collective: a store is a key-value server with per-request timeouts; no
operation waits for every agent, so a dead or wedged agent cannot block the others (a barrier or an
all-gather among agents would). It is what torchrun's static rendezvous already runs, on a port
people already open between their hosts.

The leader (node rank 0) hosts it on a socket it binds itself, to exactly the address given (the
store's own listener binds to every interface), and hands the listening socket to the store.
This module imports torch; the monitor and the probes never do.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from scout_sys.errors import ScoutError, StoreUnreachable
from scout_sys.extras import MissingExtra, install_hint

EXCHANGE_TIMEOUT = 2.0  # seconds for one store operation; shorter than any verdict deadline


def parse_addr(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ScoutError(f"--store/--cluster {text!r}: expected HOST:PORT, e.g. node0:29450")
    return host, int(port)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


class Store:
    """A connection to the cluster's store (``serve=True``: host it, on the leader)."""

    def __init__(self, host: str, port: int, *, serve: bool = False, timeout: float = EXCHANGE_TIMEOUT) -> None:
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # c10d's C++ retries would flood stderr
        try:
            from torch.distributed import TCPStore
        except ImportError:
            raise MissingExtra(f"the scout-sys store client needs torch: {install_hint('cluster')}") from None

        self.addr = f"{host}:{port}"
        self._sock: socket.socket | None = None
        if serve:
            try:
                family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(sockaddr)
                sock.listen(512)
            except OSError as e:
                raise ScoutError(f"cannot host the store on {self.addr}: {e.strerror or e}") from None
            self._sock = sock
        try:
            self._store = TCPStore(host, port, None, serve, timedelta(seconds=timeout), wait_for_workers=False,
                                   master_listen_fd=self._sock.fileno() if self._sock else None)
        except Exception as e:  # noqa: BLE001 - c10d raises several types; one line for people
            self.close()
            raise StoreUnreachable(f"cannot reach the scout-sys store at {self.addr}: {_first_line(e)}") from None
        if self._sock is not None:
            self._sock.detach()  # the store owns the listening socket now (and closes it)
            self._sock = None

    def _op(self, what: str, fn, *args):  # noqa: ANN001, ANN202
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - DistNetworkError, DistStoreError, RuntimeError
            raise StoreUnreachable(f"store {self.addr}: {what} failed: {_first_line(e)}") from None

    def set(self, key: str, value: bytes) -> None:
        self._op("set", self._store.set, key, value)

    def get(self, key: str) -> bytes | None:
        """The value, or None when the key does not exist (never waits for it)."""
        if not self._op("check", self._store.check, [key]):
            return None
        return bytes(self._op("get", self._store.get, key))

    def add(self, key: str, n: int) -> int:
        return int(self._op("add", self._store.add, key, n))

    def delete(self, key: str) -> None:
        self._op("delete", self._store.delete_key, key)

    def close(self) -> None:
        self._store = None  # dropping the last reference closes the connection (and the leader's listener)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
