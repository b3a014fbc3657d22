// The kvmem-server chat page. Plain JavaScript, no build step: the third-party libraries
// (marked, DOMPurify, highlight.js) come from vendor.js, built by scripts/build-ui.sh;
// settings.js, conversations.js, sse.js, markdown.js, progress.js, transfer.js and views.js hold
// the page's own parts. Everything is served by the server itself; nothing is loaded from the network.
"use strict";

(() => {
  const { messageView, renderMeta, greeting, liveLine } = window.kvmemViews;
  const { fill, render } = window.kvmemMarkdown;
  const progress = window.kvmemProgress;
  const transfer = window.kvmemTransfer;
  const { sseEvents, apiError } = window.kvmemSse;
  const { cap, headers, requestOptions, fillSettingsForm, saveSettingsForm } = window.kvmemSettings;
  const { allConversations, putConversation, deleteConversation, newConversation, byRecent, historyOf, trimPoint } =
    window.kvmemConversations;
  const $ = (id) => document.getElementById(id);

  // ---- State
  let conversations = [];
  let current = null;
  let controller = null;
  let vision = false;
  let attachments = [];
  let server = { model: "KVMem", n_ctx: 0, kvmem: null };

  function banner(text) {
    $("banner").textContent = text || "";
    $("banner").hidden = !text;
  }

  function renderList() {
    const ul = $("conversations");
    ul.replaceChildren();
    for (const c of byRecent(conversations)) {
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
    if (current && current.id === id) current = byRecent(conversations)[0] || null;
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
  const actions = {
    server: () => server,
    canContinue: (m) => !controller && current && current.messages[current.messages.length - 1] === m,
    continueReply: (m) => continueReply(current, m),
    canTrim: (m) => trimPoint(current, m) !== null,
    trim: (m) => trimAndRetry(current, m),
    editLast: (m) => editLast(current, m),
  };
  function renderMessages() {
    const box = $("messages");
    if (!current || current.messages.length === 0) {
      box.replaceChildren(greeting(server, cap()));
    } else {
      const views = current.messages.map((m) => messageView(m, actions));
      const from = current.sentFrom || 0;
      views.forEach((v, i) => v.classList.toggle("trimmed", i < from));
      if (from > 0) {
        const divider = document.createElement("div");
        divider.className = "trim-divider";
        divider.textContent = `${from} earlier message${from === 1 ? " is" : "s are"} no longer sent (trimmed to fit the context)`;
        views.splice(from, 0, divider);
      }
      box.replaceChildren(...views);
    }
    box.scrollTop = box.scrollHeight;
    liveLine($("kvmem-live"), current, server);
  }
  const lastView = () => $("messages").lastElementChild;

  // ---- Streaming
  function setBusy(busy) {
    $("send").hidden = busy;
    $("stop").hidden = !busy;
  }
  function stopGeneration() {
    if (controller) controller.abort();
  }
  // Streams one request into `reply` (whose view is `view`); a continued reply grows.
  async function stream(conv, reply, history, view) {
    controller = new AbortController();
    setBusy(true);
    const bar = view.querySelector(".prompt-progress");
    const before = reply.usage ? reply.usage.completion_tokens : 0;
    const started = performance.now();
    let firstToken = null;
    let pending = false;
    const paint = () => {
      pending = false;
      if (current !== conv) return;
      fill(view.querySelector(".body"), render(reply.content));
      const details = view.querySelector("details.thinking");
      details.hidden = !reply.reasoning;
      details.querySelector(".thinking-body").textContent = reply.reasoning;
      if (reply.reasoning && !reply.content) details.open = true;
      $("messages").scrollTop = $("messages").scrollHeight;
    };
    delete reply.error;
    delete reply.stopped;
    delete reply.contextFull;
    reply.cap = cap();
    try {
      const response = await fetch("/v1/chat/completions", {
        method: "POST",
        headers: headers(),
        signal: controller.signal,
        body: JSON.stringify({ messages: history, stream: true, stream_options: { include_usage: true }, return_progress: true, ...requestOptions() }),
      });
      if (!response.ok) {
        const error = await apiError(response);
        reply.error = error.message;
        if (error.type === "exceed_context_size_error") reply.contextFull = { n_prompt_tokens: error.n_prompt_tokens, n_ctx: error.n_ctx };
        if (response.status === 401) banner("This server needs an API key: enter it in Settings.");
      } else {
        banner("");
        for await (const chunk of sseEvents(response)) {
          if (chunk.error) {
            reply.error = chunk.error.message;
            break;
          }
          if (chunk.prompt_progress) {
            reply.progress = chunk.prompt_progress;
            progress.update(bar, chunk.prompt_progress);
          }
          const choice = chunk.choices && chunk.choices[0];
          if (choice && choice.delta) {
            if (choice.delta.content) reply.content += choice.delta.content;
            if (choice.delta.reasoning_content) reply.reasoning = (reply.reasoning || "") + choice.delta.reasoning_content;
            if ((choice.delta.content || choice.delta.reasoning_content) && firstToken === null) {
              firstToken = performance.now();
              progress.finish(bar);
            }
          }
          if (choice && choice.finish_reason) reply.finish = choice.finish_reason;
          if (chunk.timings) reply.timings = chunk.timings;
          if (chunk.kvmem) reply.memory = chunk.kvmem;
          if (chunk.usage) reply.usage = { ...chunk.usage, completion_tokens: before + chunk.usage.completion_tokens };
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
      progress.finish(bar);
    }
    if (reply.timings && reply.timings.predicted_per_second > 0) {
      reply.speed = reply.timings.predicted_per_second;
    } else if (reply.usage && firstToken !== null) {
      const seconds = (performance.now() - firstToken) / 1000;
      if (seconds > 0) reply.speed = (reply.usage.completion_tokens - before) / seconds;
    }
    reply.elapsed_ms = performance.now() - started;
    conv.updated = Date.now();
    await putConversation(conv);
    if (current === conv) {
      paint();
      renderMeta(view, reply, actions);
      liveLine($("kvmem-live"), conv, server);
      $("messages").scrollTop = $("messages").scrollHeight;
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
    const reply = { role: "assistant", content: "", reasoning: "" };
    conv.messages.push(reply);
    conv.updated = Date.now();
    await putConversation(conv);
    renderList();
    renderMessages();
    await stream(conv, reply, historyOf(conv, -1), lastView());
  }

  // Continue: the reply so far goes back as the last (assistant) message, and the server
  // continues that message (assistant prefill); the new text is appended to it.
  async function continueReply(conv, reply) {
    if (controller || !conv) return;
    delete reply.finish;
    renderMeta(lastView(), reply, actions);
    await stream(conv, reply, historyOf(conv), lastView());
  }

  async function trimAndRetry(conv, reply) {
    const point = trimPoint(conv, reply);
    if (point === null || controller) return;
    conv.sentFrom = point;
    delete reply.contextFull;
    delete reply.error;
    renderMessages();
    if (reply.content) await continueReply(conv, reply);
    else await stream(conv, reply, historyOf(conv, -1), lastView());
  }
  async function editLast(conv, reply) {
    const i = conv.messages.indexOf(reply);
    const user = conv.messages[i - 1];
    conv.messages.splice(i - 1, 2); // the message and its reply; the text goes back to the box
    conv.sentFrom = Math.min(conv.sentFrom || 0, conv.messages.length);
    // the box and the view change at once; the stored copy follows
    renderMessages();
    $("prompt").value = user ? window.kvmemViews.textOf(user.content) : "";
    $("prompt").focus();
    await putConversation(conv);
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

  // ---- Export and import
  async function importFile(file) {
    let imported;
    try {
      imported = transfer.parse(await file.text());
    } catch (err) {
      banner(`Import failed: ${file.name}: ${err.message}`);
      return;
    }
    banner("");
    for (const c of imported) {
      await putConversation(c);
      conversations = conversations.filter((o) => o.id !== c.id).concat([c]);
    }
    if (imported.length) switchTo(byRecent(imported)[0].id);
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
      $("server-status").textContent = (await apiError(response)).message;
      return;
    }
    banner("");
    const props = await response.json();
    vision = Boolean(props.modalities && props.modalities.vision);
    $("attach-label").hidden = !vision;
    const kv = props.kvmem || {};
    server = { model: props.model_alias || "KVMem", n_ctx: props.n_ctx, kvmem: kv };
    $("model-name").textContent = server.model;
    $("server-status").textContent = `ctx ${props.n_ctx}` + (kv.enabled ? ` \u00b7 KVMem window ${kv.budget} + ${kv.gen_reserve}` : "");
  }

  // ---- Wiring
  async function init() {
    conversations = await allConversations();
    current = byRecent(conversations)[0] || null;
    renderList();
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
    $("export").onclick = () => transfer.download(byRecent(conversations), "kvmem-conversations.json");
    $("import").onchange = async (e) => {
      for (const file of e.target.files) await importFile(file);
      e.target.value = "";
    };
    $("toggle-sidebar").onclick = () => document.getElementById("app").classList.toggle("sidebar-open");
    $("open-settings").onclick = () => {
      fillSettingsForm();
      $("settings").showModal();
    };
    $("set-follow").onchange = () => {
      $("sampling-fields").disabled = $("set-follow").checked;
    };
    $("settings-form").onsubmit = async () => {
      saveSettingsForm();
      await loadProps();
      renderMessages();
    };
    await loadProps();
    renderMessages();
    document.body.dataset.ready = "1";
  }
  init();
})();
