"""A TCP path to a server that a test can cut as a blackholed route does:
bytes stop flowing both ways and new connections are accepted but go nowhere,
every socket left open, so a client's requests hang rather than fail."""

from __future__ import annotations

import contextlib
import select
import socket
import threading


class Blackhole:
    def __init__(self, target: tuple[str, int], *, port: int = 0) -> None:
        self.target = target
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", port))
        self._sockets: list[socket.socket] = [self._listener]
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        port: int = self._listener.getsockname()[1]
        return port

    def __enter__(self) -> Blackhole:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self._closed.set()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def cut(self) -> None:
        self._cut.set()

    def _keep(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(sock)
        return sock

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client = self._keep(self._listener.accept()[0])
                if self._cut.is_set():
                    continue  # accepted, and nothing more
                upstream = self._keep(socket.create_connection(self.target))
            except OSError:
                return
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while not self._cut.is_set():
                if not select.select([source], [], [], 0.1)[0]:
                    continue
                data = source.recv(65536)
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                if self._cut.is_set():
                    return  # dropped, as on the cut route
                sink.sendall(data)
        except OSError:
            return
