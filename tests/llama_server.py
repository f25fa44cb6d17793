"""llama.cpp's OpenAI-compatible server (llama-cpp-python[server], the ``llamacpp`` extra)
serving the shipped SmolLM2-135M GGUF on 127.0.0.1, for the real-server test and bench.

    with LlamaServer() as server:          # raises LlamaServerMissing without the package
        judge = OpenAIJudge("smollm2", base_url=server.base_url, api_key="sk-local")

The server reuses, by itself, the part of each new prompt that matches the previous one (its
KV cache holds the last prompt: "prefix-match hit" in its log), which is what the judge's
prompt order and one-request-at-a-time are for. ``cache=True`` adds ``--cache true``
(llama-cpp-python's RAM cache of whole states, ~90 MB each at n_ctx 8192, 2 GB nominal). A
run with it here ended after 17 calls when the kernel's OOM killer took a python process of
14.6 GB resident on this shared 24 GB machine, at the moment the server died (its pid was not
recorded), so it is off.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def _die_with_parent() -> None:
    """In the server's process before it starts: SIGTERM it when the process that started it
    dies, so a test run killed from outside (CI's timeout) leaves no server holding a core."""
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class LlamaServerMissing(RuntimeError):
    """llama-cpp-python[server] is not installed."""


class LlamaServer:
    def __init__(self, *, n_ctx: int = 8192, cache: bool = False, startup_s: float = 300.0) -> None:
        self.n_ctx, self.cache, self.startup_s = n_ctx, cache, startup_s
        self.base_url = ""
        self.log: Path | None = None
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        try:
            import llama_cpp.server  # noqa: F401
        except ImportError as exc:
            raise LlamaServerMissing(f"llama-cpp-python[server] is not installed (pip install -e '.[llamacpp]'): {exc}") from None
        from draco_gym.algos.policy.models import smollm2_gguf

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.log = Path(tempfile.mkdtemp(prefix="draco-llama-")) / "server.log"
        command = [sys.executable, "-m", "llama_cpp.server", "--model", str(smollm2_gguf()), "--host", "127.0.0.1",
                   "--port", str(port), "--n_ctx", str(self.n_ctx), "--cache", str(self.cache).lower()]
        with open(self.log, "wb") as out:
            self._process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        deadline = time.monotonic() + self.startup_s
        while True:
            try:
                urllib.request.urlopen(self.base_url + "/models", timeout=5).read()
                return self
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"llama.cpp server did not start: {self.log.read_text()[-2000:]}") from None
                time.sleep(1)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log else ""

    def __exit__(self, *exc) -> None:
        if self._process is not None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._process = None
