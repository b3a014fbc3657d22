"""kvmem-launch without starting anything: recipes, --dry-run, overrides, KV sizing, MTP."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvmem.errors import ConfigError
from kvmem.gguf.kv_size import GIB, parse_size, read_kv_geometry
from kvmem.launch.main import main
from kvmem.launch.recipe import load_recipe, recipe_names
from kvmem.memory.ggml_types import GgmlType
from tests.unit.gguf_headers import header_gguf

SERVER = [sys.executable, "-m", "kvmem.server.main"]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(("LLAMA_ARG_", "LLAMA_API_", "KVMEM_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("KVMEM_LAUNCH_DIR", str(tmp_path / "launch-state"))


def write_header(path: Path, arch: str, **kv: int) -> Path:
    """A GGUF file with only the hyperparameters (no tensors)."""
    return Path(header_gguf(path, arch, kv))


@pytest.fixture()
def llama8b(tmp_path: Path) -> Path:
    """Llama-3-8B's shape: 32 layers, 32 heads, 8 KV heads, head dim 4096/32 = 128."""
    return write_header(
        tmp_path / "llama8b.gguf",
        "llama",
        block_count=32,
        **{"attention.head_count": 32, "attention.head_count_kv": 8},
        embedding_length=4096,
        context_length=8192,
    )


@pytest.fixture()
def hybrid27b(tmp_path: Path) -> Path:
    """A Qwen3.5-style hybrid with an MTP head: 64 layers, every 4th full attention (16 KV
    layers), 4 KV heads of dim 256."""
    return write_header(
        tmp_path / "hybrid27b.gguf",
        "qwen35",
        block_count=64,
        **{
            "attention.head_count": 24,
            "attention.head_count_kv": 4,
            "attention.key_length": 256,
            "attention.value_length": 256,
        },
        embedding_length=5120,
        full_attention_interval=4,
        nextn_predict_layers=1,
        context_length=262144,
    )


