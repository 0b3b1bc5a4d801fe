"""Local LLM tokens/s: the Serve LLM app against raw xllamacpp in-process, same run.

    python -m bench.local_llm [--reps 5] [--max-tokens 96] [--threads 1]
                              [--ask-url http://127.0.0.1:8000 [--ask-reps 5]] [--ask-only]

Two llama.cpp servers for the same GGUF file (the packaged Qwen2.5-Coder-1.5B unless
``--model``/``LOCAL_LLM_MODEL_PATH`` say otherwise), same threads, batch threads and context:

- Serve: the local LLM application (``deployments.local_llm:build_local_llm_app``, route
  ``/llm``) on a local Ray, called at ``/llm/v1/chat/completions`` through Serve's proxy, the
  router deployment and the model replica's handle stream;
- raw: ``LocalLLMServer`` (serve_app/local_llm/server.py) started in this process, called
  over its own HTTP port: xllamacpp with nothing in front.

Every rep sends the same prompt to both (the order alternates per rep), streaming (SSE),
``temperature`` 0, ``max_tokens`` with ``ignore_eos`` (fixed length), the prompt cache off
(``cache_prompt: false`` and a per-rep tag at the start of the prompt, so each server
processes the whole prompt every time). From the client's clock:

- prompt tok/s = prompt tokens / time to the first content token (includes HTTP and Serve);
- generation tok/s = (completion tokens - 1) / (last token time - first token time), the
  token counts from the final chunk's ``usage`` (else the content chunks are counted).

llama.cpp's own ``timings`` (its prompt and generation rates, no HTTP) are printed next to
them. Reported: medians over ``--reps``, and Serve/raw ratios (goal >= 0.9 for generation).

With ``--ask-url`` (the agent API's base URL, with API_PREFIX if set, of a service already
running, e.g. ``agent-service serve``), time to first token through the whole agent: ``/ask``
with ``stream: true``, TTFT = time to the first ``token`` event (after the tool hops), and
the time to ``done``, sequentially, medians of ``--ask-reps``. It runs after the comparison,
once this bench's own servers are stopped; ``--ask-only`` skips the comparison. The caller is
an ``x-gateway-claims`` header (``--ask-sub/--ask-roles/--ask-domains``), or
``--ask-token TOKEN`` (an eval token; ``--ask-token mint`` mints one from EVAL_JWT_SECRET).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx

PORT = 8018
PROMPT = (
    "You are reviewing the design of an occupancy-monitoring service for office buildings. "
    "Sensors of several kinds (door counters, ceiling people counters, desk presence pads "
    "and CO2 meters) report readings every few seconds to a sensor service; a digital twin "
    "describes sites, buildings, floors and rooms with their capacities and the domain that "
    "owns each of them. An assistant answers staff questions about rooms, alerts and the "
    "documentation, calling tools that read the twin, the latest readings and a search "
    "index of the manuals, and it must only ever show a caller what their roles and domains "
    "allow. Alerts fire when a room passes its capacity and repeat at most once per cooldown "
    "period; operators can acknowledge them, and a room that stays over capacity escalates "
    "to the building's administrators after a configurable delay. Write a detailed review of "
    "this design: its failure modes, how to test each part, what to monitor in production, "
    "and which parts you would build first, with reasons for each choice."
)


@dataclass(frozen=True)
class Sample:
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    gen_s: float  # first content token -> last content token
    server_prompt_tps: float | None  # llama.cpp's timings, when sent
    server_gen_tps: float | None

    @property
    def prompt_tps(self) -> float:
        return self.prompt_tokens / self.ttft_s if self.ttft_s > 0 else float("nan")

    @property
    def gen_tps(self) -> float:
        if self.gen_s <= 0 or self.completion_tokens < 2:
            return float("nan")
        return (self.completion_tokens - 1) / self.gen_s


def chat_body(model: str, tag: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": f"[{tag}] You are a careful senior engineer."},
            {"role": "user", "content": PROMPT},
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
        "seed": 1,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,  # llama.cpp: a fixed number of generated tokens
        "cache_prompt": False,  # llama.cpp: process the whole prompt every time
    }


def stream_chat(client: httpx.Client, url: str, body: dict[str, Any]) -> Sample:
    """One streamed chat completion, timed from the client's side."""
    started = time.perf_counter()
    first: float | None = None
    last: float | None = None
    chunks = 0
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            resp.read()
            raise RuntimeError(f"{url}: HTTP {resp.status_code}: {resp.text[:500]}")
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content"):
                    now = time.perf_counter()
                    first = now if first is None else first
                    last = now
                    chunks += 1
    if first is None or last is None:
        raise RuntimeError(f"{url}: the stream carried no content")
    completion = int(usage.get("completion_tokens") or timings.get("predicted_n") or chunks)
    prompt = int(usage.get("prompt_tokens") or timings.get("prompt_n") or 0)
    return Sample(
        prompt_tokens=prompt,
        completion_tokens=completion,
        ttft_s=first - started,
        gen_s=last - first,
        server_prompt_tps=_float(timings.get("prompt_per_second")),
        server_gen_tps=_float(timings.get("predicted_per_second")),
    )


