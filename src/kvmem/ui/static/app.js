// The kvmem-server chat page. Plain JavaScript, no build step: the third-party libraries
// (marked, DOMPurify, highlight.js) come from vendor.js, built by scripts/build-ui.sh.
// Everything is served by the server itself; nothing is loaded from the network.
"use strict";

(() => {
  const { DOMPurify, hljs, Marked } = window.kvmemVendor;
  const $ = (id) => document.getElementById(id);
  const KEY_STORE = "kvmem.apiKey";
  const SETTINGS_STORE = "kvmem.settings";

  // ---- Markdown: raw HTML in model output is shown as text, and the result is sanitized.
  const escapeHtml = (s) =>
    s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
  const marked = new Marked({
    gfm: true,
    renderer: {
      html({ text }) {
        return escapeHtml(text);
      },
      code({ text, lang }) {
        const language = (lang || "").trim().split(/\s+/)[0];
        let body;
        if (language && hljs.getLanguage(language)) {
          body = hljs.highlight(text, { language, ignoreIllegals: true }).value;
        } else {
          body = hljs.highlightAuto(text).value;
        }
        const cls = language ? ` language-${escapeHtml(language)}` : "";
        return `<pre><code class="hljs${cls}">${body}</code></pre>\n`;
      },
    },
  });
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });
  function renderMarkdown(text) {
    return DOMPurify.sanitize(marked.parse(text || ""), {
      FORBID_TAGS: ["style", "form", "input", "button", "iframe", "object", "embed"],
      FORBID_ATTR: ["style"],
    });
  }

  // ---- Settings and the API key (localStorage: they never leave this browser except
  // as the Authorization header of this server's own API calls).
  const NUMERIC = [
    ["set-budget", "reasoning_budget_tokens", parseInt],
    ["set-max-tokens", "max_tokens", parseInt],
    ["set-temperature", "temperature", parseFloat],
    ["set-top-p", "top_p", parseFloat],
    ["set-top-k", "top_k", parseInt],
    ["set-min-p", "min_p", parseFloat],
  ];
  function loadSettings() {
    try {
      return { follow: true, ...JSON.parse(localStorage.getItem(SETTINGS_STORE) || "{}") };
    } catch {
      return { follow: true };
    }
  }
  let settings = loadSettings();
  const apiKey = () => localStorage.getItem(KEY_STORE) || "";

  function fillSettingsForm() {
    $("set-api-key").value = apiKey();
    $("set-follow").checked = settings.follow !== false;
    $("set-thinking").value = settings.thinking || "";
    $("set-effort").value = settings.effort || "";
    for (const [id, name] of NUMERIC) $(id).value = settings[name] ?? "";
    $("sampling-fields").disabled = $("set-follow").checked;
  }
  function saveSettingsForm() {
    const key = $("set-api-key").value.trim();
    if (key) localStorage.setItem(KEY_STORE, key);
    else localStorage.removeItem(KEY_STORE);
    const next = { follow: $("set-follow").checked, thinking: $("set-thinking").value, effort: $("set-effort").value };
    for (const [id, name, parse] of NUMERIC) {
      const raw = $(id).value.trim();
      if (raw !== "" && !Number.isNaN(parse(raw))) next[name] = parse(raw);
    }
    settings = next;
    localStorage.setItem(SETTINGS_STORE, JSON.stringify(settings));
  }
  function requestOptions() {
    if (settings.follow !== false) return {};
    const out = {};
    if (settings.thinking) out.chat_template_kwargs = { enable_thinking: settings.thinking === "on" };
    if (settings.effort) out.reasoning_effort = settings.effort;
    for (const [, name] of NUMERIC) if (settings[name] !== undefined) out[name] = settings[name];
    return out;
  }
  function headers() {
    const h = { "Content-Type": "application/json" };
    if (apiKey()) h.Authorization = `Bearer ${apiKey()}`;
    return h;
  }

  // ---- IndexedDB history: one record per conversation {id, title, messages, updated}.
  const dbReady = new Promise((resolve, reject) => {
    const req = indexedDB.open("kvmem-chat", 1);
    req.onupgradeneeded = () => req.result.createObjectStore("conversations", { keyPath: "id" });
    req.onsuccess = () => resolve(req.result);
    req.onerror = () => reject(req.error);
  });
  async function store(mode, fn) {
    const db = await dbReady;
    return new Promise((resolve, reject) => {
      const tx = db.transaction("conversations", mode);
      const req = fn(tx.objectStore("conversations"));
      tx.oncomplete = () => resolve(req && req.result);
      tx.onerror = () => reject(tx.error);
    });
  }
  const allConversations = () => store("readonly", (s) => s.getAll());
  const putConversation = (c) => store("readwrite", (s) => s.put(c));
  const deleteConversation = (id) => store("readwrite", (s) => s.delete(id));

  // ---- State
  let conversations = [];
  let current = null;
  let controller = null;
  let vision = false;
  let attachments = [];

  function newConversation() {
    return { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 7)}`, title: "New chat", messages: [], updated: Date.now() };
  }
  function banner(text) {
    $("banner").textContent = text || "";
    $("banner").hidden = !text;
  }

  function renderList() {
    const ul = $("conversations");
    ul.replaceChildren();
    for (const c of [...conversations].sort((a, b) => b.updated - a.updated)) {
      const li = document.createElement("li");
      li.dataset.id = c.id;
      if (current && c.id === current.id) li.classList.add("active");
      const title = document.createElement("button");
      title.type = "button";
      title.className = "title";
      title.textContent = c.title;
      title.title = c.title;
      title.onclick = () => switchTo(c.id);
      const rename = document.createElement("button");
      rename.type = "button";
      rename.className = "act rename";
      rename.title = "Rename";
      rename.textContent = "\u270E";
      rename.onclick = () => startRename(li, c);
      const del = document.createElement("button");
      del.type = "button";
      del.className = "act delete";
      del.title = "Delete";
      del.textContent = "\u2715";
      del.onclick = () => removeConversation(c.id);
      li.append(title, rename, del);
      ul.append(li);
    }
  }
  function startRename(li, c) {
    const input = document.createElement("input");
    input.className = "title-input";
    input.value = c.title;
    li.querySelector(".title").replaceWith(input);
    input.focus();
    input.select();
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      if (save && input.value.trim()) {
        c.title = input.value.trim();
        await putConversation(c);
      }
      renderList();
    };
    input.onkeydown = (e) => {
      if (e.key === "Enter") finish(true);
      if (e.key === "Escape") finish(false);
    };
    input.onblur = () => finish(true);
  }
  async function removeConversation(id) {
    if (current && current.id === id) stopGeneration();
    await deleteConversation(id);
    conversations = conversations.filter((c) => c.id !== id);
    if (current && current.id === id) {
      current = conversations.sort((a, b) => b.updated - a.updated)[0] || null;
    }
    renderList();
    renderMessages();
  }
  function switchTo(id) {
    stopGeneration();
    current = conversations.find((c) => c.id === id) || null;
    renderList();
    renderMessages();
    document.getElementById("app").classList.remove("sidebar-open");
  }

  // ---- Messages
  function textOf(content) {
    if (typeof content === "string") return content;
    return (content || []).filter((p) => p.type === "text").map((p) => p.text).join("\n");
  }
  function messageView(m) {
    const el = document.createElement("div");
    el.className = `msg ${m.role}`;
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
      const body = document.createElement("div");
      body.className = "body";
      body.innerHTML = renderMarkdown(m.content);
      const meta = document.createElement("div");
      meta.className = "meta";
      el.append(details, body, meta);
      renderMeta(el, m);
    } else {
      const body = document.createElement("div");
      body.className = "body";
      body.textContent = textOf(m.content);
      el.append(body);
      if (Array.isArray(m.content)) {
        for (const part of m.content) {
          if (part.type !== "image_url") continue;
          const img = document.createElement("img");
          img.src = part.image_url.url;
          img.alt = "attached image";
          el.append(img);
        }
      }
    }
    return el;
  }
  function renderMeta(el, m) {
    const meta = el.querySelector(".meta");
    meta.replaceChildren();
    const add = (cls, text) => {
      const span = document.createElement("span");
      span.className = cls;
      span.textContent = text;
      meta.append(span);
    };
    if (m.error) add("error", m.error);
    if (m.stopped) add("stopped", "stopped");
    if (m.speed !== undefined) add("speed", `${m.speed.toFixed(1)} tok/s`);
    if (m.usage) add("tokens", `${m.usage.completion_tokens} tokens`);
    if (m.memory) {
      const k = m.memory;
      add("memory", `memory: ${k.cached_tokens} cached \u00b7 ${k.reprocessed_tokens} reprocessed \u00b7 ${k.retrieved_tokens} retrieved`);
      for (const name of ["cached_tokens", "reprocessed_tokens", "retrieved_tokens"]) meta.dataset[name.replace("_tokens", "")] = k[name];
    }
  }
  function renderMessages() {
    const box = $("messages");
    box.replaceChildren(...(current ? current.messages.map(messageView) : []));
    box.scrollTop = box.scrollHeight;
  }

  // ---- Sending and streaming
  function setBusy(busy) {
    $("send").hidden = busy;
    $("stop").hidden = !busy;
  }
  function stopGeneration() {
    if (controller) controller.abort();
  }
  async function* sseEvents(response) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
  async function apiError(response) {
    try {
      const body = await response.json();
      return (body.error && body.error.message) || `HTTP ${response.status}`;
    } catch {
      return `HTTP ${response.status}`;
    }
  }

  async function send(text) {
    if (controller) return;
    if (!current) {
      current = newConversation();
      conversations.push(current);
    }
    const conv = current;
    const content = attachments.length
      ? [{ type: "text", text }, ...attachments.map((url) => ({ type: "image_url", image_url: { url } }))]
      : text;
    conv.messages.push({ role: "user", content });
    if (conv.title === "New chat") conv.title = text.slice(0, 40) || "Image";
    attachments = [];
    renderAttachments();
    const history = conv.messages.map((m) => ({ role: m.role, content: m.content }));
    const reply = { role: "assistant", content: "", reasoning: "" };
    conv.messages.push(reply);
    conv.updated = Date.now();
    await putConversation(conv);
    renderList();
    renderMessages();
    const view = $("messages").lastElementChild;
    controller = new AbortController();
    setBusy(true);
    const started = performance.now();
    let firstToken = null;
    let pending = false;
    const paint = () => {
      pending = false;
      if (current !== conv) return;
      view.querySelector(".body").innerHTML = renderMarkdown(reply.content);
      const details = view.querySelector("details.thinking");
      details.hidden = !reply.reasoning;
      details.querySelector(".thinking-body").textContent = reply.reasoning;
      if (reply.reasoning && !reply.content) details.open = true;
      $("messages").scrollTop = $("messages").scrollHeight;
    };
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: headers(),
        signal: controller.signal,
        body: JSON.stringify({ messages: history, stream: true, stream_options: { include_usage: true }, ...requestOptions() }),
      });
      if (!response.ok) {
        reply.error = await apiError(response);
        if (response.status === 401) banner("This server needs an API key: enter it in Settings.");
      } else {
        banner("");
        for await (const chunk of sseEvents(response)) {
          if (chunk.error) {
            reply.error = chunk.error.message;
            break;
          }
          const choice = chunk.choices && chunk.choices[0];
          if (choice && choice.delta) {
            if (choice.delta.content) reply.content += choice.delta.content;
            if (choice.delta.reasoning_content) reply.reasoning += choice.delta.reasoning_content;
            if ((choice.delta.content || choice.delta.reasoning_content) && firstToken === null) firstToken = performance.now();
          }
          if (chunk.timings) reply.timings = chunk.timings;
          if (chunk.kvmem) reply.memory = chunk.kvmem;
          if (chunk.usage) reply.usage = chunk.usage;
          if (!pending) {
            pending = true;
            requestAnimationFrame(paint);
          }
        }
      }
    } catch (err) {
      if (err.name === "AbortError") reply.stopped = true;
      else reply.error = String(err.message || err);
    } finally {
      controller = null;
      setBusy(false);
    }
    if (reply.timings && reply.timings.predicted_per_second > 0) {
      reply.speed = reply.timings.predicted_per_second;
    } else if (reply.usage && firstToken !== null) {
      const seconds = (performance.now() - firstToken) / 1000;
      if (seconds > 0) reply.speed = reply.usage.completion_tokens / seconds;
    }
    reply.elapsed_ms = performance.now() - started;
    conv.updated = Date.now();
    await putConversation(conv);
    if (current === conv) {
      paint();
      renderMeta(view, reply);
    }
  }

  // ---- Images (only when the server reports vision)
  function renderAttachments() {
    const box = $("attachments");
    box.replaceChildren(...attachments.map((url) => Object.assign(document.createElement("img"), { src: url, alt: "attachment" })));
    box.hidden = attachments.length === 0;
  }
  function addImageFile(file) {
    if (!vision || !file.type.startsWith("image/")) return;
    const reader = new FileReader();
    reader.onload = () => {
      attachments.push(reader.result);
      renderAttachments();
    };
    reader.readAsDataURL(file);
  }

  // ---- Server info
  async function loadProps() {
    const response = await fetch("/props", { headers: headers() });
    if (response.status === 401) {
      $("server-status").textContent = "API key needed";
      banner("This server needs an API key: enter it in Settings.");
      return;
    }
    if (!response.ok) {
      $("server-status").textContent = await apiError(response);
      return;
    }
    banner("");
    const props = await response.json();
    vision = Boolean(props.modalities && props.modalities.vision);
    $("attach-label").hidden = !vision;
    $("model-name").textContent = props.model_alias || "KVMem";
    const kv = props.kvmem || {};
    $("server-status").textContent = `ctx ${props.n_ctx}` + (kv.enabled ? ` \u00b7 KVMem budget ${kv.budget} + ${kv.gen_reserve}` : "");
  }

  // ---- Wiring
  async function init() {
    conversations = await allConversations();
    current = [...conversations].sort((a, b) => b.updated - a.updated)[0] || null;
    renderList();
    renderMessages();
    $("composer").onsubmit = (e) => {
      e.preventDefault();
      if (controller) return; // one generation at a time; the text stays in the box
      const text = $("prompt").value.trim();
      if (!text && attachments.length === 0) return;
      $("prompt").value = "";
      send(text);
    };
    $("prompt").onkeydown = (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        $("composer").requestSubmit();
      }
    };
    $("prompt").onpaste = (e) => {
      for (const item of e.clipboardData.items) if (item.kind === "file") addImageFile(item.getAsFile());
    };
    $("attach").onchange = (e) => {
      for (const file of e.target.files) addImageFile(file);
      e.target.value = "";
    };
    $("stop").onclick = stopGeneration;
    $("new-chat").onclick = async () => {
      stopGeneration();
      current = newConversation();
      conversations.push(current);
      await putConversation(current);
      renderList();
      renderMessages();
      $("prompt").focus();
    };
    $("toggle-sidebar").onclick = () => document.getElementById("app").classList.toggle("sidebar-open");
    $("open-settings").onclick = () => {
      fillSettingsForm();
      $("settings").showModal();
    };
    $("set-follow").onchange = () => {
      $("sampling-fields").disabled = $("set-follow").checked;
    };
    $("settings-form").onsubmit = () => {
      saveSettingsForm();
      loadProps();
    };
    await loadProps();
    document.body.dataset.ready = "1";
  }
  init();
})();
