"""kvmem-server's network rows of the flag table: listening, lanes and endpoints, resource
bounds and timeouts, CORS, API keys and the chat page (llama-server's names and meanings).

`-to/--timeout` is llama-server's read/write timeout: here the deadline of a request's
body (unless `--body-timeout` is given) and the write timeout (a response write that makes
no progress for that long closes the connection, which ends its generation).
"""

from __future__ import annotations

from kvmem.cli import limit_flags as lim
from kvmem.settings import values as t
from kvmem.settings.flag import Flag
from kvmem.settings.flag import Group as G

F = Flag
# fmt: off
NETWORK_TABLE: tuple[Flag, ...] = (
    F(("--host",), "host", "address(es) to listen on, comma-separated", t.host_list, "127.0.0.1",
      "LLAMA_ARG_HOST", metavar="HOST", group=G.SERVER),
    F(("--port",), "port", "port to listen on", t.port, 8080, "LLAMA_ARG_PORT", metavar="PORT",
      group=G.SERVER),
    F(("--reuse-port",), "reuse_port", "let other sockets bind the same port (SO_REUSEPORT)", None,
      False, "LLAMA_ARG_REUSE_PORT", group=G.SERVER),
    F(("-np", "--parallel"), "parallel",
      "lanes (1-4): concurrent generations, each its own context and KVMem window; "
      "each lane's logical context is -c / N",
      t.parallel_slots, 1, "LLAMA_ARG_N_PARALLEL", metavar="N", group=G.SERVER),
    F(("--queue-size",), "queue_size", "requests that may wait for the slot before 503",
      t.int_in_range(0, 4096), 16, metavar="N", group=G.SERVER),
    F(("--threads-http",), "threads_http",
      "threads that run blocking request work (file reads, tokenizing); -1 or 0 = automatic "
      "(40); the generation has its own engine thread",
      t.threads_http, -1, "LLAMA_ARG_THREADS_HTTP", metavar="N", group=G.SERVER),
    F(("-to", "--timeout"), "timeout",
      "read/write timeout in seconds (1-86400): the deadline of a request's body unless "
      "--body-timeout is given, and how long a response write may make no progress before "
      "the connection is closed (its generation ends)",
      t.int_in_range(1, 86400), lim.DEFAULT_TIMEOUT_S, "LLAMA_ARG_TIMEOUT", metavar="N",
      group=G.SERVER),
    F(("--slots",), "slots", "expose GET /slots (501 without)", None, True,
      "LLAMA_ARG_ENDPOINT_SLOTS", negative=("--no-slots",), group=G.SERVER),
    F(("--metrics",), "metrics", "enable the Prometheus /metrics endpoint", None, False,
      "LLAMA_ARG_ENDPOINT_METRICS", group=G.SERVER),
    F(("--slot-save-path",), "slot_save_path",
      "directory for POST /slots/0?action=save|restore files (the KVMem session's history)",
      t.non_empty, None, "LLAMA_ARG_SLOT_SAVE_PATH", metavar="PATH",
      shown_default="none: slot actions answer 501", group=G.SERVER),
    # resource bounds and browser safety (kvmem.server.limits)
    F(("--max-body-size",), "max_body_size", "largest request body (bytes, or K/M/G)",
      lim.byte_size, lim.DEFAULT_MAX_BODY_BYTES, metavar="SIZE", shown_default="32M", group=G.SERVER),
    F(("--header-timeout",), "header_timeout", "seconds a connection may take to send its headers",
      lim.seconds, lim.DEFAULT_HEADER_TIMEOUT_S, metavar="S", group=G.SERVER),
    F(("--body-timeout",), "body_timeout", "seconds a request may take to send its body",
      lim.seconds, lim.DEFAULT_BODY_TIMEOUT_S, metavar="S", group=G.SERVER,
      shown_default=f"{lim.DEFAULT_BODY_TIMEOUT_S:g}, or --timeout's value when that is given"),
    F(("--keep-alive-timeout",), "keep_alive_timeout", "seconds an idle keep-alive connection stays",
      lim.seconds, lim.DEFAULT_KEEP_ALIVE_TIMEOUT_S, metavar="S", group=G.SERVER),
    F(("--max-connections",), "max_connections", "open connections before new ones are closed",
      t.int_in_range(2, 1_000_000), lim.DEFAULT_MAX_CONNECTIONS, metavar="N", group=G.SERVER),
    F(("--cors-origins",), "cors_origins",
      "origins allowed cross-origin: a comma list, 'localhost' (any local origin) or '*'; "
      "OPTIONS preflights are answered 200 either way, with Access-Control-Allow-Origin only "
      "for these", lim.cors_origins, (), "LLAMA_ARG_CORS_ORIGINS", metavar="LIST",
      shown_default="none: same-origin only (llama-server: *)", group=G.SERVER),
    F(("--cors-methods",), "cors_methods", "methods a preflight allows (comma list)", t.token_list,
      lim.DEFAULT_CORS_METHODS, "LLAMA_ARG_CORS_METHODS", metavar="LIST",
      shown_default=", ".join(lim.DEFAULT_CORS_METHODS), group=G.SERVER),
    F(("--cors-headers",), "cors_headers",
      "request headers a preflight allows (comma list, or * = the headers it asks for)",
      t.token_list, lim.DEFAULT_CORS_HEADERS, "LLAMA_ARG_CORS_HEADERS", metavar="LIST",
      shown_default="*", group=G.SERVER),
    F(("--cors-credentials",), "cors_credentials",
      "allow credentials (cookies, Authorization) from the allowed origins", None, True,
      "LLAMA_ARG_CORS_CREDENTIALS", negative=("--no-cors-credentials",), group=G.SERVER),
    F(("--allowed-hosts",), "allowed_hosts",
      "host names served without an API key besides IP addresses, localhost and --host "
      "(DNS-rebinding defence: other Host headers get 403); * serves every name",
      lim.host_names, (), metavar="LIST", shown_default="none", group=G.SERVER),
    F(("--api-key",), "api_key", "API key(s), comma-separated (CSV quoting); repeatable", str, None,
      "LLAMA_API_KEY", append=True, metavar="KEY", shown_default="none: no authentication",
      group=G.AUTH),
    F(("--api-key-file",), "api_key_file", "file with one API key per line; repeatable", str, None,
      "LLAMA_ARG_API_KEY_FILE", append=True, metavar="FNAME", shown_default="none", group=G.AUTH),
    F(("--ui", "--webui"), "ui", "serve the browser chat page at /", None, True, "LLAMA_ARG_UI",
      negative=("--no-ui", "--no-webui"), group=G.UI),
    F(("--ui-dir", "--path"), "ui_dir", "directory of the chat page to serve (must hold index.html)",
      t.non_empty, None, "LLAMA_ARG_STATIC_PATH", metavar="PATH", shown_default="the packaged page",
      group=G.UI),
)
# fmt: on
