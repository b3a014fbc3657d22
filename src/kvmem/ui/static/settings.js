// The page's settings and API key, kept in localStorage: they never leave this browser except
// as the Authorization header of this server's own API calls. The output cap (default 512)
// goes with every request; the sampling fields only when "follow server defaults" is off.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const KEY_STORE = "kvmem.apiKey";
  const SETTINGS_STORE = "kvmem.settings";
  const DEFAULT_CAP = 512;

  // A cap of null: no cap, the server's default.
  const NUMERIC = [
    ["set-budget", "reasoning_budget_tokens", parseInt],
    ["set-temperature", "temperature", parseFloat],
    ["set-top-p", "top_p", parseFloat],
    ["set-top-k", "top_k", parseInt],
    ["set-min-p", "min_p", parseFloat],
  ];
  function loadSettings() {
    const defaults = { follow: true, max_tokens: DEFAULT_CAP };
    try {
      return { ...defaults, ...JSON.parse(localStorage.getItem(SETTINGS_STORE) || "{}") };
    } catch {
      return defaults;
    }
  }
  let settings = loadSettings();
  const apiKey = () => localStorage.getItem(KEY_STORE) || "";
  const cap = () => (Number.isInteger(settings.max_tokens) && settings.max_tokens > 0 ? settings.max_tokens : null);

  function fillSettingsForm() {
    $("set-api-key").value = apiKey();
    $("set-max-tokens").value = cap() ?? "";
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
    const capText = $("set-max-tokens").value.trim();
    const next = {
      follow: $("set-follow").checked,
      thinking: $("set-thinking").value,
      effort: $("set-effort").value,
      max_tokens: capText === "" || Number.isNaN(parseInt(capText)) ? null : parseInt(capText),
    };
    for (const [id, name, parse] of NUMERIC) {
      const raw = $(id).value.trim();
      if (raw !== "" && !Number.isNaN(parse(raw))) next[name] = parse(raw);
    }
    settings = next;
    localStorage.setItem(SETTINGS_STORE, JSON.stringify(settings));
  }
  function requestOptions() {
    const out = cap() ? { max_tokens: cap() } : {};
    if (settings.follow !== false) return out;
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

  window.kvmemSettings = { cap, headers, requestOptions, fillSettingsForm, saveSettingsForm };
})();
