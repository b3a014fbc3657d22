"""A small stdlib HTTP client for kvmem-server: streamed chat completions and /metrics,
plus process RSS and GPU memory probes for the tool benchmark."""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmem.errors import BenchServerError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StreamOutcome:
    """What one streamed chat completion returned, with client-side times."""

    ttft_s: float | None  # request sent -> first generated delta
    total_s: float
    n_deltas: int
    finish_reason: str | None
    usage: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, Any] = field(default_factory=dict)  # llama-server style, if sent
    kvmem: dict[str, Any] = field(default_factory=dict)  # per-turn KVMem stats, if sent


def _request(url: str, body: dict[str, Any] | None, api_key: str | None, timeout: float) -> Any:
    data = None if body is None else json.dumps(body).encode("utf-8")
    req = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode("utf-8", "replace")[:500]
        raise BenchServerError(f"{url}: HTTP {exc.code}: {detail}") from None
    except urllib.error.URLError as exc:
        raise BenchServerError(f"{url}: {exc.reason}") from None


def stream_chat(
    base_url: str, body: dict[str, Any], api_key: str | None = None, timeout: float = 3600.0
) -> StreamOutcome:
    """POST a streaming chat completion and read its server-sent events."""
    t0 = time.perf_counter()
    ttft = None
    n_deltas = 0
    finish = None
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    kvmem: dict[str, Any] = {}
    with _request(f"{base_url}/v1/chat/completions", body, api_key, timeout) as resp:
        for raw in resp:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            if "error" in chunk:
                raise BenchServerError(f"stream error: {chunk['error']}")
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                if (
                    delta.get("content")
                    or delta.get("reasoning_content")
                    or delta.get("tool_calls")
                ):
                    n_deltas += 1
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
            kvmem = chunk.get("kvmem") or kvmem
    return StreamOutcome(
        ttft_s=ttft,
        total_s=time.perf_counter() - t0,
        n_deltas=n_deltas,
        finish_reason=finish,
        usage=usage,
        timings=timings,
        kvmem=kvmem,
    )


def get_json(base_url: str, path: str, api_key: str | None = None, timeout: float = 10.0) -> Any:
    with _request(f"{base_url}{path}", None, api_key, timeout) as resp:
        return json.loads(resp.read().decode("utf-8"))


def fetch_metrics(base_url: str, api_key: str | None = None) -> dict[str, float] | None:
    """The Prometheus samples of /metrics as name -> value; None when not served."""
    try:
        with _request(f"{base_url}/metrics", None, api_key, 10.0) as resp:
            text = resp.read().decode("utf-8")
    except BenchServerError:
        return None
    return parse_prometheus(text)


def parse_prometheus(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            continue
    return out


def wait_healthy(base_url: str, timeout_s: float, api_key: str | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            get_json(base_url, "/health", api_key, timeout=5.0)
            return
        except BenchServerError as exc:
            if time.monotonic() > deadline:
                raise BenchServerError(
                    f"server not healthy after {timeout_s:.0f} s: {exc}"
                ) from None
            time.sleep(1.0)


def process_rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def listening_pid(port: int) -> int | None:
    """The pid of the local process listening on TCP `port` (Linux /proc; best effort)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    if not inodes:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


class GpuMemoryProbe:
    """Used memory of one GPU through NVML (pynvml), when it is installed."""

    def __init__(self, index: int = 0) -> None:
        self._handle = None
        try:
            import pynvml  # optional

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # noqa: BLE001 - any NVML failure just disables the probe
            logger.info("GPU memory probe disabled: %s", exc)

    def used_bytes(self) -> int | None:
        if self._handle is None:
            return None
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
