// Markdown for the chat page: replies and user messages, sanitized, with highlighted code
// blocks that carry a language label and a Copy button (added after sanitizing, so model
// output itself can never produce a button).
"use strict";

(() => {
  const { DOMPurify, hljs, Marked } = window.kvmemVendor;

  const escapeHtml = (s) =>
    s.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

  function highlighted(text, lang) {
    const language = (lang || "").trim().split(/\s+/)[0];
    if (language && hljs.getLanguage(language)) {
      return { html: hljs.highlight(text, { language, ignoreIllegals: true }).value, label: language };
    }
    const auto = hljs.highlightAuto(text);
    return { html: auto.value, label: language || auto.language || "text" };
  }

  const renderer = {
    html({ text }) {
      return escapeHtml(text); // raw HTML in a message is shown as text
    },
    code({ text, lang }) {
      const { html, label } = highlighted(text, lang);
      const explicit = (lang || "").trim().split(/\s+/)[0];
      const cls = explicit ? ` language-${escapeHtml(explicit)}` : "";
      return `<pre><code class="hljs${cls}" data-lang="${escapeHtml(label)}">${html}</code></pre>\n`;
    },
  };
  const replies = new Marked({ gfm: true, renderer });
  const typed = new Marked({ gfm: true, breaks: true, renderer }); // a user's line breaks stay

  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A") {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });
  const PURIFY = {
    FORBID_TAGS: ["style", "form", "input", "button", "iframe", "object", "embed"],
    FORBID_ATTR: ["style"],
  };

  function render(text, { user = false } = {}) {
    return DOMPurify.sanitize((user ? typed : replies).parse(text || ""), PURIFY).trim();
  }

  // Copy to the clipboard: the async API where the page is a secure context (localhost,
  // https), else the older selection-based command (a plain-http LAN address).
  async function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return;
    }
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.append(area);
    area.select();
    document.execCommand("copy");
    area.remove();
  }

  function codeHeader(code) {
    const head = document.createElement("div");
    head.className = "code-head";
    const label = document.createElement("span");
    label.className = "code-lang";
    label.textContent = code.dataset.lang || "text";
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "copy";
    copy.textContent = "Copy";
    copy.onclick = async () => {
      try {
        await copyText(code.textContent);
        copy.textContent = "Copied";
      } catch {
        copy.textContent = "Copy failed";
      }
      setTimeout(() => (copy.textContent = "Copy"), 1500);
    };
    head.append(label, copy);
    return head;
  }

  // Puts `html` into `el` and gives each code block its label and Copy button.
  function fill(el, html) {
    el.innerHTML = html;
    for (const code of el.querySelectorAll("pre > code")) code.parentElement.before(codeHeader(code));
  }

  window.kvmemMarkdown = { render, fill, escapeHtml };
})();
