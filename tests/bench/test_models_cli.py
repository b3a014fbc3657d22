"""kvmem-bench flags shared with the server: `-ngl all`, `-m NAME`, and `models`."""

from __future__ import annotations

import pytest

from kvmem.bench.main import build_parser, main


@pytest.mark.parametrize("command", ["needle", "fidelity", "agent"])
@pytest.mark.parametrize(("value", "layers"), [("all", -1), ("auto", -1), ("0", 0), ("12", 12)])
def test_gpu_layers_take_all_like_the_server(command: str, value: str, layers: int) -> None:
    ns = build_parser().parse_args([command, "-ngl", value])
    assert ns.gpu_layers == layers


def test_decode_sweep_takes_ngl_all() -> None:
    ns = build_parser().parse_args(["decode-sweep", "-m", "x.gguf", "-ngl", "all"])
    assert ns.gpu_layers == -1


def test_gpu_layers_reject_words_and_negatives(capsys: pytest.CaptureFixture[str]) -> None:
    for value in ("many", "-3"):
        with pytest.raises(SystemExit) as info:
            build_parser().parse_args(["needle", "-ngl", value])
        assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument -ngl/--gpu-layers: -3 is out of range: must be in 0..2147483647" in err


def test_models_rejects_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "llama-70b"]) == 2
    assert capsys.readouterr().err == (
        "kvmem-bench models: error: name: unknown model 'llama-70b'; known: qwen-0.5b\n"
    )


def test_models_lists_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("named models\n")
    assert "qwen-0.5b" in out and "491,400,064" in out
    assert out.rstrip().endswith("install the parts with: pip install 'kvmem[qwen]'")


@pytest.mark.llama
def test_an_unknown_model_file_is_reported_before_loading(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["needle", "-m", "/no/such/model.gguf", "--lengths", "512"]) == 2
    assert capsys.readouterr().err == (
        "kvmem-bench needle: error: model file not found: /no/such/model.gguf (-m)\n"
    )
