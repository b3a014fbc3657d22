"""Re-prefill a KVMem window's blocks as fresh text: does the model answer right?"""
import sys
from kvmem.bench.engines import BenchSettings, LlamaEngineFactory, Method, ask
from kvmem.bench.needle import build_prompts
from kvmem.bench.needle_data import NeedleSpec, NeedleKind, Layout
from kvmem.bench.conversation import RenderedPrompt
from kvmem.config import KVMemConfig

layout, length, depth, blocks = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
Q = "/root/.cache/kvmem/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
s = BenchSettings(model_path=Q, n_ctx=8192, n_threads=2, kvmem=KVMemConfig(budget=1024, gen_reserve=256))
eng = LlamaEngineFactory(s).open(Method.FULL)
spec = NeedleSpec(NeedleKind.MULTIKEY, Layout(layout), length, depth, 0)
case, prompt, span = build_prompts([spec], eng)[0]
toks = prompt.tokens
bt = 128
nb = len(toks) // bt
for variant in sys.argv[5:] or ["as-is"]:
    sel = sorted({int(b) for b in blocks.split(",")})
    if variant == "drop-distractors":
        pass
    sub = [t for b in sel for t in toks[b * bt:(b + 1) * bt]] + toks[nb * bt:]
    eng.reset()
    p = RenderedPrompt(tokens=sub, query=None)
    a = ask(eng, p, 8)
    print(variant, len(sub), repr(a.text), "expected", case.expected, "needle", span)