def dry_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str], **env: str
) -> tuple[int, dict, str]:
    for name in ("MODEL", "MMPROJ", "HOST", "PORT", "API_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = main(["--dry-run", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else {}), err


def test_packaged_recipes() -> None:
    assert recipe_names() == ["cpu-smollm2", "iq3-16gib", "rpc-smollm2"]
    listing = subprocess.run(
        [sys.executable, "-m", "kvmem.launch.main", "--list"], capture_output=True, text=True
    )
    assert listing.returncode == 0
    assert [line.split(":")[0] for line in listing.stdout.splitlines()] == recipe_names()


def test_dry_run_prints_argv_and_environment_and_starts_nothing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KVMEM_LAUNCH_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("LLAMA_ARG_THREADS", "2")
    monkeypatch.setenv("LLAMA_API_KEY", "sk-secret")
    code, body, err = dry_run(capsys, monkeypatch, ["cpu-smollm2", "--", "--alias", "smol"])
    assert code == 0
    assert body["argv"] == [
        *SERVER,
        *("-c", "8192", "-ngl", "0", "--kvmem-budget", "2048", "--kvmem-gen-reserve", "512"),
        *("--host", "127.0.0.1", "--port", "8080", "--alias", "smol"),
    ]
    assert body["env"] == {"LLAMA_API_KEY": "<set>", "LLAMA_ARG_THREADS": "2"}
    assert (body["url"], body["sizing"], body["overrides"]) == ("http://127.0.0.1:8080/", None, {})
    assert body["pidfile"] == str(tmp_path / "state" / "server-8080.pid")
    assert "sk-secret" not in err and "budget 2048 + gen reserve 512" in err
    assert list((tmp_path / "state").iterdir()) == []  # no pidfile, no log: nothing started


def test_environment_overrides_the_recipe(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    hybrid27b: Path,
    tmp_path: Path,
) -> None:
    keys = tmp_path / "keys.txt"
    mmproj = tmp_path / "mmproj.gguf"
    code, body, _ = dry_run(
        capsys,
        monkeypatch,
        ["iq3-16gib"],
        MODEL=str(hybrid27b),
        MMPROJ=str(mmproj),
        HOST="0.0.0.0",
        PORT="18999",
        API_KEY_FILE=str(keys),
    )
    assert code == 0
    assert body["argv"] == [
        *SERVER,
        *("-m", str(hybrid27b), "--mmproj", str(mmproj)),
        *("--no-mmproj-offload", "--image-max-tokens", "512"),
        *("-c", "262144", "-n", "16384", "--kv-dtype", "q8_0", "--enable-thinking"),
        *("--reasoning-budget", "4096", "--kvmem-budget", "36864", "--kvmem-gen-reserve", "16384"),
        *("--spec-type", "draft-mtp"),
        *("--api-key-file", str(keys), "--host", "0.0.0.0", "--port", "18999"),
    ]
    assert sorted(body["overrides"]) == ["API_KEY_FILE", "HOST", "MMPROJ", "MODEL", "PORT"]
    assert body["url"] == "http://127.0.0.1:18999/"
    # the model has an MTP head and kvmem-server runs draft-mtp: the recipe's MTP flags stay
    assert body["notes"][-1] == "MTP: on (--spec-type draft-mtp)"
    code, body, _ = dry_run(
        capsys, monkeypatch, ["iq3-16gib", "--port", "1234"], MODEL=str(hybrid27b), PORT="5"
    )
    assert body["argv"][-2:] == ["--port", "1234"]  # the option beats the environment


def test_the_16gib_recipe_needs_a_model_to_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MODEL", raising=False)
    assert main(["iq3-16gib"]) == 2
    assert capsys.readouterr().err == (
        "kvmem-launch: error: MODEL: recipe iq3-16gib needs a model: "
        "Qwen3.8-27B-GSQ-RCO-IQ3_S-mtp.gguf (set MODEL=/path/to/it)\n"
    )


def test_the_readme_dry_run_plans_without_the_model(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, body, err = dry_run(capsys, monkeypatch, ["iq3-16gib", "--gpu-mem", "16GiB"])
    assert code == 0
    assert body["argv"][3:5] == ["-m", "$MODEL"]
    assert body["argv"][body["argv"].index("--kvmem-budget") + 1] == "36864"
    assert "--spec-type" not in body["argv"] and body["sizing"] is None
    assert body["unchecked"] == [
        "model: MODEL is not set, so -m is the placeholder $MODEL (the recipe wants "
        "Qwen3.8-27B-GSQ-RCO-IQ3_S-mtp.gguf (set MODEL=/path/to/it))",
        "--gpu-mem 16GiB: not sized without the model file; the plan uses the recipe's "
        "budget 36864 + gen reserve 16384",
        "MTP head: the model file was not read, so MTP is left off",
    ]
    assert "kvmem-launch: not checked: --gpu-mem 16GiB: not sized" in err
    readme_model = "/models/Qwen3.8-27B-GSQ-RCO-IQ3_S-mtp.gguf"  # README.md's line, verbatim
    code, body, err = dry_run(
        capsys, monkeypatch, ["iq3-16gib", "--gpu-mem", "16GiB"], MODEL=readme_model
    )
    assert code == 0 and body["argv"][3:5] == ["-m", readme_model]
    assert (
        body["unchecked"][0] == f"model: {readme_model} not found, so its KV geometry was not read"
    )


@pytest.mark.parametrize("gpu_mem", [[], ["--gpu-mem", "16GiB"]], ids=["plain", "gpu-mem"])
@pytest.mark.parametrize("name", recipe_names())
def test_every_recipe_dry_runs_without_its_model_files(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    name: str,
    gpu_mem: list[str],
) -> None:
    from kvmem.errors import ModelNotFoundError
    from kvmem.launch import recipe as recipe_module

    def no_package() -> str:  # the embedded model's package is not installed
        raise ModelNotFoundError("the default model package is not installed")

    monkeypatch.setattr(recipe_module, "_embedded_model_path", no_package)
    missing = str(tmp_path / "absent.gguf")
    for env in ({}, {"MODEL": missing, "MMPROJ": str(tmp_path / "absent-mmproj.gguf")}):
        code, body, err = dry_run(capsys, monkeypatch, [name, *gpu_mem], **env)
        assert code == 0, err
        assert body["recipe"] == name and body["argv"][:3] == SERVER
        budget = body["argv"][body["argv"].index("--kvmem-budget") + 1]
        assert budget == str(load_recipe(name).budget)
        unchecked = body["unchecked"]
        if env:
            assert f"model: {missing} not found, so its KV geometry was not read" in unchecked
            assert f"projector: {tmp_path / 'absent-mmproj.gguf'} not found" in unchecked
        if gpu_mem:
            assert any(line.startswith("--gpu-mem 16GiB: not sized") for line in unchecked)
        assert list((tmp_path.parent / tmp_path.name).glob("launch-state/*")) == []


def test_a_dry_run_still_checks_its_values(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = dry_run(capsys, monkeypatch, ["iq3-16gib", "--gpu-mem", "lots"])
    assert code == 2
    assert err.endswith(
        "kvmem-launch: error: --gpu-mem: give a size with a unit (16GiB, 12000MiB): 'lots'\n"
    )


def test_kv_geometry_of_two_shapes(llama8b: Path, hybrid27b: Path) -> None:
    llama = read_kv_geometry(str(llama8b))
    assert (llama.n_kv_layers, llama.n_head_kv, llama.head_dim_k, llama.has_mtp_head) == (
        32,
        8,
        128,
        False,
    )
    assert llama.bytes_per_token(GgmlType.F16, GgmlType.F16) == 32 * 8 * 128 * 2 * 2
    hybrid = read_kv_geometry(str(hybrid27b))
    assert (hybrid.n_kv_layers, hybrid.n_head_kv, hybrid.head_dim_k, hybrid.has_mtp_head) == (
        16,
        4,
        256,
        True,
    )
    # q8_0: 34 bytes per 32 values
    assert hybrid.bytes_per_token(GgmlType.Q8_0, GgmlType.Q8_0) == 2 * 16 * 4 * 256 * 34 // 32


def test_budget_sizing_from_gpu_memory_on_two_shapes(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    llama8b: Path,
    hybrid27b: Path,
) -> None:
    # hybrid, q8_0 (34816 B/token): 4 GiB - 448 B of "weights" - 2 GiB overhead
    code, body, err = dry_run(
        capsys, monkeypatch, ["iq3-16gib", "--gpu-mem", "4GiB"], MODEL=str(hybrid27b)
    )
    assert code == 0
    free = 4 * GIB - hybrid27b.stat().st_size - 2048 * 2**20
    cells = free // 34816
    assert cells == 61680
    reserve = int(cells * 0.3077) // 128 * 128
    assert (body["sizing"]["budget"], body["sizing"]["gen_reserve"]) == (42624, 18944)
    assert reserve == 18944 and (cells - reserve) // 128 * 128 == 42624
    assert body["argv"][body["argv"].index("--kvmem-budget") + 1] == "42624"
    assert body["argv"][body["argv"].index("--kvmem-gen-reserve") + 1] == "18944"
    assert "KV per token 34816 B: 16 KV layers of 64 x 4 KV heads x head dim 256/256" in err
    assert "61680 cells: gen reserve 31% -> 18944, budget 42624" in err
    # 16 GiB would hold more cells than the 262144-token context: capped there
    _, body, err = dry_run(
        capsys, monkeypatch, ["iq3-16gib", "--gpu-mem", "16GiB"], MODEL=str(hybrid27b)
    )
    assert body["sizing"]["budget"] + body["sizing"]["gen_reserve"] == 262144
    assert "262144 cells (capped at the context size)" in err
    # llama, f16 (131072 B/token) on the CPU recipe: 1 GiB - 256 MiB overhead
    _, body, err = dry_run(
        capsys, monkeypatch, ["cpu-smollm2", "--gpu-mem", "1GiB"], MODEL=str(llama8b)
    )
    assert (768 * 2**20 - llama8b.stat().st_size) // 131072 == 6143
    assert (body["sizing"]["budget"], body["sizing"]["gen_reserve"]) == (4864, 1152)
    assert body["sizing"]["kv_bytes_per_token"] == 131072
    # a later -c (after --) is the context the server gets, so it caps the sizing
    _, body, err = dry_run(
        capsys,
        monkeypatch,
        ["cpu-smollm2", "--gpu-mem", "1GiB", "--", "-c", "4096"],
        MODEL=str(llama8b),
    )
    assert body["sizing"]["budget"] + body["sizing"]["gen_reserve"] == 4096
    assert "4096 cells (capped at the context size)" in err
    # too little memory is a clear error
    code, _, err = dry_run(
        capsys, monkeypatch, ["cpu-smollm2", "--gpu-mem", "300MiB"], MODEL=str(llama8b)
    )
    assert code == 2 and "too little for a KVMem window" in err


@pytest.mark.parametrize("text", ["16", "abcGiB", "-1GiB", "0MiB"])
def test_bad_gpu_mem_sizes(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_size(text)
    assert parse_size("1.5GiB") == 3 * GIB // 2 and parse_size("512MiB") == 512 * 2**20


def test_unknown_recipe(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = dry_run(capsys, monkeypatch, ["no-such-recipe"])
    assert code == 2 and "unknown recipe 'no-such-recipe'; recipes: cpu-smollm2, iq3-16gib" in err


def test_mtp_is_dropped_for_an_architecture_the_drafter_does_not_support(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    other = write_header(
        tmp_path / "dense-mtp.gguf",
        "llama",
        block_count=32,
        **{"attention.head_count": 32, "attention.head_count_kv": 8},
        embedding_length=4096,
        context_length=262144,
        nextn_predict_layers=1,
    )
    code, body, _ = dry_run(capsys, monkeypatch, ["iq3-16gib"], MODEL=str(other))
    assert code == 0
    assert "--spec-type" not in body["argv"]
    assert body["notes"][-1] == (
        "MTP: off, dropping --spec-type draft-mtp: draft-mtp supports qwen35 models, not llama"
    )
