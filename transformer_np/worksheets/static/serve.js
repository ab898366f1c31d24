// The page of `transformer-np worksheet serve` (transformer_np/worksheets/serve.py): draws the sheet's problem and
// one grid per step, sends the answers to the server a moment after each change (the server saves them into the
// sheet and marks it with `check`), and shows what came back: each step's verdict and marks, the first mistake.
// No library, no network beyond this server; every request carries the page's token.
"use strict";
(function () {
  var token = new URLSearchParams(location.search).get("token") || "";
  // A number as typed; the server accepts exactly these (serve_save.NUMBER).
  var NUMBER = /^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?$/;
  var MAX_CELL = 24, MAX_ABS = 1e6, DEBOUNCE_MS = 400;
  var BADGE = {correct: "✓ correct", follows: "✓ follows from your earlier answers", wrong: "✗ wrong",
               missing: "not answered"};
  var state = null, steps = {}, inputs = [], seq = 0, shown = 0, timer = null, inflight = false, again = false;
  var $ = function (id) { return document.getElementById(id); };

  function url(path) { return path + "?token=" + encodeURIComponent(token); }

  function el(tag, props, children) {
    var e = document.createElement(tag);
    Object.keys(props || {}).forEach(function (k) {
      if (k === "text") e.textContent = props[k];
      else if (k === "html") e.innerHTML = props[k];      // only the server's escaped formulas (serve_page.py)
      else if (k === "class") e.className = props[k];
      else e.setAttribute(k, props[k]);
    });
    (children || []).forEach(function (c) { if (c) e.appendChild(c); });
    return e;
  }

  function setStatus(text, kind) {
    var s = $("status");
    s.textContent = text;
    s.dataset.kind = kind || "";
  }

  function setSync(busy) {
    document.body.dataset.sync = busy ? "busy" : "idle";
    document.body.dataset.shown = String(shown);
    document.body.dataset.sent = String(seq);
  }

  // ---------------------------------------------------------------- drawing
  function problemTable(t) {
    if (t.identity) {
      return el("p", {class: "identity"}, [el("span", {html: t.title_html}),
        el("span", {text: " = I" + toSub(t.identity) + " (the identity)"})]);
    }
    var table = el("table", {class: "given"});
    table.appendChild(el("caption", {html: t.title_html + (t.note ? " <span class=\"note\"></span>" : "")}));
    if (t.note) table.querySelector("caption .note").textContent = "(" + t.note + ")";
    var head = el("tr", {}, [el("td", {"aria-hidden": "true"})]);
    t.cols.forEach(function (c) { head.appendChild(el("th", {scope: "col", text: c})); });
    table.appendChild(el("thead", {}, [head]));
    var body = el("tbody");
    t.values.forEach(function (row, i) {
      var tr = el("tr", {}, [rowHeader(t.rows[i])]);
      row.forEach(function (v) { tr.appendChild(el("td", {text: v})); });
      body.appendChild(tr);
    });
    table.appendChild(body);
    return el("div", {class: "scroll"}, [table]);
  }

  // a row header is never empty (axe: empty-table-header): a one-row table's says "values", to a screen reader
  function rowHeader(text) {
    return text ? el("th", {scope: "row", text: text}) :
      el("th", {scope: "row"}, [el("span", {class: "sr-only", text: "values"})]);
  }

  function toSub(n) {
    return String(n).replace(/[0-9]/g, function (d) { return "₀₁₂₃₄₅₆₇₈₉"[+d]; });
  }

  function drawSymbols() {
    var dl = $("symbols");
    dl.textContent = "";
    (state.symbols || []).forEach(function (x) {
      dl.appendChild(el("dt", {html: x.symbol_html}));
      dl.appendChild(el("dd", {html: x.meaning_html}));
    });
  }

  function drawProblem() {
    var box = $("problem");
    box.textContent = "";
    state.problem.forEach(function (g) {
      var tables = el("div", {class: "given-tables"});
      g.tables.forEach(function (t) { tables.appendChild(problemTable(t)); });
      var part = el("div", {class: "given-group"}, [el("h3", {text: g.group}), tables]);
      if (g.note_html) part.appendChild(el("p", {class: "note", html: g.note_html}));
      box.appendChild(part);
    });
  }

  function drawSteps() {
    var box = $("steps");
    box.textContent = "";
    var part = null;
    state.steps.forEach(function (s, k) {
      var title = "Layer " + s.layer + " — " + s.part;
      if (title !== part) {
        box.appendChild(el("h2", {class: "part", text: title}));
        part = title;
      }
      box.appendChild(drawStep(s, k + 1));
    });
  }

  function drawStep(s, number) {
    var hid = "h-" + s.id, sec = el("section", {class: "step", id: "step-" + s.id, "aria-labelledby": hid});
    sec.dataset.verdict = "missing";
    sec.dataset.layer = s.layer;
    sec.dataset.name = s.name;
    var h = el("h3", {id: hid}, [el("span", {class: "num", text: number + ". "}), el("code", {text: s.name}),
      el("span", {text: " = "}), el("span", {class: "formula", html: s.formula_html})]);
    var table = el("table", {class: "grid"});
    var what = "Layer " + s.layer + ", " + s.name + ": " + s.rows.length + " row" + (s.rows.length > 1 ? "s" : "") +
      (s.per_token ? " (one per token)" : "") + ", " + s.cols.length + " column" + (s.cols.length > 1 ? "s" : "");
    table.appendChild(el("caption", {class: "sr-only", text: what}));
    var head = el("tr", {}, [el("td", {"aria-hidden": "true"})]);
    s.cols.forEach(function (c) { head.appendChild(el("th", {scope: "col", text: c})); });
    table.appendChild(el("thead", {}, [head]));
    var body = el("tbody"), grid = [];
    s.rows.forEach(function (r, i) {
      var tr = el("tr", {}, [rowHeader(r)]), row = [];
      s.cols.forEach(function (c, j) {
        var where = "layer " + s.layer + " " + s.name + (r ? ", row " + r : "") +
          (s.cols.length > 1 || c !== s.name ? ", column " + c : "");
        var inp = el("input", {type: "text", inputmode: "decimal", autocomplete: "off", spellcheck: "false",
                               maxlength: String(MAX_CELL), size: "6", "aria-label": where});
        inp.dataset.step = s.id;
        inp.dataset.r = i;
        inp.dataset.c = j;
        inp.dataset.i = inputs.length;
        if (s.cells && s.cells[i][j] !== "") inp.value = s.cells[i][j];
        inputs.push(inp);
        row.push(inp);
        tr.appendChild(el("td", {}, [inp]));
      });
      grid.push(row);
      body.appendChild(tr);
    });
    table.appendChild(body);
    steps[s.id] = {spec: s, section: sec, grid: grid};
    var verdict = el("div", {class: "verdict"}, [el("p", {class: "badge", text: BADGE.missing}),
      el("p", {class: "step-marks"}), el("div", {class: "note"})]);
    sec.appendChild(el("div", {class: "step-main"}, [h, el("div", {class: "scroll"}, [table])]));
    sec.appendChild(verdict);
    return sec;
  }

  // ---------------------------------------------------------------- cells
  function cellValue(inp) {
    var v = inp.value.trim();
    if (v === "") return "";
    if (v.length <= MAX_CELL && NUMBER.test(v) && Math.abs(parseFloat(v)) <= MAX_ABS &&
        !(parseFloat(v) === 0 && /[1-9]/.test(v.split(/[eE]/)[0]))) return v;
    return null;                 // not a number, or not storable as written (1e-400 would be 0): the row waits
  }

  function validate(inp) {
    var bad = cellValue(inp) === null;
    inp.setAttribute("aria-invalid", bad ? "true" : "false");
    if (bad) {
      inp.setAttribute("aria-describedby", "hint-invalid");
      inp.title = "Not a number that can be stored as written: write it with a point, e.g. 0.25 or -1.5, " +
        "at most ±1000000 (1e-400 would be read as 0)";
    } else {
      inp.removeAttribute("aria-describedby");
      inp.removeAttribute("title");
    }
  }

  function collect() {
    var out = {};
    Object.keys(steps).forEach(function (id) {
      var st = steps[id], any = false;
      var grid = st.grid.map(function (row) {
        return row.map(function (inp) {
          var v = cellValue(inp);
          if (inp.value.trim() !== "") any = true;
          return v === null ? "" : v;
        });
      });
      if (any) {
        var table = "layer" + st.spec.layer;
        (out[table] = out[table] || {})[st.spec.name] = grid;
      }
    });
    return out;
  }

  function changed(inp) {
    validate(inp);
    steps[inp.dataset.step].section.dataset.stale = "true";
    clearTimeout(timer);
    timer = setTimeout(send, DEBOUNCE_MS);
    setSync(true);
    setStatus("Changed — saving and marking in a moment…", "busy");
  }

  // ---------------------------------------------------------------- server
  function send() {
    timer = null;
    if (inflight) { again = true; return; }
    inflight = true;
    var mine = ++seq;
    setSync(true);
    fetch(url("api/answers"), {method: "POST", headers: {"Content-Type": "application/json"}, cache: "no-store",
                                body: JSON.stringify({seq: mine, fingerprint: state.fingerprint, answers: collect()})})
      .then(function (r) {
        return r.json().catch(function () { return {error: "the server answered " + r.status}; })
          .then(function (j) { if (!r.ok && !j.error) j.error = "the server answered " + r.status; return j; });
      })
      .then(function (res) {
        if (mine >= shown) { shown = mine; apply(res); }
      })
      .catch(function () {
        setStatus("NOT SAVED: the server does not answer (it stops on Ctrl-C and after an idle hour). Your answers " +
                  "are still on this page: start `transformer-np worksheet serve` again and reload it.", "error");
        shown = mine;
      })
      .then(function () {
        inflight = false;
        if (again) { again = false; send(); }
        else if (timer === null) setSync(false);
      });
  }

  function apply(res) {
    if (res.error && !res.report) {
      setStatus("NOT SAVED: " + res.error, "error");
      return;
    }
    if (res.saved) {
      setStatus("Saved into " + state.file + " and marked at " + new Date().toLocaleTimeString() + ".", "ok");
    } else {
      setStatus("NOT SAVED: " + (res.save_error || "unknown error") + " The marks shown are those of the sheet " +
                "as it is on disk.", "error");
    }
    showReport(res.report, res.not_saved || []);
  }

  function fmtMark(x) { return x === null || x === undefined ? "–" : String(x); }

  function showReport(report, notSaved) {
    if (!report) return;
    var pending = {};
    notSaved.forEach(function (n) { pending["layer" + n.layer + "." + n.name] = n; });
    var fm = report.first_mistake;
    report.steps.forEach(function (s) {
      var st = steps["layer" + s.layer + "." + s.name];
      if (!st) return;
      var sec = st.section, v = sec.querySelector(".verdict");
      delete sec.dataset.stale;
      sec.dataset.verdict = s.verdict;
      v.querySelector(".badge").textContent = BADGE[s.verdict];
      v.querySelector(".step-marks").textContent = s.out_of === null ? "" :
        "Marks: " + fmtMark(s.marks) + " / " + fmtMark(s.out_of);
      var note = v.querySelector(".note");
      note.textContent = "";
      st.grid.forEach(function (row, i) {
        row.forEach(function (inp, j) {
          inp.classList.remove("unsaved");
          var off = s.wrong_cells && s.wrong_cells[i] && s.wrong_cells[i][j];
          inp.classList.toggle("off", !!off);         // a cell that is not right: highlighted, and said so
          if (off) inp.setAttribute("aria-description", "this number is not right");
          else inp.removeAttribute("aria-description");
        });
      });
      if (s.verdict === "follows" && s.follows_from) {
        note.appendChild(el("p", {class: "follows-from", text: "Follows from your " + s.follows_from +
          ": right from the numbers you wrote there, though not the true value, so it earns its marks."}));
      }
      var p = pending[s.id || ("layer" + s.layer + "." + s.name)];
      if (p) {
        sec.dataset.pending = "true";
        var names = p.rows.map(function (i) { return st.spec.rows[i] || String(i + 1); });
        p.rows.forEach(function (i) { st.grid[i].forEach(function (inp) { inp.classList.add("unsaved"); }); });
        note.appendChild(el("p", {class: "pending", text: "Not saved yet" + (names.join("") ? " (row " +
          names.join(", ") + ")" : "") + ": " + p.reason + "."}));
      } else {
        delete sec.dataset.pending;
      }
      if (fm && fm.layer === s.layer && fm.name === s.name) {
        sec.dataset.first = "true";
        note.appendChild(el("div", {class: "diagnosis"}, [el("p", {class: "diag-title", text: "First mistake — " +
          fm.diagnosis.replace(/_/g, " ")}), el("p", {text: fm.explanation})]));
      } else {
        delete sec.dataset.first;
      }
    });
    var c = report.counts;
    $("marks").textContent = "Marks " + fmtMark(report.marks.awarded) + " / " + fmtMark(report.marks.available) +
      " · " + c.correct + " correct, " + c.follows + " follows, " + c.wrong + " wrong, " + c.missing + " not answered";
    var box = $("mistake");
    if (fm) {
      box.hidden = false;
      var t = $("mistake-text");
      t.textContent = "";
      var a = el("a", {href: "#step-layer" + fm.layer + "." + fm.name, text: "Layer " + fm.layer + ", " + fm.name});
      t.appendChild(a);
      t.appendChild(document.createTextNode(" — " + fm.diagnosis.replace(/_/g, " ") + ". " + fm.explanation));
    } else {
      box.hidden = true;
    }
  }

  // ---------------------------------------------------------------- keyboard
  function focusCell(inp) {
    if (!inp) return;
    inp.focus();
    inp.select();
  }

  function vertical(inp, dir) {
    var st = steps[inp.dataset.step], r = +inp.dataset.r + dir, c = +inp.dataset.c;
    if (r >= 0 && r < st.grid.length) return st.grid[r][Math.min(c, st.grid[r].length - 1)];
    var ids = Object.keys(steps), k = ids.indexOf(inp.dataset.step) + dir;
    if (k < 0 || k >= ids.length) return null;
    var g = steps[ids[k]].grid, row = g[dir > 0 ? 0 : g.length - 1];
    return row[Math.min(c, row.length - 1)];
  }

  function onKey(e) {
    var inp = e.target;
    if (inp.tagName !== "INPUT" || inp.dataset.i === undefined || e.altKey || e.ctrlKey || e.metaKey) return;
    var i = +inp.dataset.i, next = null;
    var atStart = inp.selectionStart === 0 && inp.selectionEnd === 0;
    var atEnd = inp.selectionStart === inp.value.length && inp.selectionEnd === inp.value.length;
    var all = inp.selectionStart === 0 && inp.selectionEnd === inp.value.length;
    if (e.key === "Enter") next = inputs[i + (e.shiftKey ? -1 : 1)];
    else if (e.key === "ArrowDown") next = vertical(inp, 1);
    else if (e.key === "ArrowUp") next = vertical(inp, -1);
    else if (e.key === "ArrowLeft" && (atStart || all)) next = inputs[i - 1];
    else if (e.key === "ArrowRight" && (atEnd || all)) next = inputs[i + 1];
    else return;
    e.preventDefault();
    focusCell(next);
  }

  // ---------------------------------------------------------------- start
  // the sticky bar's height as a CSS variable: the cells' scroll-margin keeps a focused cell below it however many
  // lines the bar wraps into (82 px at 1280 px wide, more in a narrow window; static on a phone)
  function barHeight() {
    var bar = document.querySelector("header.bar");
    var sticky = bar && getComputedStyle(bar).position === "sticky";
    document.documentElement.style.setProperty("--bar", (sticky ? bar.getBoundingClientRect().height : 0) + "px");
  }

  function start() {
    barHeight();
    window.addEventListener("resize", barHeight);
    if (window.ResizeObserver) new ResizeObserver(barHeight).observe(document.querySelector("header.bar"));
    setSync(true);
    fetch(url("api/state"), {cache: "no-store"})
      .then(function (r) { return r.json().then(function (j) { return {ok: r.ok, j: j}; }); })
      .then(function (x) {
        if (!x.ok) throw new Error(x.j.error || "the server refused the page");
        state = x.j;
        document.title = state.file + " — worksheet";
        $("title").textContent = "Worksheet " + state.file;
        $("setup").innerHTML = "Tokens: <strong></strong>. " + state.setup_html;
        $("setup").querySelector("strong").textContent = state.tokens.join(", ");
        $("wiring").innerHTML = state.wiring_html;
        $("rounding").textContent = "Round every answer to " + state.decimals + " decimal" +
          (state.decimals === 1 ? "" : "s") + "; keep more digits in between. In the score and attention tables " +
          "the row is the query token and the column the key token.";
        drawSymbols();
        drawProblem();
        drawSteps();
        $("intro").hidden = false;
        var hint = el("p", {id: "hint-invalid", class: "sr-only", text: "Not a number: write it with a point, " +
          "for example 0.25 or -1.5. The row is not saved until it is."});
        $("main").appendChild(hint);          // inside a landmark (axe: region)
        inputs.forEach(validate);
        showReport(state.report, []);
        setStatus("Loaded " + state.file + (state.report.counts.missing < state.steps.length ?
          " with the answers saved in it." : "."), "ok");
        setSync(false);
      })
      .catch(function (err) {
        setStatus("The sheet could not be loaded: " + err.message, "error");
        setSync(false);
      });
    document.addEventListener("input", function (e) {
      if (e.target.tagName === "INPUT" && e.target.dataset.step) changed(e.target);
    });
    document.addEventListener("keydown", onKey);
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
