// Registry Coordinator console: the page works without this file; with it, graphs are
// drawn (Graphviz as WebAssembly, vendored) and, on a page got by GET (data-live-page), the
// regions marked data-live follow the service without a reload. No inline script anywhere: the Content-Security-Policy
// allows scripts from the service only.
"use strict";

(function () {
  const POLL_MS = 2500;
  let etag = null;
  let stopped = false;

  function drawGraphs(root) {
    if (typeof Viz === "undefined") return;
    const figures = root.querySelectorAll("figure[data-graph]:not(.drawn)");
    if (!figures.length) return;
    Viz.instance().then(function (viz) {
      figures.forEach(function (figure) {
        const source = figure.querySelector("pre.dot");
        if (!source) return;
        const svg = viz.renderSVGElement(source.textContent);
        svg.setAttribute("role", "img");
        svg.setAttribute("aria-label", "The workflow's graph");
        figure.insertBefore(svg, figure.firstChild);
        figure.classList.add("drawn");
      });
    }).catch(function () {
      // The graph could not be drawn: the list of steps and the DOT text stay on the page.
    });
  }

  // A region the visitor is using is left alone until they are done with it: replacing it
  // would take the keyboard focus away, or close (or open) details they changed.
  function inUse(region, next) {
    const shown = next.querySelectorAll("details");
    const changed = Array.from(region.querySelectorAll("details")).some(function (d, i) {
      return d.open !== Boolean(shown[i] && shown[i].open);
    });
    return changed || region.contains(document.activeElement);
  }

  function regions(doc) {
    return Array.from(doc.querySelectorAll("[data-live][id]"));
  }

  async function poll() {
    if (stopped || document.hidden) return;
    const headers = {};
    if (etag) headers["If-None-Match"] = etag;
    let response;
    try {
      response = await fetch(window.location.href, {
        headers: headers, cache: "no-store", credentials: "same-origin", redirect: "manual",
      });
    } catch (error) {
      return; // the service is restarting: try again at the next tick
    }
    if (response.status === 304) return;
    if (response.status !== 200) {
      if (response.type === "opaqueredirect" || response.status === 403) stopped = true;
      return;
    }
    etag = response.headers.get("ETag");
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    regions(document).forEach(function (region) {
      const next = fresh.getElementById(region.id);
      if (next && next.innerHTML !== region.innerHTML && !inUse(region, next)) {
        region.innerHTML = next.innerHTML;
        region.dispatchEvent(new CustomEvent("console:updated", { bubbles: true }));
      }
    });
    drawGraphs(document);
  }

  // Copy buttons put a run's id or a key on the clipboard; without this file they stay hidden.
  document.documentElement.classList.add("scripted");
  document.addEventListener("click", function (event) {
    const button = event.target.closest("button.copy");
    if (!button || !navigator.clipboard) return;
    navigator.clipboard.writeText(button.dataset.copy).then(function () {
      button.textContent = "Copied";
      window.setTimeout(function () { button.textContent = "Copy"; }, 1500);
    }).catch(function () {
      button.textContent = "Select it to copy";
    });
  });

  document.addEventListener("DOMContentLoaded", function () {
    drawGraphs(document);
    if (document.body.hasAttribute("data-live-page") && regions(document).length) {
      window.setInterval(poll, POLL_MS);
      document.addEventListener("visibilitychange", poll);
    }
  });
})();
