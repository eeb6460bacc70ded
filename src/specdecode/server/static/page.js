// The server's page: a chat with the served model whose replies show how each token came (Figure 1
// of Leviathan et al. 2023, from the `trace` extension of the stream), the last reply's target calls
// over time and its acceptance, and a live panel over /metrics. No libraries: fetch, the DOM and SVG.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const KEY = "specdecode.apiKey"; // sessionStorage only: gone when the tab closes
  const SVG = "http://www.w3.org/2000/svg";
  // messages: the conversation so far; epoch: which conversation (New conversation starts another)
  const state = { model: null, messages: [], epoch: 0, busy: false, controller: null, live: [], last: null };

  // -- the API key and requests -----------------------------------------------------------------

  function headers(json) {
    const out = json ? { "Content-Type": "application/json" } : {};
    const key = sessionStorage.getItem(KEY);
    if (key) out.Authorization = "Bearer " + key;
    return out;
  }

  async function problem(response, ask = true) {
    // OpenAI's error body -> "401: message"; a 401 brings up the key's field (`ask`)
    let message = response.statusText;
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) message = body.error.message;
    } catch (_) { /* not JSON */ }
    if (response.status === 401 && ask) askForKey("This server needs an API key.");
    return response.status + ": " + message;
  }

  function askForKey(note) {
    $("key-form").hidden = false;
    $("key-note").textContent = note || "";
  }

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (key) sessionStorage.setItem(KEY, key); else sessionStorage.removeItem(KEY);
    $("api-key").value = "";
    $("key-note").textContent = key ? "Key kept for this tab." : "Key cleared.";
    connect();
  });

  async function connect() {
    try {
      const health = await (await fetch("/health")).json(); // open, with or without a key
      state.model = health.model;
      $("model").textContent = "model " + health.model + " · drafts: " + health.drafts.join(", ");
      fillDrafts(health.drafts);
      if ($("gamma").options.length === 2) fillGamma(8); // the server's own range once the API answers
    } catch (err) {
      $("model").textContent = "the server does not answer: " + err;
      return;
    }
    const models = await fetch("/v1/models", { headers: headers(false) });
    if (models.status === 401) {
      askForKey(sessionStorage.getItem(KEY) ? "The key was refused." : "This server needs an API key.");
      return;
    }
    if (sessionStorage.getItem(KEY)) $("key-form").hidden = false; // to change it
    try { // the gamma a request may ask for, from the server's own description
      const schema = await (await fetch("/openapi.json", { headers: headers(false) })).json();
      const body = schema.paths["/v1/chat/completions"].post.requestBody.content["application/json"].schema;
      const gamma = body.properties.specdecode.anyOf[0].properties.gamma.anyOf[0].anyOf[0];
      fillGamma(gamma.maximum);
    } catch (_) {
      fillGamma(8);
    }
  }

  function fillDrafts(drafts) {
    const select = $("draft"), chosen = select.value;
    while (select.options.length > 1) select.remove(1);
    for (const name of drafts) select.add(new Option(name, name));
    if (drafts.includes(chosen)) select.value = chosen;
  }

  function fillGamma(most) {
    const select = $("gamma"), chosen = select.value;
    while (select.options.length > 2) select.remove(2);
    for (let g = 0; g <= most; g++) select.add(new Option(String(g), String(g)));
    if ([...select.options].some((o) => o.value === chosen)) select.value = chosen;
  }

  // -- the request from the settings --------------------------------------------------------------

  function number(id, integer) {
    const text = $(id).value.trim();
    if (text === "") return undefined;
    const value = Number(text);
    if (!Number.isFinite(value) || (integer && !Number.isInteger(value))) throw new Error(id + " is not a number");
    return value;
  }

  function unescape(text) {
    return text.replace(/\\n/g, "\n").replace(/\\t/g, "\t");
  }

  function requestBody() {
    const body = { model: state.model, messages: [], stream: true, stream_options: { include_usage: true } };
    const system = $("system").value;
    if (system.trim()) body.messages.push({ role: "system", content: system });
    body.messages.push(...state.messages);
    const fields = { temperature: number("temperature"), top_p: number("top-p"),
                     max_tokens: number("max-tokens", true), seed: number("seed", true) };
    for (const [name, value] of Object.entries(fields)) if (value !== undefined) body[name] = value;
    const stop = $("stop-strings").value.split("\n").filter((s) => s !== "").map(unescape);
    if (stop.length) body.stop = stop;
    const ext = { trace: true };
    if ($("draft").value) ext.draft = $("draft").value;
    const gamma = $("gamma").value;
    if (gamma) ext.gamma = gamma === "auto" ? "auto" : Number(gamma);
    const lenience = number("lenience");
    if (lenience !== undefined) ext.lenience = lenience;
    body.specdecode = ext;
    const format = $("format").value;
    if (format === "json_object") body.response_format = { type: "json_object" };
    if (format === "json_schema") {
      body.response_format = { type: "json_schema", json_schema: { name: "reply", schema: json("schema") } };
    }
    if ($("tools").value.trim()) {
      body.tools = json("tools");
      body.tool_choice = $("tool-choice").value;
    }
    return body;
  }

  function json(id) {
    try {
      return JSON.parse($(id).value);
    } catch (err) {
      throw new Error("the " + id + " field is not JSON: " + err.message);
    }
  }

  $("format").addEventListener("change", () => { $("schema").disabled = $("format").value !== "json_schema"; });

  // -- the conversation ---------------------------------------------------------------------------

  function turn(role, text) {
    const div = document.createElement("div");
    div.className = "turn " + role;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? "you" : state.model || "assistant";
    div.append(who);
    const body = document.createElement("span");
    body.className = "content";
    if (text) body.textContent = text;
    div.append(body);
    $("conversation").append(div);
    $("conversation").scrollTop = $("conversation").scrollHeight;
    return div;
  }

  function setBusy(busy) {
    state.busy = busy;
    $("send").disabled = busy;
    $("stop").disabled = !busy;
  }

  function status(text, bad) {
    $("status").textContent = text;
    $("status").classList.toggle("problem", Boolean(bad));
  }

  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });

  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    if (!state.busy && $("prompt").value.trim()) send($("prompt").value);
  });

  $("stop").addEventListener("click", () => state.controller && state.controller.abort());

  $("clear").addEventListener("click", () => {
    if (state.controller) state.controller.abort();
    state.epoch += 1;
    state.messages = [];
    $("conversation").replaceChildren();
    status("");
  });

  $("show-rejected").addEventListener("change", (event) => {
    $("conversation").classList.toggle("show-rejected", event.target.checked);
  });

  async function send(text) {
    let body;
    state.messages.push({ role: "user", content: text });
    try {
      body = requestBody();
    } catch (err) {
      state.messages.pop();
      status(err.message, true);
      return;
    }
    $("prompt").value = "";
    const mine = turn("user", text);
    const reply = turn("assistant");
    reply.dataset.state = "streaming";
    const view = new Reply(reply);
    setBusy(true);
    status("generating…");
    state.controller = new AbortController();
    const began = performance.now(), epoch = state.epoch;
    const messages = state.messages; // this conversation's, even if a new one starts meanwhile
    try {
      const response = await fetch("/v1/chat/completions", { method: "POST", headers: headers(true),
                                                              body: JSON.stringify(body), signal: state.controller.signal });
      if (!response.ok) throw new Error(await problem(response));
      await readEvents(response, (chunk) => view.add(chunk));
      if (view.error) throw new Error(view.error);
      view.seconds = (performance.now() - began) / 1000;
      reply.dataset.state = "done";
      messages.push({ role: "assistant", content: view.text });
      state.last = view;
      showLast(view);
      status(summary(view));
    } catch (err) {
      const aborted = err.name === "AbortError";
      reply.dataset.state = aborted ? "stopped" : "error";
      if (epoch !== state.epoch) return; // New conversation: this one is gone (`finally` still runs)
      if (aborted && view.text) { // what came before Stop stays in the conversation
        messages.push({ role: "assistant", content: view.text });
        status("stopped");
      } else {
        messages.pop(); // the user's turn did not get an answer: it goes back to the box
        mine.classList.add("error");
        reply.classList.add("error");
        const note = document.createElement("span");
        note.className = "problem";
        note.textContent = aborted ? "stopped" : err.message;
        reply.append(note);
        if (!$("prompt").value) $("prompt").value = text;
        status(aborted ? "stopped" : err.message, !aborted);
      }
    } finally {
      state.controller = null;
      setBusy(false);
      $("prompt").focus();
    }
  }

  async function readEvents(response, onChunk) {
    // server-sent events: "data: {json}" blocks separated by a blank line, then "data: [DONE]"
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      buffer += decoder.decode(value || new Uint8Array(), { stream: !done });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
        if (data === "[DONE]") return;
        if (data) onChunk(JSON.parse(data));
      }
      if (done) return;
    }
  }

  // One streamed reply: its tokens as Figure 1, its trace and its statistics.
  class Reply {
    constructor(div) {
      this.content = div.querySelector(".content");
      this.div = div;
      this.text = "";
      this.calls = [];
      this.usage = null;
      this.timings = null;
      this.error = null;
    }

    add(chunk) {
      if (chunk.error) {
        this.error = chunk.error.message;
        return;
      }
      if (chunk.usage) this.usage = chunk.usage;
      if (chunk.timings) this.timings = chunk.timings;
      const trace = chunk.specdecode && chunk.specdecode.trace;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (trace) for (const call of trace) this.addCall(call);
      else if (delta && delta.content) this.plain(delta.content);
      if (delta && delta.tool_calls) {
        for (const call of delta.tool_calls) {
          const box = document.createElement("span");
          box.className = "tool-call";
          box.textContent = "calls " + call.function.name + "(" + call.function.arguments + ")";
          this.div.append(box);
        }
      }
      const log = $("conversation");
      log.scrollTop = log.scrollHeight;
    }

    plain(text) {
      this.text += text;
      this.content.append(document.createTextNode(text));
    }

    addCall(call) {
      this.calls.push(call);
      const group = document.createElement("span");
      group.className = "call";
      group.dataset.call = call.call;
      const kind = call.proposed === 0 ? "plain" : call.accepted.length >= call.proposed ? "bonus" : "correction";
      for (const piece of call.accepted) group.append(token("tok accepted", piece));
      if (call.rejected) group.append(token("rejected", call.rejected));
      group.append(token("tok target " + kind, call.target));
      group.title = describe(call, kind);
      this.text += call.accepted.join("") + call.target;
      this.content.append(group);
    }
  }

  function token(className, text) {
    const span = document.createElement("span");
    span.className = className;
    span.textContent = text;
    return span;
  }

  function describe(call, kind) {
    const made = call.accepted.length + 1;
    const what = { plain: "no draft: the target's own token",
                   bonus: "all " + call.proposed + " drafted kept, then a bonus token",
                   correction: call.accepted.length + " of " + call.proposed + " drafted kept, then a correction" }[kind];
    return "target call " + call.call + ": " + what + " (" + made + " token" + (made === 1 ? "" : "s") +
           "; draft " + call.draft_ms.toFixed(1) + " ms, target " + call.target_ms.toFixed(1) + " ms)";
  }

  let hovered = null;
  function showCall(event) {
    const group = event.target.closest && event.target.closest(".call");
    if (group === hovered) return;
    if (hovered) hovered.classList.remove("hovered");
    hovered = group;
    if (group) {
      group.classList.add("hovered");
      $("call-info").textContent = group.title;
    }
  }
  $("conversation").addEventListener("mouseover", showCall);

  // -- the last reply's numbers and Figure 2 ------------------------------------------------------

  function fmt(value, digits) {
    if (value === null || value === undefined || Number.isNaN(value)) return "n/a";
    return typeof value === "number" ? value.toFixed(digits === undefined ? 2 : digits) : String(value);
  }

  function tokensPerSecond(view) {
    const t = view.timings;
    if (t && t.predicted_per_second) return t.predicted_per_second;
    const n = view.usage ? view.usage.completion_tokens : 0;
    return view.seconds ? n / view.seconds : null;
  }

  function summary(view) {
    const spec = view.usage && view.usage.speculative;
    if (!spec) return "done";
    return spec.accepted_tokens + " accepted of " + spec.draft_tokens + " drafted, " + spec.target_calls +
           " target calls, " + fmt(tokensPerSecond(view), 1) + " tokens/s";
  }

  function showLast(view) {
    $("last-empty").hidden = true;
    const spec = (view.usage && view.usage.speculative) || {};
    const draftMs = view.calls.reduce((s, c) => s + c.draft_ms, 0);
    const targetMs = view.calls.reduce((s, c) => s + c.target_ms, 0);
    const rows = [
      ["tokens", "completion_tokens", view.usage ? view.usage.completion_tokens : null, 0],
      ["target calls", "target_calls", spec.target_calls, 0],
      ["tokens per call", "tokens_per_call", spec.tokens_per_call, 2],
      ["draft tokens", "draft_tokens", spec.draft_tokens, 0],
      ["accepted", "accepted_tokens", spec.accepted_tokens, 0],
      ["acceptance rate", "acceptance_rate", spec.acceptance_rate, 3],
      ["alpha (E[min(p, q)])", "alpha", spec.alpha, 3],
      ["draft, gamma", "draft", spec.draft === undefined ? null : spec.draft + ", " + spec.gamma],
      ["tokens/s", "tokens_per_second", tokensPerSecond(view), 1],
      ["time drafting", "draft_share", draftMs + targetMs ? draftMs / (draftMs + targetMs) : null, 3],
    ];
    const dl = $("numbers");
    dl.replaceChildren();
    for (const [label, key, value, digits] of rows) {
      const dt = document.createElement("dt");
      dt.textContent = label;
      const dd = document.createElement("dd");
      dd.dataset.stat = key;
      dd.textContent = fmt(value, digits);
      dl.append(dt, dd);
    }
    drawTimeline(view.calls);
    drawPerCall(view.calls);
    drawPerPosition(spec.acceptance_per_depth || depths(view.calls));
  }

  function depths(calls) {
    const drafted = calls.filter((c) => c.proposed > 0);
    const most = Math.max(0, ...drafted.map((c) => c.proposed));
    return Array.from({ length: most }, (_, i) =>
      drafted.length ? drafted.filter((c) => c.accepted.length > i).length / drafted.length : 0);
  }

  function el(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) {
      const title = document.createElementNS(SVG, "title");
      title.textContent = text;
      node.append(title);
    }
    return node;
  }

  function width(svg) { // the chart's own width in pixels: its text stays legible in a narrow column
    return Math.max(240, Math.round(svg.getBoundingClientRect().width) || 600);
  }

  function label(x, y, text, anchor) {
    const node = el("text", { x, y, "text-anchor": anchor || "start" });
    node.textContent = text;
    return node;
  }

  function drawTimeline(calls) {
    const svg = $("timeline"), W = width(svg), H = 84, left = 44, right = 8;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.replaceChildren();
    const total = calls.reduce((s, c) => s + c.draft_ms + c.target_ms, 0) || 1;
    const scale = (W - left - right) / total;
    svg.append(label(0, 24, "draft"), label(0, 52, "target"), el("line", { class: "axis", x1: left, x2: W - right, y1: 64, y2: 64 }));
    let t = 0;
    for (const c of calls) {
      const made = c.accepted.length + 1;
      if (c.draft_ms > 0) {
        svg.append(el("rect", { class: "draft", x: left + t * scale, y: 12, width: Math.max(c.draft_ms * scale, 0.5), height: 16 },
                      "call " + c.call + ": drafting " + c.draft_ms.toFixed(2) + " ms, " + c.proposed + " proposed"));
      }
      t += c.draft_ms;
      const height = Math.min(4 + 4 * made, 28);
      svg.append(el("rect", { class: "target", x: left + t * scale, y: 62 - height, width: Math.max(c.target_ms * scale - 0.5, 0.5),
                              height }, "call " + c.call + ": target " + c.target_ms.toFixed(2) + " ms, " + made + " tokens"));
      t += c.target_ms;
    }
    svg.append(label(left, 78, "0 ms"), label(W - right, 78, total.toFixed(0) + " ms", "end"));
  }

  function drawPerCall(calls) {
    const svg = $("per-call"), W = width(svg), H = 100, left = 24, bottom = 16;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.replaceChildren();
    const defs = el("defs");
    const hatch = el("pattern", { id: "hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" });
    hatch.append(el("line", { class: "hatch-line", x1: 0, y1: 0, x2: 0, y2: 6 }));
    defs.append(hatch);
    svg.append(defs);
    const most = Math.max(1, ...calls.map((c) => c.accepted.length + 1 + (c.proposed - c.accepted.length > 0 ? c.proposed - c.accepted.length : 0)));
    const unit = (H - bottom - 6) / most;
    const bar = Math.min(16, (W - left) / Math.max(calls.length, 1));
    calls.forEach((c, i) => {
      const x = left + i * bar, rejected = Math.max(c.proposed - c.accepted.length, 0);
      let y = H - bottom;
      const tip = "call " + c.call + ": " + c.accepted.length + " accepted, 1 of the target's, " + rejected + " rejected";
      for (const [cls, n] of [["accepted", c.accepted.length], ["target", 1], ["rejected-bar", rejected]]) {
        if (!n) continue;
        y -= n * unit;
        svg.append(el("rect", { class: cls, x, y, width: Math.max(bar - 1, 1), height: n * unit }, tip));
      }
    });
    svg.append(el("line", { class: "axis", x1: left, x2: W, y1: H - bottom, y2: H - bottom }),
               label(0, H - bottom, "0"), label(0, 12, String(most)),
               label(left, H - 3, "call 1"));
    if (calls.length > 1) svg.append(label(left + calls.length * bar, H - 3, "call " + calls.length, "end"));
  }

  function drawPerPosition(rates) {
    const svg = $("per-position"), W = width(svg), H = 90, left = 30, bottom = 16;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.replaceChildren();
    const bar = Math.min(40, (W - left) / Math.max(rates.length, 1));
    rates.forEach((r, i) => {
      const h = r * (H - bottom - 14);
      svg.append(el("rect", { class: "accepted", x: left + i * bar, y: H - bottom - h, width: bar - 3, height: h },
                    "position " + (i + 1) + ": " + (100 * r).toFixed(0) + "% of drafts reached it"),
                 label(left + i * bar + (bar - 3) / 2, H - 3, String(i + 1), "middle"),
                 label(left + i * bar + (bar - 3) / 2, H - bottom - h - 2, (100 * r).toFixed(0) + "%", "middle"));
    });
    svg.append(el("line", { class: "axis", x1: left, x2: W, y1: H - bottom, y2: H - bottom }), label(0, H - bottom, "0%"));
    if (!rates.length) svg.append(label(left, 30, "nothing drafted"));
  }

  // -- the live panel over /metrics ---------------------------------------------------------------

  function parseMetrics(text) {
    // Prometheus' text exposition -> name -> summed value over its label sets
    const out = {};
    for (const line of text.split("\n")) {
      if (!line || line.startsWith("#")) continue;
      const match = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/);
      if (match) out[match[1]] = (out[match[1]] || 0) + Number(match[3]);
    }
    return out;
  }

  async function poll() {
    if (!$("live-on").checked || document.hidden) return;
    let response;
    try {
      response = await fetch("/metrics", { headers: headers(false) });
    } catch (_) {
      return;
    }
    const numbers = $("live-numbers");
    if (!response.ok) {
      numbers.replaceChildren(Object.assign(document.createElement("dd"), { textContent: await problem(response, false) }));
      return;
    }
    const m = parseMetrics(await response.text());
    const now = performance.now() / 1000, P = "specdecode_";
    const sample = { t: now, tokens: m[P + "generation_tokens_total"] || 0, drafted: m[P + "spec_decode_num_draft_tokens_total"] || 0,
                     accepted: m[P + "spec_decode_num_accepted_tokens_total"] || 0, calls: m[P + "target_calls_total"] || 0,
                     inFlight: m[P + "requests_in_flight"] || 0, forwards: m[P + "batch_size_count"] || 0,
                     sharing: m[P + "batch_size_sum"] || 0 };
    const before = state.live[state.live.length - 1];
    if (before) {
      const dt = sample.t - before.t;
      sample.rate = dt > 0 ? (sample.tokens - before.tokens) / dt : 0;
      const drafted = sample.drafted - before.drafted;
      sample.acceptance = drafted > 0 ? (sample.accepted - before.accepted) / drafted : null;
      const forwards = sample.forwards - before.forwards; // requests per batched forward: those running
      sample.running = forwards > 0 ? (sample.sharing - before.sharing) / forwards : 0;
    }
    state.live.push(sample);
    while (state.live.length > 61) state.live.shift();
    const rows = [["tokens/s now", fmt(sample.rate, 1)], ["requests in flight (running + waiting)", String(sample.inFlight)],
                  ["running (requests per forward, mean)", fmt(sample.running, 1)],
                  ["acceptance now", fmt(sample.acceptance, 3)],
                  ["acceptance since start", fmt(sample.drafted ? sample.accepted / sample.drafted : null, 3)],
                  ["tokens generated", String(sample.tokens)], ["target calls", String(sample.calls)]];
    numbers.replaceChildren();
    for (const [k, v] of rows) {
      numbers.append(Object.assign(document.createElement("dt"), { textContent: k }),
                     Object.assign(document.createElement("dd"), { textContent: v }));
    }
    drawLive();
  }

  function drawLive() {
    const svg = $("live-chart"), W = width(svg), H = 90, left = 34, bottom = 4;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.replaceChildren();
    const samples = state.live.filter((s) => s.rate !== undefined);
    if (!samples.length) return;
    const top = Math.max(1, ...samples.map((s) => s.rate));
    const x = (i) => left + (W - left) * (i + 61 - samples.length) / 60;
    const y = (v) => H - bottom - v * (H - bottom - 10);
    const rate = samples.map((s, i) => x(i) + "," + y(s.rate / top)).join(" ");
    const acceptance = samples.map((s, i) => s.acceptance === null ? null : x(i) + "," + y(s.acceptance)).filter(Boolean).join(" ");
    svg.append(el("line", { class: "axis", x1: left, x2: W, y1: H - bottom, y2: H - bottom }),
               el("polyline", { class: "rate", points: rate }, "tokens/s"),
               label(0, 12, top.toFixed(0) + "/s"), label(0, H - bottom, "0"));
    if (acceptance) svg.append(el("polyline", { class: "acceptance", points: acceptance }, "acceptance (0 to 1)"));
  }

  connect();
  poll();
  setInterval(poll, 2000);
})();
