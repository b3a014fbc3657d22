// Conversations: their IndexedDB store, and what of one is sent (the messages after a trim,
// without failed empty replies) or trimmed when it no longer fits the context.
"use strict";

(() => {
  // ---- IndexedDB history: one record per conversation {id, title, messages, updated,
  // sentFrom (the first message still sent after a trim)}.
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
  function newConversation() {
    return { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 7)}`, title: "New chat", messages: [], updated: Date.now() };
  }
  const byRecent = (list) => [...list].sort((a, b) => b.updated - a.updated);
  // What is sent: the messages after a trim, without failed empty replies.
  function historyOf(conv, upTo) {
    return conv.messages
      .slice(conv.sentFrom || 0, upTo)
      .filter((m) => m.role !== "assistant" || m.content || !(m.error || m.stopped))
      .map((m) => ({ role: m.role, content: m.content }));
  }

  // Trimming: the oldest turns stop being sent, enough of them (by characters, in the
  // proportion the server's token count asks for) to fill half the context, leaving room for more turns.
  function trimPoint(conv, reply) {
    if (!conv || !reply.contextFull) return null;
    const end = conv.messages.indexOf(reply);
    const from = conv.sentFrom || 0;
    const lastUser = conv.messages.map((m) => m.role).lastIndexOf("user", end);
    if (lastUser <= from) return null;
    const chars = (m) => JSON.stringify(m.content).length;
    const sent = conv.messages.slice(from, end + 1);
    const total = sent.reduce((n, m) => n + chars(m), 0);
    const { n_prompt_tokens: asked, n_ctx: ctx } = reply.contextFull;
    const keep = total * Math.min(1, (0.5 * ctx) / Math.max(asked, 1)); // half: room to go on
    let kept = 0;
    let start = end;
    while (start > from && kept + chars(conv.messages[start - 1]) <= keep) kept += chars(conv.messages[--start]);
    while (start < lastUser && conv.messages[start].role !== "user") start++; // a turn starts with the user
    return Math.min(Math.max(start, from + 1), lastUser);
  }
  window.kvmemConversations = {
    allConversations, putConversation, deleteConversation, newConversation, byRecent, historyOf, trimPoint,
  };
})();
