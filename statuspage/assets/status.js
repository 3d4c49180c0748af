// policyd status page: replaces <main> with each "status" event of the
// server's event stream, and says whether the stream is up. Nothing else.
"use strict";
(function () {
  const badge = document.getElementById("live");
  const say = (text, cls) => {
    badge.textContent = text;
    badge.className = "badge " + cls;
  };
  const events = new EventSource("status/events");
  events.addEventListener("status", (e) => {
    const tpl = document.createElement("template");
    tpl.innerHTML = e.data;
    const fresh = tpl.content.querySelector("main");
    const main = document.getElementById("status");
    if (fresh && main) main.replaceWith(fresh);
    say("live", "live");
  });
  // The browser reconnects by itself, after the delay the server asked for.
  events.onerror = () => say("reconnecting", "down");
})();
