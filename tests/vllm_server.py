"""vLLM's own OpenAI-compatible server, from vLLM's environment (``draco-gym setup vllm``),
serving SmolLM2-135M-Instruct on 127.0.0.1, for the judge's real-server test.

    with VLLMServer(python, model) as server:
        judge = OpenAIJudge("smollm2", base_url=server.base_url, api_key="sk-local")

fp32, eager, a 1 GiB KV cache (``VLLM_CPU_KVCACHE_SPACE``: 23k tokens), SmolLM2's whole 8192-token
context (a judge prompt of up to 6144 tokens plus its answer).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from llama_server import _die_with_parent


class VLLMServer:
    def __init__(self, python: str | os.PathLike, model: str, *, name: str = "smollm2-135m-instruct",
                 max_model_len: int = 8192, startup_s: float = 900.0, cache_root: str | None = None) -> None:
        self.python, self.model, self.name = str(python), model, name
        self.max_model_len, self.startup_s, self.cache_root = max_model_len, startup_s, cache_root
        self.base_url = ""
        self.log: Path | None = None
        self.started_s = 0.0
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> VLLMServer:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.log = Path(tempfile.mkdtemp(prefix="draco-vllm-")) / "server.log"
        command = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                   "--served-model-name", self.name, "--host", "127.0.0.1", "--port", str(port),
                   "--dtype", "float32", "--enforce-eager", "--max-model-len", str(self.max_model_len)]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
        env.update(VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false")
        if self.cache_root:
            env["VLLM_CACHE_ROOT"] = self.cache_root
        start = time.monotonic()
        with open(self.log, "wb") as out:
            self._process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                             preexec_fn=_die_with_parent)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        deadline = start + self.startup_s
        while True:
            try:
                urllib.request.urlopen(self.base_url + "/models", timeout=5).read()
                self.started_s = time.monotonic() - start
                return self
            except OSError:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError(f"vLLM server did not start: {self.log_text()[-3000:]}") from None
                time.sleep(2)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log else ""

    def __exit__(self, *exc) -> None:
        if self._process is not None:
            self._process.terminate()  # SIGTERM: vLLM shuts its engine down and frees its shared memory
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._process.kill()
            self._process = None
