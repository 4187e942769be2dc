"""A throw-away redis-server on this machine, the broker of the job's benchmarks and tests
(``redis-server`` from the Debian package of that name)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time


class RedisServer:
    """A throw-away redis-server on loopback, without persistence."""

    def __init__(self, password: str | None = None) -> None:
        self.password = password
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed (the Debian package redis-server)")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", *(["--requirepass", self.password] if self.password else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(100):
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    if self.password:
                        s.sendall(f"AUTH {self.password}\r\n".encode())
                        s.recv(16)
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