def _float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _median(values: list[float | None]) -> float:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else float("nan")


def wait_http(url: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise TimeoutError(f"{url} did not answer 200 within {timeout:.0f} s")


def compare(args: argparse.Namespace) -> None:
    import ray
    from ray import serve

    from deployments.local_llm import build_local_llm_app
    from foundation.settings import load_settings
    from serve_app.local_llm.model_files import ensure_model_file
    from serve_app.local_llm.server import LocalLLMServer
    from serve_app.local_llm.settings import LocalLLMSettings

    settings = LocalLLMSettings.from_env(
        home=load_settings().home,
        model_name=args.model,
        threads=args.threads,
        batch_threads=args.batch_threads,
        context=args.context,
        parallel=1,
    ).resolved()
    print("model file: joining the packaged parts on first use...", flush=True)
    model_path = ensure_model_file(settings)
    print(
        f"model {settings.model_name} ({model_path}), threads {settings.threads}, batch "
        f"threads {settings.effective_batch_threads}, context {settings.context}; "
        f"{args.reps} reps of {args.max_tokens} generated tokens",
        flush=True,
    )

    raw = LocalLLMServer.from_settings(settings, model_path=model_path)
    samples: dict[str, list[Sample]] = {"Serve": [], "raw": []}
    try:
        raw.start()
        print(f"raw xllamacpp in-process at {raw.base_url} (loaded in {raw.load_seconds:.1f} s)")
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
        serve.start(
            http_options={"host": "127.0.0.1", "port": PORT},
            logging_config={"enable_access_log": False, "log_level": "WARNING"},
        )
        serve.run(
            build_local_llm_app(settings.to_dict()),  # as runner.py deploys it: same file
            name="llm",
            route_prefix="/llm",
        )
        serve_base = f"http://127.0.0.1:{PORT}/llm"
        wait_http(f"{serve_base}/health")
        print(f"Serve LLM app at {serve_base}", flush=True)
        urls = {
            "Serve": f"{serve_base}/v1/chat/completions",
            "raw": f"{raw.base_url}/v1/chat/completions",
        }
        timeout = httpx.Timeout(settings.timeout_seconds, connect=10)
        with httpx.Client(timeout=timeout) as client:
            for name, url in urls.items():  # warm-up: first request, page cache, threads
                stream_chat(client, url, chat_body(settings.model_name, f"warm {name}", 8))
            for rep in range(args.reps):
                order = list(urls) if rep % 2 == 0 else list(reversed(urls))
                for name in order:
                    s = stream_chat(
                        client,
                        urls[name],
                        chat_body(settings.model_name, f"rep {rep}", args.max_tokens),
                    )
                    samples[name].append(s)
                    print(
                        f"rep {rep + 1} {name:<5} prompt {s.prompt_tokens} tok, TTFT "
                        f"{s.ttft_s * 1000:7.0f} ms ({s.prompt_tps:6.1f} tok/s); generated "
                        f"{s.completion_tokens} tok at {s.gen_tps:5.1f} tok/s  [llama.cpp: "
                        f"prompt {_fmt(s.server_prompt_tps)}, generation {_fmt(s.server_gen_tps)}]",
                        flush=True,
                    )
    finally:
        if ray.is_initialized():
            serve.shutdown()  # type: ignore[no-untyped-call]
            ray.shutdown()
        raw.stop()

    print(f"\nmedians over {args.reps} reps (tokens/s)")
    print(
        f"{'':<6} | {'prompt':>8} | {'generation':>10} | {'TTFT ms':>8} | "
        "llama.cpp prompt | llama.cpp gen"
    )
    med: dict[str, dict[str, float]] = {}
    for name, rows in samples.items():
        med[name] = {
            "prompt": _median([s.prompt_tps for s in rows]),
            "gen": _median([s.gen_tps for s in rows]),
            "ttft": _median([s.ttft_s * 1000 for s in rows]),
            "sp": _median([s.server_prompt_tps for s in rows]),
            "sg": _median([s.server_gen_tps for s in rows]),
        }
        m = med[name]
        print(
            f"{name:<6} | {m['prompt']:8.1f} | {m['gen']:10.1f} | {m['ttft']:8.0f} | "
            f"{m['sp']:16.1f} | {m['sg']:13.1f}"
        )
    print(
        f"Serve / raw: generation {med['Serve']['gen'] / med['raw']['gen']:.2f} (goal >= 0.9), "
        f"prompt {med['Serve']['prompt'] / med['raw']['prompt']:.2f}; "
        f"TTFT +{med['Serve']['ttft'] - med['raw']['ttft']:.0f} ms"
    )


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def ask_ttft(args: argparse.Namespace) -> None:
    """TTFT of ``/ask`` (SSE) on a running agent app."""
    from bench.loadgen import check_loopback
    from serve_app.cli import claims_header

    base = args.ask_url.rstrip("/")
    check_loopback(base)
    roles = [r for r in args.ask_roles.split(",") if r]
    domains = [d for d in args.ask_domains.split(",") if d]
    if args.ask_token == "mint":
        from foundation.eval_tokens import mint_eval_token

        secret = os.environ.get("EVAL_JWT_SECRET", "")
        if not secret:
            raise SystemExit("--ask-token mint needs EVAL_JWT_SECRET in the environment")
        token = mint_eval_token(secret, args.ask_sub, roles, domains)
        headers = {"authorization": f"Bearer {token}"}
    elif args.ask_token:
        headers = {"authorization": f"Bearer {args.ask_token}"}
    else:
        headers = {"x-gateway-claims": claims_header(args.ask_sub, roles, domains)}
    body = {"question": args.ask_question, "stream": True}
    ttfts: list[float] = []
    totals: list[float] = []
    print(f"\n/ask TTFT at {base}: {args.ask_reps} sequential questions (+1 warm-up)", flush=True)
    with httpx.Client(timeout=httpx.Timeout(600, connect=10)) as client:
        for rep in range(args.ask_reps + 1):
            started = time.perf_counter()
            first: float | None = None
            event = ""
            tokens = 0
            with client.stream("POST", f"{base}/ask", json=body, headers=headers) as resp:
                if resp.status_code != 200:
                    resp.read()
                    raise SystemExit(f"/ask: HTTP {resp.status_code}: {resp.text[:500]}")
                for line in resp.iter_lines():
                    if line.startswith("event:"):
                        event = line.split(":", 1)[1].strip()
                    elif line.startswith("data:"):
                        if event == "token":
                            tokens += 1
                            if first is None:
                                first = time.perf_counter()
                        elif event == "error":
                            raise SystemExit(f"/ask stream error: {line[5:].strip()[:500]}")
                        elif event == "done":
                            break
            total = time.perf_counter() - started
            if first is None:
                raise SystemExit("/ask: the stream carried no token event")
            label = "warm-up" if rep == 0 else f"rep {rep}"
            print(
                f"{label:<7} TTFT {(first - started) * 1000:7.0f} ms, done after "
                f"{total * 1000:7.0f} ms, {tokens} token events",
                flush=True,
            )
            if rep:
                ttfts.append((first - started) * 1000)
                totals.append(total * 1000)
    print(
        f"/ask medians: TTFT {statistics.median(ttfts):.0f} ms, "
        f"whole answer {statistics.median(totals):.0f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=96, help="generated per request")
    parser.add_argument(
        "--model",
        default=None,
        help="packaged model name (default LOCAL_LLM_MODEL_NAME or qwen2.5-coder-1.5b-instruct)",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="default LOCAL_LLM_THREADS (the cores, at most 2)"
    )
    parser.add_argument("--batch-threads", type=int, default=None, help="default = --threads")
    parser.add_argument("--context", type=int, default=None, help="default LOCAL_LLM_CONTEXT")
    parser.add_argument("--ask-url", help="agent API base URL: also measure /ask TTFT")
    parser.add_argument("--ask-only", action="store_true", help="only the /ask TTFT")
    parser.add_argument("--ask-reps", type=int, default=5)
    parser.add_argument("--ask-question", default="What does error code CV-E1022 mean?")
    parser.add_argument("--ask-sub", default="bench")
    parser.add_argument("--ask-roles", default="business_staff")
    parser.add_argument("--ask-domains", default="northwind")
    parser.add_argument("--ask-token", help="eval token (Bearer), or 'mint' (EVAL_JWT_SECRET)")
    args = parser.parse_args()
    if args.ask_only and not args.ask_url:
        parser.error("--ask-only needs --ask-url")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    if not args.ask_only:
        compare(args)
    if args.ask_url:
        ask_ttft(args)


if __name__ == "__main__":
    main()
