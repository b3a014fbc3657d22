"""The presets of `kvmem-bench protocol`: the real-model protocol's scale, as data.

A preset fixes the model, the engine's scale (context, budget, reserve: 8x compression at
the longest needle length), the needle grid, agent memory and the fidelity transcript.
`steps()` turns it into the protocol's steps: each a `kvmem-bench` command line writing
one JSON into its own folder. `cpu` is the quality lab for a 2-core machine (BRIEF §5:
the CPU reproduces the H200), `gpu` the 32K protocol of scripts/gpu-protocol.sh with the
lab's methods and layouts, `smoke` a tiny SmolLM2 run that tests the command.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kvmem.errors import ConfigError

NEEDLE_METHODS = ("full", "retrieval", "recency", "compact-rag")
AGENT_METHODS = ("full", "retrieval", "recency", "compact-rag")
FIDELITY_METHODS = ("retrieval", "recency")  # compact-rag: see fidelity.FIDELITY_METHODS


@dataclass(frozen=True, slots=True)
class Step:
    """One step: `kvmem-bench ARGS --out OUT/NAME`, done when OUT/NAME/JSON is complete.
    A needle step is one (layout, kind, length): small enough to redo after a stop, and
    many enough to spread over `--jobs`."""

    name: str
    args: tuple[str, ...]
    json: str  # the file the command writes


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    model: str | None  # -m (None: SmolLM2-135M-Instruct)
    n_ctx: int
    budget: int
    gen_reserve: int
    needle_lengths: tuple[int, ...]  # target prompt tokens of the needle cases
    layouts: tuple[str, ...]  # document, tools, agent, raw
    kinds: tuple[str, ...]  # passkey, multikey
    seeds: int  # kinds x seeds x depths cases per (layout, length) cell
    depths: int
    agent_episodes: int
    agent_tokens: int  # history of one agent-memory episode
    agent_finals: tuple[str, ...]  # user, tool
    fidelity_tokens: int  # the teacher-forced transcript's length
    threads: int  # -t per step (--threads overrides)
    jobs: int  # steps at a time (--jobs overrides)
    engine_flags: tuple[str, ...] = ("--kv-dtype", "f16")

    @property
    def compression(self) -> float:
        """The logical context over the window's budget (8x for the protocol)."""
        return self.n_ctx / self.budget

    @property
    def cases_per_cell(self) -> int:
        """Cases of one (layout, length) cell, both kinds, as BRIEF §5's table counts."""
        return len(self.kinds) * self.seeds * self.depths

    def engine_args(self, threads: int) -> tuple[str, ...]:
        model = ("-m", self.model) if self.model else ()
        return (
            *model,
            "-t",
            str(threads),
            "-c",
            str(self.n_ctx),
            "--kvmem-budget",
            str(self.budget),
            "--kvmem-gen-reserve",
            str(self.gen_reserve),
            *self.engine_flags,
        )

    def steps(self, threads: int | None = None) -> list[Step]:
        """Every step, longest needle lengths first (the slowest start first)."""
        engine = self.engine_args(threads or self.threads)
        grid = ("--seeds", str(self.seeds), "--depths", str(self.depths), "--no-plots")
        out: list[Step] = []
        for length in sorted(self.needle_lengths, reverse=True):
            for layout in self.layouts:
                for kind in self.kinds:
                    args = ("needle", *engine, *grid, "--kinds", kind, "--layouts", layout)
                    args += ("--lengths", str(length), "--methods", ",".join(NEEDLE_METHODS))
                    out.append(Step(f"needle-{layout}-{kind}-{length}", args, "needle.json"))
        for final in self.agent_finals:
            args = ("agent", *engine, "--episodes", str(self.agent_episodes))
            args += ("--target-tokens", str(self.agent_tokens), "--final", final)
            args += ("--methods", ",".join(AGENT_METHODS))
            out.append(Step(f"agent-{final}", args, "agent.json"))
        args = ("fidelity", *engine, "--target-tokens", str(self.fidelity_tokens))
        args += ("--methods", ",".join(FIDELITY_METHODS))
        out.append(Step(f"fidelity-{self.fidelity_tokens}", args, "fidelity.json"))
        return out


PRESETS: dict[str, Preset] = {
    # 8x at 16K: a needle at 14,336 tokens is the 28,672 of the 32K protocol at half scale
    # (7x the window); kinds x seeds x depths = 2 x 2 x 5 = 20 cases a cell (one = 5%).
    "cpu": Preset(
        name="cpu",
        model="qwen-0.5b",
        n_ctx=16384,
        budget=2048,
        gen_reserve=256,
        needle_lengths=(14336,),
        layouts=("document", "tools", "agent", "raw"),
        kinds=("passkey", "multikey"),
        seeds=2,
        depths=5,
        agent_episodes=1,
        agent_tokens=14336,
        agent_finals=("user", "tool"),
        fidelity_tokens=14336,
        threads=2,
        jobs=1,
    ),
    # The 32K protocol (BRIEF §5; scripts/gpu-protocol.sh runs it with oracle steps).
    "gpu": Preset(
        name="gpu",
        model="qwen-0.5b",
        n_ctx=32768,
        budget=4096,
        gen_reserve=512,
        needle_lengths=(28672, 16384, 8192),
        layouts=("document", "tools", "agent", "raw"),
        kinds=("passkey", "multikey"),
        seeds=2,
        depths=5,
        agent_episodes=3,
        agent_tokens=28672,
        agent_finals=("user", "tool"),
        fidelity_tokens=28672,
        threads=4,
        jobs=4,
        engine_flags=("-ngl", "all", "--kv-dtype", "f16"),
    ),
    # Tests the command in seconds on SmolLM2 (8x at 4K, cases of 1K: twice the window); its figures mean nothing.
    "smoke": Preset(
        name="smoke",
        model=None,
        n_ctx=4096,
        budget=512,
        gen_reserve=128,
        needle_lengths=(1024,),
        layouts=("agent", "raw"),
        kinds=("passkey",),
        seeds=1,
        depths=2,
        agent_episodes=1,
        agent_tokens=1024,
        agent_finals=("user",),
        fidelity_tokens=1536,  # the fewest that hold one turn (1,346 tokens)
        threads=2,
        jobs=1,
    ),
}


def preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            "--preset", f"unknown preset {name!r}; use " + ", ".join(PRESETS)
        ) from None


@dataclass(slots=True)
class StepRun:
    name: str
    status: str  # "done" (already), "ran", "failed"
    seconds: float
    returncode: int = 0


def is_complete(path: Path) -> bool:
    """Whether a step's JSON is there, whole, and not a checkpoint of an unfinished run."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("complete", True) is True


def step_json(out: Path, step: Step) -> Path:
    return out / step.name / step.json
