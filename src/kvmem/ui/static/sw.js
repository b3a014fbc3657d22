// A service worker that removes itself. The chat page registers no service worker (it is
// served by a local server and works online only), but another page served earlier at this
// origin may have: llama-server's web UI registers /sw.js, often on this same port 8080, and
// its worker keeps serving that UI from its caches. The browser checks /sw.js for updates;
// this version then takes over, deletes the caches it finds (Cache Storage only: the chat's
// conversations are in IndexedDB and its settings in localStorage, both untouched),
// unregisters itself and reloads the open tabs, which then load this server's page.
self.addEventListener("install", () => self.skipWaiting());

self.addEventListener("activate", (event) => {
  event.waitUntil((async () => {
    for (const key of await caches.keys()) await caches.delete(key);
    await self.registration.unregister();
    for (const client of await self.clients.matchAll({ type: "window" })) {
      client.navigate(client.url);
    }
  })());
});
