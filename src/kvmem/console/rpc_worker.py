"""`kvmem-rpc-worker`: kvmem.cli.rpc_worker's flags and checks, then llama.cpp's RPC
server (kvmem.engine.llama.rpc.serve_worker) serving this machine's devices."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from kvmem.cli.rpc_worker import run
from kvmem.settings.rpc_endpoints import RpcEndpoint


def serve(endpoint: RpcEndpoint, cache_dir: str | None, n_threads: int) -> None:
    from kvmem.engine.llama.rpc import serve_worker  # llama.cpp loads once the checks pass

    serve_worker(endpoint, cache_dir, n_threads)


def main(argv: Sequence[str] | None = None) -> int:
    return run(argv, serve)


if __name__ == "__main__":
    sys.exit(main())
