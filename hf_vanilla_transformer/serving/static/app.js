// The translation page: translates the text as it is typed (POST /v1/translate), lists the n best with
// their scores, and draws the encoder-decoder attention of the best translation as a table of target words
// (rows) by source words (columns). document.body.dataset.state says where it is: idle, translating, done
// or error; the text it shows the translation of is in document.body.dataset.translated.
"use strict";

const $ = (id) => document.getElementById(id);
const source = $("source");
const alternatives = $("alternatives");
let requestNumber = 0;
let timer = null;

function setState(state, message = "") {
  document.body.dataset.state = state;
  $("status").textContent = message;
  $("status").classList.toggle("error", state === "error");
}

async function loadInfo() {
  const info = await (await fetch("/v1/info")).json();
  $("pair").textContent = `${info.source} → ${info.target} (${info.engine})`;
  alternatives.replaceChildren();
  for (let n = 0; n <= info.limits.max_alternatives; n++) {
    alternatives.append(new Option(String(n), String(n)));
  }
  source.maxLength = info.limits.max_characters;
  $("key-label").hidden = !info.api_key_required;
}

function drawHypotheses(translations) {
  const list = $("hypotheses");
  list.replaceChildren();
  if (translations.length < 2) return;
  for (const hypothesis of translations) {
    const item = document.createElement("li");
    const score = document.createElement("span");
    score.className = "score";
    score.textContent = `score ${hypothesis.score.toFixed(3)}, log P ${hypothesis.log_prob.toFixed(3)}`;
    item.append(hypothesis.text, score);
    list.append(item);
  }
}

function drawHeatmap(attention) {
  const table = $("heatmap");
  table.replaceChildren();
  if (!attention) return;
  const head = table.createTHead().insertRow();
  head.append(document.createElement("th"));
  for (const word of attention.source_words) {
    const cell = document.createElement("th");
    cell.scope = "col";
    cell.textContent = word;
    head.append(cell);
  }
  const body = table.createTBody();
  attention.weights.forEach((row, i) => {
    const line = body.insertRow();
    const label = document.createElement("th");
    label.scope = "row";
    label.textContent = attention.target_words[i];
    line.append(label);
    row.forEach((weight, j) => {
      const cell = line.insertCell();
      cell.style.backgroundColor = `rgba(31, 90, 180, ${Math.min(1, Math.max(0, weight))})`;
      cell.title = `${attention.target_words[i]} ← ${attention.source_words[j]}: ${weight.toFixed(3)}`;
    });
  });
}

function show(text, translations) {
  $("translation").textContent = translations ? translations[0].text : "";
  drawHypotheses(translations || []);
  drawHeatmap(translations ? translations[0].attention : null);
  document.body.dataset.translated = text;
}

async function translate() {
  const text = source.value;
  const number = ++requestNumber;
  if (!text.trim()) {
    show(text, null);
    setState("idle");
    return;
  }
  setState("translating", "Translating…");
  const headers = { "Content-Type": "application/json" };
  if ($("key").value) headers["X-API-Key"] = $("key").value;
  const request = {
    q: text,
    n_best: Number(alternatives.value) + 1,
    alignments: true,
    attention: true,
    split_sentences: $("split").checked,
  };
  try {
    const response = await fetch("/v1/translate", { method: "POST", headers, body: JSON.stringify(request) });
    const data = await response.json();
    if (number !== requestNumber) return; // a later request has been sent: its answer is the one to show
    if (!response.ok) {
      setState("error", data.error || `the server answered ${response.status}`);
      return;
    }
    show(text, data.results[0].translations);
    setState("done", data.results[0].truncated ? "The text was too long: its start was translated." : "");
  } catch (error) {
    if (number === requestNumber) setState("error", `no answer from the server: ${error}`);
  }
}

function translateSoon() {
  clearTimeout(timer);
  timer = setTimeout(translate, 300);
}

source.addEventListener("input", translateSoon);
alternatives.addEventListener("change", translate);
$("split").addEventListener("change", translate);
$("key").addEventListener("change", translate);
setState("idle");
loadInfo().catch((error) => setState("error", `no answer from the server: ${error}`));
