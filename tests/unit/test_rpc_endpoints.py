"""--rpc worker lists and the layer placement read from llama.cpp's load log (no model)."""

from __future__ import annotations

import pytest

from kvmem.errors import ConfigError
from kvmem.settings.rpc_endpoints import LayerPlacement, RpcEndpoint, parse_endpoints


def test_worker_lists_as_llama_server_spells_them() -> None:
    assert parse_endpoints("127.0.0.1:50052,10.0.0.2:50053") == (
        RpcEndpoint("127.0.0.1", 50052),
        RpcEndpoint("10.0.0.2", 50053),
    )
    assert parse_endpoints("gpu-box.lan:1") == (RpcEndpoint("gpu-box.lan", 1),)
    (v6,) = parse_endpoints("[::1]:50052")
    assert (v6.host, v6.port, str(v6)) == ("::1", 50052, "[::1]:50052")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("127.0.0.1", "--rpc: invalid RPC worker '127.0.0.1': use HOST:PORT, e.g. 127.0.0.1:50052"),
        ("127.0.0.1:0", "--rpc: invalid port 0 in '127.0.0.1:0': use 1-65535"),
        ("h:70000", "--rpc: invalid port 70000 in 'h:70000': use 1-65535"),
        ("a:1,", "--rpc: invalid RPC worker list 'a:1,': use HOST:PORT[,HOST:PORT...]"),
        ("", "--rpc: invalid RPC worker list '': use HOST:PORT[,HOST:PORT...]"),
        ("a:1,a:1", "--rpc: the RPC worker a:1 is listed twice"),
    ],
)
def test_bad_worker_lists(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_endpoints(text)
    assert str(err.value) == message


# llama.cpp's own lines (llama-model.cpp load_tensors, LLAMA_LOG_DEBUG), 4 layers + output
LOAD_LOG = [
    "load_tensors: loading model tensors, this can take a while... (mmap = true)\n",
    "load_tensors: layer   0 assigned to device RPC0, is_swa = 0\n",
    "load_tensors: layer   1 assigned to device RPC0, is_swa = 0\n",
    "load_tensors: layer   2 assigned to device RPC1, is_swa = 0\n",
    "load_tensors: layer   3 assigned to device CPU, is_swa = 0\n",
    "load_tensors: layer   4 assigned to device RPC1, is_swa = 0\n",
    "load_tensors: offloaded 4/5 layers to GPU\n",
]


def test_layer_placement_from_the_load_log() -> None:
    endpoints = {"RPC0": "127.0.0.1:50052", "RPC1": "127.0.0.1:50053"}
    placement = LayerPlacement.from_log(LOAD_LOG, endpoints)
    assert placement.devices == ("RPC0", "RPC0", "RPC1", "CPU")
    assert placement.output == "RPC1"
    assert placement.remote_layers == 3
    assert placement.as_json() == {
        "layers": [
            {"device": "RPC0", "endpoint": "127.0.0.1:50052", "first": 0, "last": 1},
            {"device": "RPC1", "endpoint": "127.0.0.1:50053", "first": 2, "last": 2},
            {"device": "CPU", "endpoint": None, "first": 3, "last": 3},
        ],
        "output": {"device": "RPC1", "endpoint": "127.0.0.1:50053"},
    }


def test_a_log_without_layer_lines_places_nothing() -> None:
    placement = LayerPlacement.from_log(["llama_model_loader: loaded meta data\n"], {})
    assert (placement.devices, placement.output, placement.as_json()["layers"]) == ((), None, [])
