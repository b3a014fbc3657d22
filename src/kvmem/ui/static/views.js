// What the chat page draws from its data: messages, each reply's meta line (speeds, tokens,
// memory, the cut-off marker), the greeting on an empty chat and the header's KVMem line.
// Actions (Continue, Trim) come in as callbacks; the views never call the server.
"use strict";

(() => {
  const { render, fill } = window.kvmemMarkdown;
  const { view: progressView } = window.kvmemProgress;

  function span(parent, cls, text) {
    const el = document.createElement("span");
    el.className = cls;
    el.textContent = text;
    parent.append(el);
    return el;
  }
  function button(parent, cls, text, onclick) {
    const el = document.createElement("button");
    el.type = "button";
    el.className = cls;
    el.textContent = text;
    el.onclick = onclick;
    parent.append(el);
    return el;
  }
  const windowTokens = (kv) => (kv && kv.enabled ? kv.budget + kv.gen_reserve : 0);

  function textOf(content) {
    if (typeof content === "string") return content;
    return (content || []).filter((p) => p.type === "text").map((p) => p.text).join("\n");
  }

  function messageView(m, actions) {
    const el = document.createElement("div");
    el.className = `msg ${m.role}`;
    const body = document.createElement("div");
    body.className = "body";
    if (m.role === "assistant") {
      const details = document.createElement("details");
      details.className = "thinking";
      details.hidden = !m.reasoning;
      const summary = document.createElement("summary");
      summary.textContent = "Thinking";
      const tbody = document.createElement("div");
      tbody.className = "thinking-body";
      tbody.textContent = m.reasoning || "";
      details.append(summary, tbody);
      fill(body, render(m.content));
      const meta = document.createElement("div");
      meta.className = "meta";
      el.append(details, progressView(), body, meta);
      renderMeta(el, m, actions);
      return el;
    }
    fill(body, render(textOf(m.content), { user: true }));
    el.append(body);
    for (const part of Array.isArray(m.content) ? m.content : []) {
      if (part.type !== "image_url") continue;
      const img = document.createElement("img");
      img.src = part.image_url.url;
      img.alt = "attached image";
      el.append(img);
    }
    return el;
  }

  // The cut-off marker: by the output cap, or by the context (prompt + reply reached n_ctx).
  function cutText(m, server) {
    const used = m.usage ? m.usage.prompt_tokens + m.usage.completion_tokens : 0;
    if (server.n_ctx && used >= server.n_ctx - 1) return "cut off: the context is full";
    return m.cap ? `cut off at the ${m.cap}-token cap` : "cut off at the length limit";
  }

  function memorySpans(meta, m, server) {
    const k = m.memory;
    span(meta, "memory", `memory: ${k.cached_tokens} cached \u00b7 ${k.reprocessed_tokens} reprocessed \u00b7 ${k.retrieved_tokens} retrieved`);
    for (const name of ["cached_tokens", "reprocessed_tokens", "retrieved_tokens"]) meta.dataset[name.replace("_tokens", "")] = k[name];
    meta.dataset.retrievedBlocks = k.retrieved_blocks ?? 0;
    const win = windowTokens(server.kvmem);
    if (win && m.usage && m.usage.prompt_tokens > win) {
      const blocks = k.retrieved_blocks ?? 0;
      span(meta, "window", `KVMem: ${m.usage.prompt_tokens}-token prompt over the ${server.kvmem.budget} + ${server.kvmem.gen_reserve} window \u00b7 ${blocks} block${blocks === 1 ? "" : "s"} retrieved`);
    }
  }

  function renderMeta(el, m, actions) {
    const meta = el.querySelector(".meta");
    const server = actions.server();
    meta.replaceChildren();
    if (m.error && !m.contextFull) span(meta, "error", m.error);
    if (m.stopped) span(meta, "stopped", "stopped");
    if (m.timings && m.timings.prompt_n > 0 && m.timings.prompt_per_second > 0) {
      const n = m.timings.prompt_n;
      span(meta, "prompt-speed", `prompt ${n} token${n === 1 ? "" : "s"} at ${m.timings.prompt_per_second.toFixed(1)} tok/s`);
    }
    if (m.speed !== undefined) span(meta, "speed", `${m.speed.toFixed(1)} tok/s`);
    if (m.usage) span(meta, "tokens", `${m.usage.completion_tokens} tokens`);
    if (m.memory) memorySpans(meta, m, server);
    if (m.finish === "length" && !m.contextFull) {
      span(meta, "cut", cutText(m, server));
      if (actions.canContinue(m)) button(meta, "continue", "Continue", () => actions.continueReply(m));
    }
    if (m.contextFull) contextFullNote(meta, m, actions);
  }

  function contextFullNote(meta, m, actions) {
    const note = document.createElement("div");
    note.className = "context-full";
    const { n_prompt_tokens: asked, n_ctx: ctx } = m.contextFull;
    if (actions.canTrim(m)) {
      span(note, "text", `This conversation has reached the context (${asked} tokens > ${ctx}). Trim the oldest turns to go on: they stay here but are no longer sent.`);
      button(note, "trim", "Trim oldest turns and retry", () => actions.trim(m));
    } else {
      span(note, "text", `The last message alone is larger than the context (${asked} tokens > ${ctx}). Shorten it to go on.`);
      button(note, "edit", "Edit the message", () => actions.editLast(m));
    }
    meta.append(note);
  }

  function greeting(server, cap) {
    const box = document.createElement("div");
    box.className = "greeting";
    const h = document.createElement("h2");
    h.textContent = "KVMem chat";
    const what = document.createElement("p");
    what.className = "server-what";
    const kv = server.kvmem;
    what.textContent = server.n_ctx
      ? `${server.model}: context ${server.n_ctx} tokens` +
        (kv && kv.enabled ? `, KVMem window ${kv.budget} + ${kv.gen_reserve} tokens on the GPU.` : ", KVMem off.")
      : "Connecting to the server\u2026";
    const how = document.createElement("p");
    how.className = "hint";
    how.textContent =
      (kv && kv.enabled
        ? "A chat longer than the window keeps going: older blocks move to host memory and the relevant ones are retrieved for each reply (each reply's memory line shows it). "
        : "") + (cap ? `Replies stop at ${cap} tokens (Settings); Continue resumes one.` : "Replies are not capped (Settings).");
    box.append(h, what, how);
    return box;
  }

  // The header's live KVMem line for a conversation: its last prompt size and blocks retrieved.
  function liveLine(el, conv, server) {
    const replies = conv ? conv.messages.filter((m) => m.role === "assistant" && m.memory) : [];
    const blocks = replies.reduce((n, m) => n + (m.memory.retrieved_blocks ?? 0), 0);
    const tokens = replies.reduce((n, m) => n + (m.memory.retrieved_tokens ?? 0), 0);
    const last = replies.length ? replies[replies.length - 1] : null;
    const prompt = last && last.usage ? last.usage.prompt_tokens : 0;
    const win = windowTokens(server.kvmem);
    el.dataset.retrieved = String(tokens);
    el.dataset.retrievedBlocks = String(blocks);
    el.hidden = !(win && (prompt > win || blocks > 0));
    el.textContent = el.hidden ? "" : `this chat: prompt ${prompt} / window ${win} \u00b7 retrieved ${blocks} block${blocks === 1 ? "" : "s"} (${tokens} tokens)`;
  }

  window.kvmemViews = { messageView, renderMeta, greeting, liveLine, textOf };
})();
