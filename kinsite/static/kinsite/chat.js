// The session chat, streamed: the form posts to its data-stream-url, which answers the turn as
// server-sent events (sessions_app.views.sessions.session_post_stream). EventSource cannot POST, so this
// reads the fetch body and parses the events itself. The user's message shows at once, the
// reply grows with each `delta`, tool calls and results show as they run, and `done` (or an
// `error` with the failed turn rendered: its error, what to check and Retry) replaces both with
// the entries the server rendered. Then `chat-posted` is fired on <body>: the prompt
// preview and the session panel refresh themselves (htmx triggers on the page).
// Without this script the form posts as a plain form and the page reloads.
//
// Everything the server or the model wrote goes in as text (textContent), except the `html`
// of `message`, `done` and `error`, which the server rendered from its escaping templates.
(function () {
  "use strict";

  const form = document.getElementById("chat-form");
  const conversation = document.getElementById("conversation");
  if (!form || !conversation || !form.dataset.streamUrl || !window.fetch || !window.TextDecoder) {
    return;
  }
  let streaming = false;
  // A touch screen without a mouse (a phone): Enter adds a line there.
  const touchOnly = Boolean(window.matchMedia && window.matchMedia("(pointer: coarse)").matches &&
                            !window.matchMedia("(any-pointer: fine)").matches);
  const keysHint = form.querySelector(".chat-keys");
  if (keysHint && touchOnly) {
    keysHint.textContent = "Enter adds a line; Send sends";
  }

  form.classList.add("is-live");
  form.addEventListener("submit", function (event) {
    event.preventDefault();
    send();
  });
  form.addEventListener("keydown", function (event) {
    if (event.target.id !== "chat-content" || event.key !== "Enter") {
      return;
    }
    // An IME composing a word uses Enter to confirm it, not to send.
    if (event.isComposing || event.keyCode === 229) {
      return;
    }
    if (event.shiftKey && !event.ctrlKey && !event.metaKey) {
      return; // Shift+Enter: a new line, as the textarea does
    }
    if (touchOnly && !event.ctrlKey && !event.metaKey) {
      return; // a phone keyboard has no Shift+Enter: Enter makes the new line, the button sends
    }
    event.preventDefault();
    if (streaming) {
      return;
    }
    if (form.requestSubmit) {
      form.requestSubmit(); // the browser's checks first (an empty box does not send)
    } else {
      form.dispatchEvent(new Event("submit", {cancelable: true}));
    }
  });

  function field(id) {
    // Looked up each time: an htmx swap may have replaced the form's fields.
    return document.getElementById(id);
  }

  async function send() {
    if (streaming) {
      return;
    }
    const box = field("chat-content");
    const content = box.value;
    const body = new URLSearchParams(new FormData(form));
    const csrf = form.querySelector("input[name=csrfmiddlewaretoken]");
    const sender = (field("chat-sender") || {}).value || "";
    setStreaming(true);
    showError("");
    box.value = "";
    const pending = pendingEntries(content, sender);
    scrollToNewest();

    let response;
    try {
      response = await fetch(form.dataset.streamUrl, {
        method: "POST",
        body: body,
        credentials: "same-origin",
        headers: {"Accept": "text/event-stream", "X-CSRFToken": csrf ? csrf.value : ""},
      });
    } catch (error) {
      // Nothing came back: most likely nothing was stored, but a reload tells for sure.
      refused(pending, content, "The server could not be reached, so your message was probably not sent. " +
                                "Reload the page to check before sending it again.");
      return;
    }
    const type = response.headers.get("Content-Type") || "";
    if (!response.ok || !type.startsWith("text/event-stream")) {
      refused(pending, content, await refusal(response));
      return;
    }
    let ended = false;
    try {
      ended = await follow(response, pending);
    } catch (error) {
      ended = false;
    }
    if (!ended) {
      failed(pending, "The connection was lost before the reply ended. Your message is stored; " +
                      "reload the page to see the reply.");
    }
    setStreaming(false);
    document.body.dispatchEvent(new CustomEvent("chat-posted", {bubbles: true}));
  }

  // --- the stream -------------------------------------------------------------------------

  // Reads the events as they arrive; true once `done` or `error` came.
  async function follow(response, pending) {
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const chunk = await reader.read();
      if (chunk.done) {
        return false;
      }
      buffer += decoder.decode(chunk.value, {stream: true}).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = parseEvent(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
        if (event && handle(event, pending)) {
          reader.cancel().catch(function () {});
          return true;
        }
      }
    }
  }

  function parseEvent(block) {
    let name = "message";
    const data = [];
    for (const line of block.split("\n")) {
      if (line === "" || line.startsWith(":")) {
        continue; // a comment: the keep-alive
      }
      const colon = line.indexOf(":");
      const key = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) {
        value = value.slice(1);
      }
      if (key === "event") {
        name = value;
      } else if (key === "data") {
        data.push(value);
      }
    }
    if (!data.length) {
      return null;
    }
    try {
      return {name: name, data: JSON.parse(data.join("\n"))};
    } catch (error) {
      return null;
    }
  }

  // One event; true when it ends the stream.
  function handle(event, pending) {
    const data = event.data || {};
    if (event.name === "message") {
      pending.message = replaceWith([pending.message], data.html)[0] || pending.message;
    } else if (event.name === "delta") {
      pending.text.textContent += typeof data.text === "string" ? data.text : "";
      pending.reply.classList.remove("awaiting");
    } else if (event.name === "tool_call") {
      toolCall(pending, data);
    } else if (event.name === "tool_result") {
      toolResult(pending, data);
    } else if (event.name === "reset") {
      // The turn runs again from the start (its process stopped): what was shown of it goes.
      pending.text.textContent = "";
      if (pending.steps) {
        pending.steps.remove();
      }
      pending.steps = null;
      pending.byId = {};
      pending.reply.classList.add("awaiting");
    } else if (event.name === "done") {
      replaceWith([pending.message, pending.reply], data.html);
      scrollToNewest();
      return true;
    } else if (event.name === "error") {
      // The server's rendering of the failed turn (the error, what to check, Retry) if it sent one.
      if (!replaceWith([pending.message, pending.reply], data.html).length) {
        const error = data.error || {};
        failed(pending, typeof error.message === "string" ? error.message : "The turn failed.");
      }
      scrollToNewest();
      return true;
    }
    return false;
  }

  // --- the entries being streamed ---------------------------------------------------------

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) {
      node.className = className;
    }
    if (text !== undefined) {
      node.textContent = text;
    }
    return node;
  }

  // The user's message as typed and an empty reply, until the server's entries replace them.
  function pendingEntries(content, sender) {
    const message = element("li", "message role-user pending");
    const meta = element("div", "meta");
    meta.appendChild(element("span", "sender", sender || "You"));
    meta.appendChild(element("span", "platform", "Sending…"));
    message.appendChild(meta);
    message.appendChild(element("div", "content text", content));

    const reply = element("li", "message role-assistant streaming awaiting");
    reply.setAttribute("aria-live", "polite");
    reply.setAttribute("aria-busy", "true");
    const replyMeta = element("div", "meta");
    replyMeta.appendChild(element("span", "sender", form.dataset.kinName || "Kin"));
    replyMeta.appendChild(element("span", "platform", "Answering…"));
    reply.appendChild(replyMeta);
    const text = element("div", "content text streamed-text");
    reply.appendChild(text);

    conversation.appendChild(message);
    conversation.appendChild(reply);
    return {message: message, reply: reply, text: text, steps: null, byId: {}};
  }

  // Puts the server-rendered entries where `nodes` are; returns the new elements.
  function replaceWith(nodes, html) {
    if (typeof html !== "string") {
      return [];
    }
    const template = document.createElement("template");
    template.innerHTML = html;
    const added = Array.from(template.content.children);
    if (!added.length) {
      return [];
    }
    const anchor = nodes[0];
    for (const node of added) {
      anchor.parentNode.insertBefore(node, anchor);
    }
    for (const node of nodes) {
      node.remove();
    }
    if (window.htmx) {
      added.forEach(function (node) { window.htmx.process(node); });
    }
    return added;
  }

  // The tool steps as _tool_steps.html shows them, open while the turn runs.
  function toolSteps(pending) {
    if (!pending.steps) {
      const details = element("details", "tool-calls");
      details.open = true;
      details.appendChild(element("summary"));
      details.appendChild(element("ol"));
      pending.reply.insertBefore(details, pending.text.nextSibling);
      pending.steps = details;
    }
    return pending.steps;
  }

  function toolCall(pending, data) {
    const details = toolSteps(pending);
    const step = element("li", "tool-step");
    step.appendChild(element("code", "tool-name", String(data.name || "")));
    step.appendChild(element("span", "tool-label", "arguments"));
    step.appendChild(element("pre", "tool-arguments", prettyArguments(data.arguments)));
    step.appendChild(element("span", "tool-label", "result"));
    step.appendChild(element("p", "hint tool-running", "Running…"));
    details.querySelector("ol").appendChild(step);
    pending.byId[String(data.id)] = step;
    const names = Array.from(details.querySelectorAll(".tool-name"), function (node) { return node.textContent; });
    details.querySelector("summary").textContent =
      names.length + " tool call" + (names.length === 1 ? "" : "s") + ": " + names.join(", ");
    pending.reply.classList.remove("awaiting");
  }

  function toolResult(pending, data) {
    const step = pending.byId[String(data.id)];
    if (!step) {
      return;
    }
    const running = step.querySelector(".tool-running");
    const result = element("pre", "tool-result", String(data.content === undefined ? "" : data.content));
    if (running) {
      running.replaceWith(result);
    } else {
      step.appendChild(result);
    }
  }

  function prettyArguments(value) {
    if (typeof value !== "string") {
      return JSON.stringify(value, null, 2);
    }
    try {
      return JSON.stringify(JSON.parse(value), null, 2);
    } catch (error) {
      return value;
    }
  }

  // The turn failed after the message was stored: the message stays, with the error under
  // it (and the tool steps that ran, as a reload shows them); the unstored reply text goes.
  function failed(pending, message) {
    pending.message.classList.remove("pending");
    if (pending.steps) {
      pending.steps.open = false;
      pending.message.appendChild(pending.steps);
    }
    const note = element("p", "turn-error", message);
    note.setAttribute("role", "alert");
    pending.message.appendChild(note);
    pending.reply.remove();
    scrollToNewest();
  }

  // --- the form ---------------------------------------------------------------------------

  // The post was refused before anything was stored: nothing to show but why, and the text back.
  function refused(pending, content, message) {
    pending.message.remove();
    pending.reply.remove();
    const box = field("chat-content");
    if (box && box.value === "") {
      box.value = content;
    }
    showError(message);
    setStreaming(false);
  }

  async function refusal(response) {
    try {
      const body = await response.json();
      if (body && body.error && typeof body.error.message === "string" && body.error.message) {
        return body.error.message;
      }
    } catch (error) {
      // Not our JSON: a login page, a CSRF failure, a proxy's error page.
    }
    if (response.redirected) {
      return "Your message was not sent: you are logged out. Reload the page and log in again.";
    }
    if (response.status === 403) {
      return "Your message was not sent (403): reload the page (your login or its form may have expired).";
    }
    if (response.status === 429) {
      return "Your message was not sent: too many messages (429). Wait a moment and send it again.";
    }
    if (response.status >= 500) {
      // A proxy's timeout or error page: the server may still store and answer the message.
      return "The server did not answer properly (HTTP " + response.status + "): your message may still " +
             "have been stored. Reload the page to check before sending it again.";
    }
    return "Your message was not sent (HTTP " + response.status + "). Reload the page and try again.";
  }

  function showError(message) {
    const fields = field("chat-form-fields");
    if (!fields) {
      return;
    }
    fields.querySelectorAll(".errors").forEach(function (node) { node.remove(); });
    if (message) {
      const note = element("p", "errors chat-error", message);
      note.setAttribute("role", "alert");
      fields.insertBefore(note, fields.firstChild);
    }
  }

  function setStreaming(on) {
    streaming = on;
    form.classList.toggle("is-streaming", on);
    form.setAttribute("aria-busy", on ? "true" : "false");
    const button = form.querySelector("button[type=submit]");
    if (button) {
      button.disabled = on;
    }
  }

  function scrollToNewest() {
    const newest = conversation.lastElementChild;
    if (newest) {
      newest.scrollIntoView({block: "nearest"});
    }
  }
})();
