// Export and import of conversations as JSON. The file holds
// {"format": "kvmem-chat", "version": 1, "conversations": [...]}, each conversation as the
// page keeps it ({id, title, updated, messages: [{role, content, ...}]}). A bare array of
// conversations is accepted too.
"use strict";

(() => {
  const FORMAT = "kvmem-chat";
  const ROLES = new Set(["system", "user", "assistant"]);

  function exportText(conversations) {
    return JSON.stringify({ format: FORMAT, version: 1, conversations }, null, 2);
  }

  function download(conversations, filename) {
    const blob = new Blob([exportText(conversations)], { type: "application/json" });
    const url = URL.createObjectURL(blob);
    const a = document.createElement("a");
    a.href = url;
    a.download = filename;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  function validContent(content) {
    if (typeof content === "string") return true;
    return Array.isArray(content) && content.every((p) => p && typeof p.type === "string");
  }

  function checkConversation(c, index) {
    const where = `conversation ${index + 1}`;
    if (!c || typeof c !== "object") throw new Error(`${where} is not an object`);
    if (!Array.isArray(c.messages)) throw new Error(`${where} has no messages list`);
    c.messages.forEach((m, i) => {
      if (!m || !ROLES.has(m.role) || !validContent(m.content)) {
        throw new Error(`${where}, message ${i + 1}: needs a role (system, user, assistant) and content`);
      }
    });
    return {
      ...c,
      id: typeof c.id === "string" && c.id ? c.id : `c${Date.now().toString(36)}${index}`,
      title: typeof c.title === "string" && c.title ? c.title : "Imported chat",
      updated: Number.isFinite(c.updated) ? c.updated : Date.now(),
    };
  }

  // The conversations in an exported file's text; an Error says what is wrong.
  function parse(text) {
    let data;
    try {
      data = JSON.parse(text);
    } catch {
      throw new Error("not a JSON file");
    }
    const list = Array.isArray(data) ? data : data && data.format === FORMAT ? data.conversations : null;
    if (!Array.isArray(list)) throw new Error(`not a ${FORMAT} export (no conversations list)`);
    return list.map(checkConversation);
  }

  window.kvmemTransfer = { exportText, download, parse };
})();
