// The prompt-processing bar: fed by the `prompt_progress` objects that a stream with
// `return_progress: true` carries (llama-server's format: total prompt tokens, cache = the
// tokens reused from the cache, processed = tokens in the cache so far, cache included,
// time_ms = time since processing began). The bar counts only the tokens to process.
"use strict";

(() => {
  // A record of one progress object: done/todo exclude the reused tokens.
  function measure(p) {
    const total = Math.max(0, Number(p.total) || 0);
    const cache = Math.min(total, Math.max(0, Number(p.cache) || 0));
    const processed = Math.min(total, Math.max(cache, Number(p.processed) || 0));
    const timeMs = Math.max(0, Number(p.time_ms) || 0);
    const done = processed - cache;
    const todo = total - cache;
    const perSecond = timeMs > 0 ? (done * 1000) / timeMs : 0;
    return { total, cache, processed, done, todo, timeMs, perSecond };
  }

  function label(m) {
    const speed = m.perSecond > 0 ? ` \u00b7 ${m.perSecond.toFixed(1)} tok/s` : "";
    const reused = m.cache > 0 ? ` (${m.cache} cached)` : "";
    return `prompt ${m.done} / ${m.todo} tokens${reused}${speed}`;
  }

  function view() {
    const box = document.createElement("div");
    box.className = "prompt-progress";
    box.hidden = true;
    const bar = document.createElement("progress");
    bar.max = 1;
    bar.value = 0;
    const text = document.createElement("span");
    text.className = "progress-label";
    box.append(bar, text);
    return box;
  }

  // Shows progress object `p` in `box` (made by view()); returns its measure.
  function update(box, p) {
    const m = measure(p);
    const bar = box.querySelector("progress");
    bar.max = Math.max(1, m.todo);
    bar.value = m.done;
    box.querySelector(".progress-label").textContent = label(m);
    box.dataset.done = String(m.done);
    box.dataset.todo = String(m.todo);
    box.hidden = false;
    return m;
  }

  function finish(box) {
    box.hidden = true;
  }

  window.kvmemProgress = { measure, label, view, update, finish };
})();
