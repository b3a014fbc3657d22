// Reading the server's answers: the events of a text/event-stream body, and the error
// object of a failed request (OpenAI envelope).
"use strict";

(() => {
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
      return body.error || { message: `HTTP ${response.status}` };
    } catch {
      return { message: `HTTP ${response.status}` };
    }
  }
  window.kvmemSse = { sseEvents, apiError };
})();
