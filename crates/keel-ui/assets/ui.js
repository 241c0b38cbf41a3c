// keel ui — the only script of the pages: a little hand-written JavaScript, no framework
// and nothing fetched from elsewhere (see docs/ui.md). Every page works without it except
// the live parts: refreshing running rows, loading a span's details on click and the
// run page's live updates over server-sent events.
(function () {
  'use strict';

  // Errors of this script (and any other) are collected for the browser tests.
  window.__keelErrors = [];
  window.addEventListener('error', function (e) {
    window.__keelErrors.push(String(e.message || e));
  });

  // Runs page: while a listed run is still going, its rows are re-rendered every 2 s.
  function refreshRows() {
    var body = document.getElementById('runs-body');
    if (!body || !body.querySelector('tr[data-live="true"]')) {
      return;
    }
    var url = new URL(window.location.href);
    url.searchParams.set('fragment', 'rows');
    fetch(url.toString(), { credentials: 'same-origin' })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html !== null) {
          body.innerHTML = html;
          body.dataset.refreshed = String(Number(body.dataset.refreshed || '0') + 1);
        }
      })
      .catch(function () { /* the next refresh tries again */ })
      .then(function () { setTimeout(refreshRows, 2000); });
  }

  // Run page: a span's details are fetched when it is first opened.
  function loadDetail(span) {
    if (!span.open || span.dataset.loaded || !span.dataset.detail) {
      return;
    }
    var target = span.querySelector('.detail');
    span.dataset.loaded = 'loading';
    fetch(span.dataset.detail, { credentials: 'same-origin' })
      .then(function (r) { return r.text(); })
      .then(function (html) {
        target.innerHTML = html;
        span.dataset.loaded = 'yes';
      })
      .catch(function () { delete span.dataset.loaded; });
  }

  document.addEventListener('toggle', function (e) {
    var el = e.target;
    if (el && el.classList && el.classList.contains('span')) {
      loadDetail(el);
    }
  }, true);

  // Run page: while the run can still change, the live region (header, approval box,
  // waterfall) is replaced by what the server sends when the log grows; open spans stay
  // open.
  function followRun() {
    var live = document.getElementById('live');
    if (!live || !live.dataset.liveUrl || !window.EventSource) {
      return;
    }
    var source = new EventSource(live.dataset.liveUrl);
    source.addEventListener('update', function (e) {
      var open = {};
      live.querySelectorAll('details.span[open]').forEach(function (d) {
        open[d.dataset.spanId] = true;
      });
      live.innerHTML = e.data;
      live.dataset.updates = String(Number(live.dataset.updates || '0') + 1);
      live.querySelectorAll('details.span').forEach(function (d) {
        if (open[d.dataset.spanId]) {
          d.open = true;
          loadDetail(d);
        }
      });
    });
    source.addEventListener('done', function () {
      source.close();
      live.dataset.following = 'done';
    });
    live.dataset.following = 'yes';
  }

  function start() {
    setTimeout(refreshRows, 2000);
    followRun();
    document.querySelectorAll('details.span[open]').forEach(loadDetail);
  }

  if (document.readyState === 'loading') {
    document.addEventListener('DOMContentLoaded', start);
  } else {
    start();
  }
})();
