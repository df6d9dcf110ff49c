// posttrain run report: the trajectory viewer. Reads the JSON in #viewer-data and builds the
// page with DOM calls only; every text from the run goes through textContent (model output is
// untrusted and never becomes markup).
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("viewer-data").textContent);
  const root = document.getElementById("viewer-root");
  const LIST_LIMIT = 300;

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") node.className = v; else node.setAttribute(k, v);
    }
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }
  const fmt = (x) => (typeof x === "number" ? (Math.round(x * 1000) / 1000).toString() : "-");
  const outcome = (e) => (e.error ? "error" : e.correct ? "success" : "failure");

  if (!data.episodes.length) {
    root.append(el("p", { class: "note" }, "No episodes in this run directory."));
    return;
  }

  // ---------------------------------------------------------------- controls
  const sources = [...new Set(data.episodes.map((e) => e.source))];
  const source = el("select", { id: "f-source" }, ...sources.map((s) =>
    el("option", { value: s }, s === "train" ? "training (store)" : "held-out evaluations")));
  const step = el("select", { id: "f-step" });
  const task = el("input", { id: "f-task", type: "search", placeholder: "task id or question" });
  const result = el("select", { id: "f-outcome" }, ...["all", "success", "failure", "error"].map((o) =>
    el("option", { value: o }, o)));
  const rmin = el("input", { id: "f-rmin", type: "number", step: "any", placeholder: "min" });
  const rmax = el("input", { id: "f-rmax", type: "number", step: "any", placeholder: "max" });
  const sort = el("select", { id: "f-sort" },
    el("option", { value: "step" }, "step, task"), el("option", { value: "reward-desc" }, "reward, high first"),
    el("option", { value: "reward-asc" }, "reward, low first"));
  const showPrompt = el("input", { id: "f-prompt", type: "checkbox" });
  const label = (text, input) => el("label", {}, text, input);
  root.append(el("div", { class: "controls" }, label("episodes", source), label("step", step), label("task", task),
    label("outcome", result), label("reward from", rmin), label("to", rmax), label("sort", sort),
    label("show prompt tokens", showPrompt)));
  const count = el("p", { class: "note", id: "episode-count" });
  const list = el("div", { class: "episodes" });
  const detail = el("div", { class: "detail", id: "episode-detail" });
  root.append(count, el("div", { class: "browser" }, list, detail));

  function fillSteps() {
    const steps = [...new Set(data.episodes.filter((e) => e.source === source.value).map((e) => e.step))]
      .sort((a, b) => a - b);
    step.replaceChildren(el("option", { value: "all" }, "all"), ...steps.map((s) => el("option", { value: s }, s)));
  }

  function matching() {
    const needle = task.value.trim().toLowerCase();
    const lo = rmin.value === "" ? -Infinity : Number(rmin.value);
    const hi = rmax.value === "" ? Infinity : Number(rmax.value);
    const out = data.episodes.filter((e) => e.source === source.value
      && (step.value === "all" || String(e.step) === step.value)
      && (!needle || e.task.toLowerCase().includes(needle) || e.question.toLowerCase().includes(needle))
      && (result.value === "all" || outcome(e) === result.value)
      && e.reward >= lo && e.reward <= hi);
    if (sort.value === "reward-desc") out.sort((a, b) => b.reward - a.reward);
    if (sort.value === "reward-asc") out.sort((a, b) => a.reward - b.reward);
    return out;
  }

  // ---------------------------------------------------------------- list
  let shown = [];
  let selected = null;
  function renderList() {
    shown = matching();
    count.textContent = `${shown.length} episodes match` + (shown.length > LIST_LIMIT ? ` (first ${LIST_LIMIT} listed)` : "");
    const rows = shown.slice(0, LIST_LIMIT).map((e, i) => {
      const row = el("tr", { "data-index": i }, el("td", {}, e.step), el("td", { class: "mono" }, e.task),
        el("td", { class: "num" }, fmt(e.reward)), el("td", { class: outcome(e) === "success" ? "ok" : "fail" }, outcome(e)),
        el("td", { class: "num" }, e.turns.length));
      row.addEventListener("click", () => select(i));
      return row;
    });
    list.replaceChildren(el("table", { id: "episode-list" },
      el("thead", {}, el("tr", {}, ...["step", "task", "reward", "outcome", "turns"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...rows)));
    if (shown.length) select(0); else detail.replaceChildren(el("p", { class: "note" }, "No episode matches."));
  }

  // ---------------------------------------------------------------- one episode
  function tokenSpans(ids, mask, extraClass) {
    return ids.map((id, i) => el("span", { class: `tok m${mask ? mask[i] : "0"}${extraClass}`, title: `token ${id}` },
      data.vocab[id] !== undefined ? data.vocab[id] : `[${id}]`));
  }

  function turnCard(turn, i) {
    const info = turn.info || {};
    const badges = [];
    if (info.tool) badges.push(el("span", { class: "badge tool" }, `tool call: ${info.tool}`));
    if (info.malformed_call) badges.push(el("span", { class: "badge bad" }, "malformed call"));
    if (info.tool_error) badges.push(el("span", { class: "badge bad" }, "tool error"));
    const card = el("div", { class: "turn" }, el("div", { class: "label" }, `turn ${i + 1}`,
      el("span", { class: "badge" }, `step reward ${fmt(turn.reward)}`), ...badges),
      el("div", { class: "label" }, "agent"), el("pre", { class: "action" }, turn.action));
    if (turn.observation) card.append(el("div", { class: "label" }, "observation"), el("pre", { class: "observation" }, turn.observation));
    if (turn.screenshot) card.append(el("div", { class: "label" }, "screenshot after the action"),
      el("img", { class: "screenshot", src: turn.screenshot, loading: "lazy", alt: `screenshot of turn ${i + 1}` }));
    return card;
  }

  function select(i) {
    selected = i;
    for (const row of list.querySelectorAll("tr[data-index]")) row.classList.toggle("selected", Number(row.dataset.index) === i);
    const e = shown[i];
    const head = el("h3", {}, `${e.task}  (step ${e.step}, ${e.source === "train" ? "training" : "held-out"})`);
    const facts = el("p", {}, `reward ${fmt(e.reward)} · `, el("span", { class: outcome(e) === "success" ? "ok" : "fail" }, outcome(e)),
      ` · difficulty ${e.difficulty} · finish: ${e.finish || "-"}` + (e.error ? ` · error: ${e.error}` : ""));
    const parts = [head, facts, el("div", { class: "question" }, e.question), ...e.turns.map(turnCard)];
    if (e.completion) {
      const tokens = el("div", { class: "tokens", id: "token-view" });
      if (showPrompt.checked) tokens.append(...tokenSpans(data.prompts[e.prompt], null, " prompt"));
      tokens.append(...tokenSpans(e.completion, e.mask, ""));
      const trained = [...e.mask].filter((m) => m === "1").length;
      parts.push(el("h3", {}, `Tokens: ${trained} of ${e.completion.length} after the prompt trained on`
        + (data.tokens_decoded ? "" : " (no tokenizer found: ids shown)")), tokens);
    }
    detail.replaceChildren(...parts);
  }

  source.addEventListener("change", () => { fillSteps(); renderList(); });
  for (const c of [step, result, sort]) c.addEventListener("change", renderList);
  for (const c of [task, rmin, rmax]) c.addEventListener("input", renderList);
  showPrompt.addEventListener("change", () => { if (selected !== null && shown.length) select(selected); });
  document.addEventListener("keydown", (ev) => {
    if (ev.target instanceof HTMLInputElement || !shown.length) return;
    if (ev.key === "j" || ev.key === "ArrowDown") select(Math.min(selected + 1, Math.min(shown.length, LIST_LIMIT) - 1));
    if (ev.key === "k" || ev.key === "ArrowUp") select(Math.max(selected - 1, 0));
  });
  fillSteps();
  renderList();
})();
