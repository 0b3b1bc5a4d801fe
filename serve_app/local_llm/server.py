"""llama.cpp's own OpenAI-compatible server, in-process, through ``xllamacpp``.

``xllamacpp.Server(params)`` loads the model and starts llama.cpp's HTTP server on its own
threads (``/v1/chat/completions`` with streaming, JSON-schema ``response_format``, the prompt
cache, ``/v1/models``, ``/health``); it returns once the model is loaded. There is no stop
method: the server stops (and frees the model) when the object is deallocated, so
:class:`LocalLLMServer` holds the only reference and drops it in :meth:`LocalLLMServer.stop`.

Port 0 (the default) lets llama.cpp bind a free port itself (no find-then-bind race);
``base_url`` is the address it reports.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from serve_app.local_llm.model_files import ModelFileError, gguf_problem, resolve_model_path
from serve_app.local_llm.settings import LocalLLMSettings

log = logging.getLogger(__name__)


LOOKUP_NGRAM = 3  # tokens matched in the context before a draft is proposed


class LocalLLMServerError(RuntimeError):
    """llama.cpp's server could not be started or is not running."""


class LocalLLMServer:
    """One llama.cpp server on ``host`` (127.0.0.1) serving one GGUF file.

    ``threads``/``batch_threads``: generation / prompt-processing threads. ``context``: the KV
    cache in tokens, one pool shared by the ``parallel`` slots (``kv_unified``), so a single
    long conversation can use all of it. ``cache_ram_mib``: llama.cpp's host-RAM prompt cache
    (its default is 8 GiB; this machine is shared). ``verbosity``: 1 prints llama.cpp's errors
    only (a failed load names the reason on stderr), 3 everything.
    """

    def __init__(
        self,
        model_path: Path,
        *,
        model_name: str = "local",
        threads: int = 1,
        batch_threads: int | None = None,
        context: int = 4096,
        parallel: int = 1,
        host: str = "127.0.0.1",
        port: int = 0,
        cache_ram_mib: int = 1024,
        verbosity: int = 1,
        api_key: str | None = None,
        draft_tokens: int = 0,
    ) -> None:
        self.model_path = Path(model_path)
        self.model_name = model_name
        self.threads = threads
        self.batch_threads = batch_threads if batch_threads is not None else threads
        self.context = context
        self.parallel = parallel
        self.host = host
        self.port = port
        self.cache_ram_mib = cache_ram_mib
        self.verbosity = verbosity
        self.api_key = api_key
        self.draft_tokens = draft_tokens
        self.load_seconds: float | None = None
        self._server: Any = None
        self._base_url: str | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(
        cls, settings: LocalLLMSettings, *, model_path: Path | None = None, **kwargs: Any
    ) -> LocalLLMServer:
        """A server for ``settings``; without ``model_path`` the model file is resolved (and,
        for the packaged default, joined on first use) here."""
        path = model_path if model_path is not None else resolve_model_path(settings)
        return cls(
            path,
            model_name=settings.model_name,
            threads=settings.threads,
            batch_threads=settings.effective_batch_threads,
            context=settings.context,
            parallel=settings.parallel,
            draft_tokens=settings.draft_tokens,
            **kwargs,
        )

    # ----------------------------------------------------------------------------------------

    def build_params(self) -> Any:
        """The ``xllamacpp.CommonParams`` this server starts with."""
        import xllamacpp

        params = xllamacpp.CommonParams()
        params.model.path = str(self.model_path)
        params.model_alias = {self.model_name}
        params.n_ctx = self.context
        params.n_parallel = self.parallel
        params.kv_unified = True
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.batch_threads
        # Worker threads sleep instead of spinning between batches: a little faster on idle
        # cores (10.1 vs 8.1 tokens/s, 2 threads) and no CPU burnt while a request waits.
        params.cpuparams.poll = 0
        params.cpuparams_batch.poll = 0
        params.use_jinja = True
        params.hostnames = [self.host]
        params.port = self.port
        params.ui = False
        params.cache_prompt = True
        params.cache_ram_mib = self.cache_ram_mib
        params.verbosity = self.verbosity
        if self.api_key:
            params.api_keys = [self.api_key]
        if self.draft_tokens:
            # Prompt lookup: a 3-token n-gram of the context that the reply is repeating
            # proposes the tokens that followed it there.
            speculative = params.speculative
            speculative.types = [
                xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE
            ]
            speculative.ngram_simple.size_n = LOOKUP_NGRAM
            speculative.ngram_simple.size_m = self.draft_tokens
        return params

    def start(self) -> str:
        """Load the model and start serving; returns the base URL. Blocks for the load (a few
        seconds for the 1.5B model). Starting a running server is a no-op."""
        with self._lock:
            if self._server is not None:
                assert self._base_url is not None
                return self._base_url
            problem = gguf_problem(self.model_path)
            if problem is not None:
                raise ModelFileError(problem)
            import xllamacpp

            params = self.build_params()
            started = time.perf_counter()
            try:
                server = xllamacpp.Server(params)
            except Exception as exc:
                raise LocalLLMServerError(
                    f"llama.cpp could not serve {self.model_path} ({exc}); its reason is on "
                    "stderr just above"
                ) from exc
            self.load_seconds = time.perf_counter() - started
            address = str(server.listening_address).rstrip("/")
            if not address.startswith("http"):
                address = f"http://{address}"
            self._server = server
            self._base_url = address
        log.info(
            "local LLM %s serving %s at %s (loaded in %.1f s, %d thread(s), ctx %d, %d slot(s))",
            self.model_name,
            self.model_path.name,
            address,
            self.load_seconds,
            self.threads,
            self.context,
            self.parallel,
        )
        return address

    def stop(self) -> None:
        """Stop serving and free the model (idempotent). Requests in flight are cut off."""
        with self._lock:
            server, self._server = self._server, None
            self._base_url = None
            if server is not None:
                # The last reference: deallocation terminates llama.cpp's loop and joins its
                # threads (about 0.1 s).
                del server
                log.info("local LLM %s stopped", self.model_name)

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` of the running server."""
        if self._base_url is None:
            raise LocalLLMServerError("the local LLM server is not running")
        return self._base_url

    @property
    def openai_base_url(self) -> str:
        """The base URL an OpenAI client takes (``.../v1``)."""
        return f"{self.base_url}/v1"

    def health(self, timeout: float = 5.0) -> bool:
        """True when llama.cpp answers ``GET /health`` with 200 (model loaded, not failed)."""
        if self._base_url is None:
            return False
        try:
            response = httpx.get(f"{self._base_url}/health", timeout=timeout)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def __enter__(self) -> LocalLLMServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = self._base_url or "stopped"
        return f"LocalLLMServer({self.model_path.name!r}, {state})"
